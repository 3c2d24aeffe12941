"""A run's figures from its records: pure pandas, tables in, numbers out.

Every figure in `summary.json` is defined here, once:

- steady-state steps: `kind == "train"` and not `warmup`, over all ranks.
- `step_s`, `data_s`, `forward_s`, `backward_s`, `optimizer_s`, `compute_s`, `allreduce_s`,
  `exposed_comm_s`: **means** over steady-state steps, so the phases add up:
  step_s = data_s + forward_s + backward_s + optimizer_s, and exposed_comm_s is inside backward_s.
- Three communication figures, side by side, never one for another:
  `allreduce_pct` = 100 x allreduce_s / step_s: **time communicating**, the share of the step
  with a gradient all-reduce in flight, hidden or not (the DAWNBench analysis' "communication
  overhead", Coleman et al. 2019; as the means are over steps, also the share of the epoch's
  training time); `exposed_comm_pct` = 100 x exposed_comm_s / step_s: **exposed
  communication**, what backward did not hide; `comm_overhead_pct` (below): the **A/B
  overhead**, what communication costs the step. Hidden communication counts in the first only;
  interference (communication slowing compute) in the third only.
- Every share of the step (`allreduce_pct`, `exposed_comm_pct`, the per-kind `_pct`s,
  `waiting_pct`, `transfer_pct`) is a ratio over **the same steps**: the mean of its numerator
  over the steady steps that recorded it (those whose collectives were timed: `comm_timed_steps`)
  over the mean step_s of those very steps (`StepAccumulator.share`); `interference_pct`, the
  A/B's, over the same denominator as exposed_comm_pct. Until 2026-12-02 the denominator was the
  mean over all steps, which a few slow timed steps, or slow untimed ones, moved (a share of no
  step). `allreduce_pct_half_width`, `exposed_comm_pct_half_width`: their 95% intervals'
  half-widths in points, over those steps (delta method for a ratio of two paired means).
- The observer's effect: `timed_step_s` and `untimed_step_s`, the mean step_s of the steady
  steps whose collectives were timed and of the others; `timing_effect_s` their difference and
  `timing_effect_half_width_s` its 95% interval's half-width; `timing_perturbs_steps` true when
  the timed steps are slower beyond it: the communication figures then describe a perturbed step
  (the report says so). None where every step is timed (or none is). The first timed steps follow
  the warm-up, so a slow start shows here too.
- A step is an optimizer step (scaling/instrument/meter.py): with gradient accumulation it holds
  several micro-batches. `micro_batches` and `synced_micro_batches` (those whose backward
  communicated) are means per steady-state step; every step figure is per optimizer step.
- `comm_delta_s`: the A/B difference of one synchronised micro-batch. Per calibration pair (the
  same batch run with and without gradient sync, back to back): sync minus no_sync
  forward+backward time; the median over the pairs of an (epoch, rank), paired so that slow
  drift and a noisy neighbour cancel; then the mean over ranks and the median over epochs.
- `comm_overhead_pct` (headline) = 100 x comm_delta_s x synced_micro_batches / step_s: what
  synchronising costs the whole steady-state step, over the step's time (with no
  accumulation, (t_sync - t_nosync) / t_step). 0 by definition at one worker, when the run
  recorded training steps to say it of.
- Why communication costs what it does (three parts, docs/method.md):
  `waiting_s`, `transfer_s`: means over steady-state steps and ranks of the split of each
  step's exposed communication into waiting for the slowest rank to finish its backward
  compute and the transfer after it (per step and rank in steps.parquet, computed across ranks
  by scaling/instrument/recorder.py `attribute`); `interference_s`: the A/B difference
  beyond the exposed communication the synchronised half of each calibration pair adds over
  its unsynchronised half (FSDP's all-gathers, exposed in both, cancel out; pooled as
  comm_delta_s is, times synced_micro_batches: per step, as the other two): what communication
  costs beyond the time it is exposed (gloo's threads
  or NCCL's kernels taking compute); each also as `_pct` of step_s. `straggler_rank`: the rank most
  often last to finish backward compute, `straggler_share` the share of steps it was.
  The per-rank means ("who waits for whom") go to ranks.parquet.
- Per collective kind, where a backend has several (FSDP2: all-gathers of parameters, among them
  the backward re-gathers, and reduce-scatters of gradients; DDP and Horovod have the all-reduce
  alone, and these are None): `comm_s` (any collective in flight), `allgather_s`, `regather_s`,
  `reducescatter_s` (that kind in flight) and `exposed_allgather_s`, `exposed_reducescatter_s`
  (compute waiting for that kind), `exposed_forward_comm_s` (the exposed time inside forward: the
  forward all-gathers'; the rest of exposed_comm_s is inside backward), means over steady-state
  steps as the others, each also as `_pct` of step_s (`comm_pct`, `allgather_pct`, ...). The same marks make
  collectives.parquet's rows, one per collective (scaling/instrument/backends/fsdp.py defines each).
- `steps_recorded`, `comm_timed_steps`: the steady-state step records (over ranks) the step
  figures rest on, and those of them whose collectives were timed, on which the communication
  figures rest (fewer with `instrument.collective_timing_every` > 1: the other steps' columns are
  NaN, never zero, and every mean and interval above is over the steps that have the column).
- `instrument_host_s`, `instrument_host_pct`: the instrument's own Python per steady-state step
  (its hooks and bookkeeping, summed by themselves: scaling/instrument/meter.py), and its share of
  step_s: what the observer costs the job, a lower bound (calling into Python from C++ is not in
  it; bench/instrument_host_cost.py measures the whole).
- `wrapper_s`, `wrapper_pct`: DDP's own work around the module's forward per steady-state step (its
  buffers' broadcast, its search for unused parameters: scaling/instrument/timing.py), and its share
  of step_s over the steps that recorded it; None where no such DDP setting was on (it is not timed).
- `peak_memory_bytes`: the largest rank's peak memory over the run's epochs (each epoch's
  training; epochs.parquet, scaling/instrument/memory.py: max allocated on a GPU, the process's
  resident high-water mark on a CPU, `peak_memory_method`); `peak_memory_min_bytes` the smallest
  rank's (uneven shards or data show as a gap between the two).
- `time_per_epoch_s`: median `train_s` over epochs after the first (the first holds start-up
  effects); the only epoch if there is one. Evaluation and calibration are excluded.
- `throughput_samples_per_s`: median over the same epochs of samples / train_s;
  `throughput_steps_per_s`: of optimizer steps / train_s (one rank's steps: every rank takes each).
- `tokens_per_sample`, `throughput_tokens_per_s`: where a sample is a sequence of token ids (the
  first training input, as `compute_profile.json` records it, is an integer tensor of one
  dimension per sample: (T,)), T and throughput_samples_per_s x T; None for other inputs.
  A language model's figures are read per token: modded-nanogpt's and llm.c's tokens/s. The
  input is the first positional tensor, else `input_ids=` (a Hugging Face model called with
  keywords: scaling/instrument/inputs.py, `model_input`).
- `real_tokens_per_sample`, `throughput_real_tokens_per_s`: where the first training batch came
  with an `attention_mask` that leaves positions out (padding), its unmasked tokens per sample
  (mean over that batch's samples) and throughput_samples_per_s x that; None where there is no
  mask or it masks nothing (then the two figures are one). T counts the positions the model
  computed, so FLOPs and MFU are taken over T; the real figure says how many of them were text.
  Later batches' masks are not read (the instrument looks at the first training forward only).
- The target: `val_accuracy` (the metric `train.target_metric` names, top-1 or top-5) reaches
  `target_accuracy` when >= it; or, with `target_loss` (`train.target_metric: val_loss`), the
  validation loss (`val_loss` in epochs.parquet and evals.parquet: mean cross-entropy, per token
  for a language model) reaches it when <= it: lower is better, as modded-nanogpt's GPT-2
  speedrun measures time to 3.28. `best_accuracy` is the highest val_accuracy, `best_val_loss`
  the lowest val_loss (None without the column).
- `epochs_to_target`: the first epoch whose end-of-epoch validation metric reaches the target.
- `tta_epoch_end_s`: DAWNBench's rule: training time (sum of train_s) up to and including
  that epoch (what the DAWNBench export reports).
- `tta_s`, the headline, follows `tta_rule`:
    `first_eval`: the training time up to the first evaluation at the target, when the run
      evaluates every fraction of an epoch (`train.eval_every`, evals.parquet: each
      evaluation with the training time before it); `epochs_to_target_progress` is where
      (2.25 = a quarter into the third epoch). One epoch more or less no longer moves TTA by
      a whole epoch's time.
    `epoch_end`: `tta_epoch_end_s` (`train.tta_rule: epoch_end`, and runs without
      evals.parquet). Evaluating once per epoch, the two rules give the same TTA.
  `tta_wall_s`: wall time from the first step to that evaluation (includes evaluation,
  calibration and reporting). None when the target was not reached. The metric is the one
  `train.target_metric` names: top-1 or top-5 accuracy, recorded as `val_accuracy` per epoch,
  or the validation loss, `val_loss` (the target above).
- `restarts`: how many times the worker group was restarted after a failure (attempts - 1).
  `time_lost_s`: per restart, the wall time from the checkpoint it resumed from (or, with none,
  from the first attempt's first step) to its own first step: the discarded training plus
  failure detection, restart and restore; summed. `tta_s` includes the time lost by the restarts
  that came before the target was reached (a figure never hides a failure), those that resumed
  from a checkpoint older than the epoch that reached it (`time_lost_before_epoch`); a restart
  after it cost the run time, not the accuracy. `tta_includes_restarts` says whether any did;
  `tta_wall_s` includes them by construction (the run's clock starts at the first attempt's
  first step).
- `workers_first_attempt`, `workers_last_attempt`: the worker group's size when the run
  started and in its last attempt (after its last restart); `worker_count_changed`: whether
  any attempt ran with another count than the first (an elastic run that lost a node and went
  on with fewer workers, `workers.min_workers`): such a run is no fixed-count point and the
  report keeps it out of speedups (scaling/analysis/scaling_tables.py). None for records
  made before attempts kept their size. Per epoch, `num_workers` in epochs.parquet.
- `cost_to_accuracy_usd` = tta_s / 3600 x num_nodes x node_price_per_hour (DAWNBench's cost, at
  the price actually paid: `workers.market` says on demand or spot); tta_s holds the time lost
  to restarts, so a preemption's cost is in it: `time_lost_cost_usd` = time_lost_s / 3600 x
  num_nodes x node_price_per_hour is that part. Every node is counted for the time lost: the
  survivors are billed while they wait, a replacement from its launch; the lost node's seconds
  between its loss and its replacement's launch are not billed, so this is an upper bound by
  at most those seconds. None when the price is unknown (0) or the target was not reached.
- `train_flops_per_sample`: forward + backward FLOPs of one training sample, counted once per
  input size with PyTorch's FlopCounterMode (a multiply-add is 2 FLOPs; model FLOPs, so
  recomputation or padding would not count). From `compute_profile.json`.
- `achieved_flops_per_s` (per worker) = train_flops_per_sample x throughput_samples_per_s /
  num_workers; `mfu` (model FLOPs utilisation, as in PaLM) = achieved_flops_per_s / the
  device's peak for the run's precision (`peak_flops_per_s`: a datasheet number for known
  GPUs; on CPU the fastest of several kernels measured with the worker's threads, see
  scaling/instrument/flops.py). At most 1 by construction: None where either is unknown, and
  None where the achieved rate exceeds the peak (then the "peak" is no upper bound and any
  ratio would be a guess); `mfu_note` says why it is absent.
- `arithmetic_intensity` = train_flops_per_sample / estimated bytes moved per sample (see
  scaling/instrument/flops.py); with the device's memory roof it places the run on a roofline.
- `not_measured`: figure -> why it is None, for every figure of STEP_FIGURES, AB_FIGURES and
  EPOCH_FIGURES that had no observations: "no epoch finished" (a run that died before its first
  epoch ended), "no training step recorded" (epochs without step records: step_timing off),
  and for the A/B figures the job's lack of a forward_backward function or of calibration
  steps; for the compute profile's figures (PROFILE_FIGURES) the profile's `error`: the
  model's input not understood (which keyword tensor is its input), or its FLOPs not counted. A figure nothing measured
  is None with its reason, never 0: the A/B overhead's definitional 0 at one worker needs recorded steps. Empty when
  everything was measured. `comm_overhead_note` ("A/B not measured: <reason>") and `mfu_note` repeat the reason of
  those two figures.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from scaling import noise_scale
from scaling.schema import NOISE_FIGURES, PHASE_COLUMNS, RANK_FIELDS, SHARE_FIELDS, STEP_FIELDS

# Figures made of observations, by what they are made of: with none of it recorded a figure is
# None and `not_measured` says why (module docstring).
STEP_FIGURES = (
    *PHASE_COLUMNS,
    "step_s",
    "compute_s",
    "allreduce_s",
    "exposed_comm_s",
    "allreduce_pct",
    "exposed_comm_pct",
)
AB_FIGURES = ("comm_delta_s", "comm_overhead_pct", "interference_s")
EPOCH_FIGURES = (
    "time_per_epoch_s",
    "throughput_samples_per_s",
    "best_accuracy",
    "epochs_to_target",
    "tta_s",
    "calibration_s",
    "eval_s",
    "achieved_flops_per_s",
    "mfu",
)
# Figures of the compute profile (compute_profile.json): None with its `error` where it has one
PROFILE_FIGURES = (
    "train_flops_per_sample",
    "achieved_flops_per_s",
    "mfu",
    "tokens_per_sample",
    "throughput_tokens_per_s",
)
NO_EPOCH = "no epoch finished"
NO_STEP = "no training step recorded"


class StepAccumulator:
    """The step figures of a run from its records fed batch by batch (`add`), in bounded memory.

    Means over steady-state steps as sums and counts (NaN skipped, as pandas' mean does); a
    run shorter than its warm-up falls back to all its training steps; calibration rows (a
    few per rank and epoch) are kept whole for the A/B pairing; node ranks are counted.
    """

    def __init__(self):
        self.sums = {"steady": dict.fromkeys(STEP_FIELDS, 0.0), "train": dict.fromkeys(STEP_FIELDS, 0.0)}
        self.counts = {"steady": dict.fromkeys(STEP_FIELDS, 0), "train": dict.fromkeys(STEP_FIELDS, 0)}
        self.rows = 0
        self.calibration: list[pd.DataFrame] = []
        self.node_ranks: set = set()
        self.per_rank: list[pd.DataFrame] = []  # per batch: sums and counts by rank
        self.stragglers: dict[int, int] = {}  # steady steps each rank was the last to finish backward
        # per share field: over the steps that recorded it, n and the sums of x, y = step_s, x², y², xy
        self.shares = {part: {name: [0.0] * 6 for name in SHARE_FIELDS} for part in ("steady", "train")}
        # step_s of the steps whose collectives were timed and of the others: n, sum, sum of squares
        self.timed_steps = {part: {"timed": [0.0] * 3, "untimed": [0.0] * 3} for part in ("steady", "train")}
        # rank 0's steady steps with a timed span (a few per epoch): DDP's timers are paired with them
        self.rank0_spans: list[pd.DataFrame] = []

    def add(self, batch: pd.DataFrame) -> None:
        if batch.empty:
            return
        self.rows += len(batch)
        train = batch[batch["kind"] == "train"]
        for part, rows in (("train", train), ("steady", train[~train["warmup"].astype(bool)])):
            for name in STEP_FIELDS:
                if name in rows.columns:
                    values = rows[name]
                    self.sums[part][name] += float(values.sum())
                    self.counts[part][name] += int(values.notna().sum())
            self._add_shares(part, rows)
        span_columns = ["epoch", "step", "comm_span_s", "synced_micro_batches"]
        if set(span_columns + ["rank"]) <= set(train.columns):
            steady0 = train[(train["rank"] == 0) & ~train["warmup"].astype(bool) & train["comm_span_s"].notna()]
            if not steady0.empty:
                self.rank0_spans.append(steady0[span_columns])
        steady = train[~train["warmup"].astype(bool)]
        if not steady.empty and "rank" in steady.columns:
            present = [f for f in RANK_FIELDS if f in steady.columns]
            squares = (steady[present] ** 2).assign(rank=steady["rank"]).groupby("rank").sum().add_suffix("_sq")
            grouped = steady.groupby("rank")[present]
            self.per_rank.append(
                pd.concat([grouped.sum().add_suffix("_sum"), grouped.count().add_suffix("_n"), squares], axis=1)
            )
            if len(self.per_rank) > 64:  # keep it small whatever the number of batches: one frame of sums per rank
                self.per_rank = [pd.concat(self.per_rank).groupby(level=0).sum()]
            if "straggler_rank" in steady.columns:
                # every rank's row of a step names the same straggler: count each step once, on one rank
                one_rank = steady[steady["rank"] == steady["rank"].min()]["straggler_rank"].dropna()
                for rank, count in one_rank[one_rank >= 0].astype(int).value_counts().items():
                    self.stragglers[int(rank)] = self.stragglers.get(int(rank), 0) + int(count)
        calib = batch[batch["kind"].isin(["calib_sync", "calib_nosync"])]
        if not calib.empty:
            # only what the A/B pairing reads (a few rows per rank and epoch)
            self.calibration.append(
                calib[[c for c in ("epoch", "rank", "pair", "kind", "step_s", "exposed_comm_s") if c in calib.columns]]
            )
        if "node_rank" in batch.columns:
            self.node_ranks.update(batch["node_rank"].dropna().unique().tolist())

    def _add_shares(self, part: str, rows: pd.DataFrame) -> None:
        if "step_s" not in rows.columns or rows.empty:
            return
        step = rows["step_s"]
        for name in SHARE_FIELDS:
            if name not in rows.columns:
                continue
            present = rows[name].notna() & step.notna()
            x, y = rows.loc[present, name].astype(float), step[present].astype(float)
            sums = self.shares[part][name]
            for i, value in enumerate((len(x), x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())):
                sums[i] += float(value)
        if "exposed_comm_s" in rows.columns:
            timed = rows["exposed_comm_s"].notna()
            for which, values in (("timed", step[timed]), ("untimed", step[~timed])):
                values = values.dropna().astype(float)
                sums = self.timed_steps[part][which]
                for i, value in enumerate((len(values), values.sum(), (values * values).sum())):
                    sums[i] += float(value)

    def part(self) -> str:
        """Which steps the figures are over: the steady-state ones, or all training steps of a run
        shorter than its warm-up."""
        return "steady" if any(self.counts["steady"].values()) else "train"

    def share(self, name: str, over: str | None = None) -> tuple[float | None, float | None]:
        """100 x mean(`name`) / mean(step_s) over the same steps: those that recorded `name` (or, with
        `over`, those that recorded `over`: a numerator measured elsewhere, the A/B's interference);
        and the 95% interval's half-width (delta method for a ratio of two means of paired values).
        (None, None) without such steps."""
        n, sx, sy, sxx, syy, sxy = self.shares[self.part()][over or name]
        if n < 1 or sy <= 0:
            return None, None
        ratio = sx / sy
        if n < 2:
            return 100.0 * ratio, None
        mean_y = sy / n
        var_x, var_y = (sxx - sx * sx / n) / (n - 1), (syy - sy * sy / n) / (n - 1)
        cov = (sxy - sx * sy / n) / (n - 1)
        variance = max(0.0, var_x - 2 * ratio * cov + ratio * ratio * var_y) / (n * mean_y * mean_y)
        return 100.0 * ratio, 100.0 * 1.96 * math.sqrt(variance)

    def denominator_s(self, name: str) -> float | None:
        """mean(step_s) over the steps that recorded `name` (the denominator of its share)."""
        n, _, sy, *_ = self.shares[self.part()][name]
        return sy / n if n else None

    def timing_effect(self) -> dict:
        """The observer's effect on the steps it times: their mean step_s against the others'."""
        out = dict.fromkeys(
            ("timed_step_s", "untimed_step_s", "timing_effect_s", "timing_effect_half_width_s", "timing_perturbs_steps")
        )
        groups = self.timed_steps[self.part()]
        (nt, st, sst), (nu, su, ssu) = groups["timed"], groups["untimed"]
        if nt < 2 or nu < 2:  # every step timed (or none): nothing to compare
            out["timed_step_s"] = st / nt if nt else None
            return out
        mean_t, mean_u = st / nt, su / nu
        var_t, var_u = max(0.0, (sst - nt * mean_t**2) / (nt - 1)), max(0.0, (ssu - nu * mean_u**2) / (nu - 1))
        half = 1.96 * math.sqrt(var_t / nt + var_u / nu)
        out.update(
            timed_step_s=mean_t,
            untimed_step_s=mean_u,
            timing_effect_s=mean_t - mean_u,
            timing_effect_half_width_s=half,
            timing_perturbs_steps=bool(mean_t - mean_u > half),
        )
        return out

    def means(self) -> dict:
        part = self.part()
        return {
            name: (self.sums[part][name] / self.counts[part][name] if self.counts[part][name] else None)
            for name in STEP_FIELDS
        }

    def rank_mean_and_se(self, rank: int, field: str) -> tuple[float | None, float | None]:
        """One rank's mean of `field` over its steady-state steps, and the mean's standard error."""
        if not self.per_rank:
            return None, None
        totals = pd.concat(self.per_rank).groupby(level=0).sum()
        if rank not in totals.index or f"{field}_n" not in totals.columns:
            return None, None
        n, total, squares = (float(totals.loc[rank, f"{field}{x}"]) for x in ("_n", "_sum", "_sq"))
        if n < 1:
            return None, None
        mean = total / n
        se = math.sqrt(max(0.0, (squares - n * mean * mean) / (n - 1)) / n) if n > 1 else None
        return mean, se

    def ranks_table(self) -> pd.DataFrame:
        """Per rank: mean step, its four phases, exposed comm, waiting and transfer; steps it was the straggler."""
        if not self.per_rank:
            return pd.DataFrame()
        totals = pd.concat(self.per_rank).groupby(level=0).sum()
        table = pd.DataFrame(index=totals.index)
        for field in RANK_FIELDS:
            if f"{field}_sum" in totals.columns:
                table[field] = totals[f"{field}_sum"] / totals[f"{field}_n"].where(totals[f"{field}_n"] > 0)
        steps = sum(self.stragglers.values())
        table["straggler_steps"] = [self.stragglers.get(int(r), 0) for r in table.index]
        table["straggler_share"] = table["straggler_steps"] / steps if steps else float("nan")
        table.index.name = "rank"
        return table.reset_index()

    def rank0_span_frame(self) -> pd.DataFrame:
        columns = ["epoch", "step", "comm_span_s", "synced_micro_batches"]
        return pd.concat(self.rank0_spans, ignore_index=True) if self.rank0_spans else pd.DataFrame(columns=columns)

    def calibration_frame(self) -> pd.DataFrame:
        return pd.concat(self.calibration, ignore_index=True) if self.calibration else pd.DataFrame()


def _pairs(steps: pd.DataFrame) -> pd.DataFrame | None:
    """Per calibration pair (epoch, rank, pair): the sync and no_sync halves' step_s, side by side."""
    keys = ["epoch", "rank", "pair"]
    halves = {}
    for kind in ("calib_sync", "calib_nosync"):
        half = steps.loc[steps["kind"] == kind, keys + ["step_s"]]
        if half.empty:
            return None
        # index alignment, not pivot_table: a 1,024-rank run has about a million pairs
        halves[kind] = half.drop_duplicates(keys).set_index(keys)["step_s"]
    return pd.DataFrame(halves)


def _pooled(per_pair: pd.Series) -> float | None:
    """The median over an (epoch, rank)'s pairs, the mean over ranks, the median over epochs."""
    per_pair = per_pair.dropna()
    if per_pair.empty:
        return None
    per_rank = per_pair.groupby(level=["epoch", "rank"]).median()
    return float(per_rank.groupby(level="epoch").mean().median())


def comm_delta_s(steps: pd.DataFrame) -> float | None:
    """The A/B difference in seconds (see module docstring); None without calibration steps."""
    per_pair = _pairs(steps)
    return _pooled(per_pair["calib_sync"] - per_pair["calib_nosync"]) if per_pair is not None else None


def interference_s(steps: pd.DataFrame) -> float | None:
    """The A/B difference beyond the exposed communication the synchronisation adds.

    Per calibration pair: (sync - no_sync step time) - (the sync half's exposed_comm_s - the
    no_sync half's), pooled as the A/B difference is. The no_sync half's exposed time is what the
    A/B does not remove: none for DDP and Horovod, FSDP's all-gathers (a pass without them does
    not exist), so the subtraction compares the A/B with the exposed time of what it removes and
    nothing else. Measured on the very steps of the A/B, so a straggler injected into training
    steps only (or any difference between training and calibration steps) cannot leak into it:
    what remains is communication taking compute away.
    """
    per_pair = _pairs(steps)
    if per_pair is None or "exposed_comm_s" not in steps.columns:
        return None
    keys = ["epoch", "rank", "pair"]
    exposed = {
        kind: steps[steps["kind"] == kind]
        .drop_duplicates(keys)
        .set_index(keys)["exposed_comm_s"]
        .reindex(per_pair.index)
        .fillna(0.0)
        for kind in ("calib_sync", "calib_nosync")
    }
    added = exposed["calib_sync"] - exposed["calib_nosync"]
    return _pooled(per_pair["calib_sync"] - per_pair["calib_nosync"] - added)


def _synced_per_step(figures: dict) -> float:
    """Synchronised micro-batches per steady step; 1 for records made before micro-batches were recorded."""
    synced = figures.get("synced_micro_batches")
    return 1.0 if synced is None else float(synced)


def _finite_or_none(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def mfu(achieved_flops_per_s: float | None, peak_flops_per_s: float | None) -> tuple[float | None, str | None]:
    """(MFU, None) or (None, why absent): achieved / peak, never above 1 (module docstring)."""
    if not achieved_flops_per_s or not peak_flops_per_s:
        return None, "no achieved rate or no peak for this device and precision"
    ratio = achieved_flops_per_s / peak_flops_per_s
    if ratio > 1.0:
        return None, (
            f"achieved {achieved_flops_per_s / 1e9:.3g} GFLOP/s exceeds the peak taken "
            f"({peak_flops_per_s / 1e9:.3g} GFLOP/s): that peak is no upper bound, MFU not given"
        )
    return ratio, None


INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def tokens_per_sample(profile: dict | None) -> int | None:
    """T where a sample is a sequence of T token ids (an integer input of shape (T,)); None otherwise."""
    profile = profile or {}
    shape, dtype = profile.get("input_shape"), profile.get("input_dtype")
    if dtype in INTEGER_DTYPES and shape is not None and len(shape) == 1:
        return int(shape[0])
    return None


def real_tokens_per_sample(profile: dict | None) -> float | None:
    """The tokens per sample an `attention_mask` left unmasked (the first batch's mean), where it
    left fewer than `tokens_per_sample` positions (padding); None otherwise (module docstring)."""
    tokens, real = tokens_per_sample(profile), (profile or {}).get("real_tokens_per_sample")
    return float(real) if (tokens and real is not None and real < tokens) else None


def tokens_figures(throughput_samples_per_s: float | None, profile: dict | None) -> dict:
    """Tokens per sample and tokens/s, and the real ones beside them where padding made them differ."""
    tokens, real = tokens_per_sample(profile), real_tokens_per_sample(profile)
    return {
        "tokens_per_sample": tokens,
        "throughput_tokens_per_s": throughput_samples_per_s * tokens if (tokens and throughput_samples_per_s) else None,
        "real_tokens_per_sample": real,
        "throughput_real_tokens_per_s": throughput_samples_per_s * real
        if (real and throughput_samples_per_s)
        else None,
    }


def target_reached(values: pd.Series, target_accuracy: float | None, target_loss: float | None) -> pd.Series:
    """Which rows reached the target: val_loss <= target_loss when there is one, else val_accuracy >= target_accuracy
    (`values`: the frame of epochs or evaluations; NaN never reaches)."""
    if target_loss is not None:
        column = values["val_loss"] if "val_loss" in values.columns else pd.Series(math.nan, index=values.index)
        return column <= target_loss
    if target_accuracy is None:
        return pd.Series(False, index=values.index)
    return values["val_accuracy"] >= target_accuracy


def utilisation(throughput_samples_per_s: float | None, num_workers: int, profile: dict | None) -> dict:
    """Achieved FLOP/s per worker, MFU and arithmetic intensity (definitions: module docstring)."""
    profile = profile or {}
    flops = profile.get("train_flops")
    peak = profile.get("peak_flops_per_s")
    bytes_per_sample = profile.get("train_bytes_per_sample")
    achieved = flops * throughput_samples_per_s / num_workers if (flops and throughput_samples_per_s) else None
    ratio, why_absent = mfu(achieved, peak)
    return {
        "train_flops_per_sample": flops,
        "forward_flops_per_sample": profile.get("forward_flops"),
        "peak_flops_per_s": peak,
        "peak_source": profile.get("peak_source"),
        "mem_bytes_per_s": profile.get("mem_bytes_per_s"),
        "achieved_flops_per_s": achieved,
        "mfu": ratio,
        "mfu_note": why_absent,
        "arithmetic_intensity": flops / bytes_per_sample if (flops and bytes_per_sample) else None,
    }


# DDP's timers and the lab's agree when the ratio of their figures for the same steps is within this
# factor either way, beyond the noise (`ddp_second_opinion`): a planted error of 1.5x in either fails it
DDP_AGREEMENT = 1.25
DDP_MIN_PAIRS = 3
# Student's t at 97.5% for 1..29 degrees of freedom (a 95% interval of a mean of few pairs); 1.96 beyond
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13,
         2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05)  # fmt: skip


def ddp_pairs(epochs: pd.DataFrame, rank0_spans: pd.DataFrame) -> pd.DataFrame:
    """Per steady step of rank 0 that DDP's timers sampled in every synchronised micro-batch: the lab's
    `comm_span_s` and DDP's backward comm time summed over the step's iterations (`ddp_s`)."""
    if epochs.empty or "ddp_samples" not in epochs.columns or rank0_spans.empty:
        return pd.DataFrame(columns=["epoch", "step", "comm_span_s", "ddp_s"])
    samples = [sample for text in epochs["ddp_samples"].dropna() for sample in json.loads(text) if len(sample) == 3]
    if not samples:
        return pd.DataFrame(columns=["epoch", "step", "comm_span_s", "ddp_s"])
    ddp = pd.DataFrame(samples, columns=["epoch", "step", "ddp_s"]).groupby(["epoch", "step"])["ddp_s"]
    ddp = pd.DataFrame({"ddp_s": ddp.sum(), "iterations": ddp.count()}).reset_index()
    paired = rank0_spans.merge(ddp, on=["epoch", "step"])
    paired = paired[(paired["iterations"] == paired["synced_micro_batches"]) & (paired["ddp_s"] > 0)]
    return paired[paired["comm_span_s"] > 0][["epoch", "step", "comm_span_s", "ddp_s"]].reset_index(drop=True)


def ddp_second_opinion(epochs: pd.DataFrame, rank0_spans: pd.DataFrame) -> dict:
    """PyTorch DDP's own timers beside the lab's, on the same steps, and whether they agree (rank 0).

    DDP times its backward communication per iteration, from the first bucket's all-reduce launch to
    the end of communication; the lab's `comm_span_s` is the same span (first bucket handed over to
    last all-reduce done), summed over a step's synchronised micro-batches. They are compared step
    by step (`ddp_pairs`): each steady step of rank 0 whose every synchronised iteration DDP sampled,
    the lab's span against DDP's summed over that step, so that load, which moves both, cancels.
    `ddp_comm_ratio` = lab / DDP, the geometric mean over the pairs, with its 95% interval
    (`ddp_comm_ratio_low`, `_high`, over `ddp_pairs` pairs). `ddp_disagrees`: False when the whole
    interval lies within a factor DDP_AGREEMENT either way, True when it lies wholly outside, None
    when it straddles the bound or there are fewer than DDP_MIN_PAIRS pairs (no verdict either way).
    `ddp_comm_s`: DDP's mean per steady iteration over the epochs (all its samples);
    `ddp_exposed_comm_s`: DDP's comm minus its compute/comm overlap, reported as DDP gives it: on
    CPU its compute-end timer now and then lands after the communication, counting the whole
    all-reduce as overlap, so it is not what the agreement is judged on.
    """
    out = dict.fromkeys(
        ("ddp_comm_s", "ddp_exposed_comm_s", "ddp_comm_ratio", "ddp_comm_ratio_low", "ddp_comm_ratio_high")
    )
    out.update(ddp_pairs=0, ddp_disagrees=None)
    if epochs.empty or "ddp_comm_s" not in epochs.columns:
        return out
    sampled = epochs[epochs["ddp_comm_s"].notna() & (epochs["ddp_iterations"] > 0)]
    if not sampled.empty:
        n = sampled["ddp_iterations"]
        out["ddp_comm_s"] = float((sampled["ddp_comm_s"] * n).sum() / n.sum())
        out["ddp_exposed_comm_s"] = float((sampled["ddp_exposed_comm_s"] * n).sum() / n.sum())
    pairs = ddp_pairs(epochs, rank0_spans)
    out["ddp_pairs"] = len(pairs)
    if pairs.empty:
        return out
    logs = (pairs["comm_span_s"] / pairs["ddp_s"]).map(math.log)
    mean = float(logs.mean())
    out["ddp_comm_ratio"] = math.exp(mean)
    if len(pairs) < DDP_MIN_PAIRS:
        return out
    dof = len(pairs) - 1
    half = (_T975[dof - 1] if dof <= len(_T975) else 1.96) * float(logs.std()) / math.sqrt(len(pairs))
    low, high = math.exp(mean - half), math.exp(mean + half)
    out["ddp_comm_ratio_low"], out["ddp_comm_ratio_high"] = low, high
    if 1 / DDP_AGREEMENT <= low and high <= DDP_AGREEMENT:
        out["ddp_disagrees"] = False
    elif high < 1 / DDP_AGREEMENT or low > DDP_AGREEMENT:
        out["ddp_disagrees"] = True
    return out


def noise_scale_figures(epochs: pd.DataFrame, num_workers: int) -> dict:
    """The run's gradient noise scale (scaling/noise_scale.py defines it and its estimator) over its epochs.

    `noise_scale`, `noise_scale_low`, `noise_scale_high`: the ratio of the epochs' step-weighted mean tr(Σ)
    (`grad_trace`) and mean |G|² (`grad_sq`), its 95% interval by batch means with the epochs as the batches
    (their spread holds the noise scale's drift over training as well as the estimate's noise); one epoch: that
    epoch's own interval (over its steps). `noise_steps`: the steps (or calibration pairs) it rests on;
    `noise_scale_source`: where the two batch sizes came from; `noise_scale_note`: why it is absent.
    """
    keys = NOISE_FIGURES
    out: dict = dict.fromkeys(keys)
    out["noise_scale_source"] = (
        "the gradient before and after its collective (all-reduce or reduce-scatter), on the timed steps"
        if num_workers > 1
        else "the calibration window: a batch's gradient alone and two batches' together"
    )
    measured = epochs[epochs["noise_steps"] > 0] if "noise_steps" in epochs.columns else epochs.iloc[:0]
    if measured.empty:
        out["noise_scale_source"] = None
        out["noise_scale_note"] = (
            "not measured: no epoch recorded gradient norms (none where the collective does not average over every "
            "rank: fp16 FSDP2 gradients, HSDP, Adasum; one worker needs the calibration window: forward_backward, "
            "calibration data and instrument.noise_scale)"
        )
        return out
    if len(measured) == 1:
        row = measured.iloc[0]
        figures = {key: _finite_or_none(row[key]) for key in keys if key != "noise_steps"}
    else:
        blocks = list(zip(measured["noise_steps"], measured["grad_trace"], measured["grad_sq"]))
        figures = {key: _finite_or_none(value) for key, value in noise_scale.ratio_interval(blocks).items()}
        figures.pop("noise_blocks", None)
    out.update(figures)
    out["noise_steps"] = int(measured["noise_steps"].sum())
    if out["noise_scale"] is None:
        out["noise_scale_note"] = "the gradient is below its noise (mean |G|² <= 0 over the measured steps)"
    elif out["noise_scale_high"] is None and out["noise_scale_low"] is not None:
        out["noise_scale_note"] = "no upper bound: the interval of |G|² reaches zero"
    else:
        out["noise_scale_note"] = None
    return out


def peak_memory(epochs: pd.DataFrame) -> dict:
    """`peak_memory_bytes`: the largest rank's peak over the run's epochs; `peak_memory_min_bytes`: the
    smallest rank's, over the same epochs; `peak_memory_method`: how (module docstring). None without them."""
    out = {"peak_memory_bytes": None, "peak_memory_min_bytes": None, "peak_memory_method": None}
    if epochs.empty or "peak_memory_bytes" not in epochs.columns:
        return out
    out["peak_memory_bytes"] = _finite_or_none(epochs["peak_memory_bytes"].max())
    if "peak_memory_min_bytes" in epochs.columns:  # one rank: its own peak
        out["peak_memory_min_bytes"] = _finite_or_none(epochs["peak_memory_min_bytes"].max())
    else:
        out["peak_memory_min_bytes"] = out["peak_memory_bytes"]
    if "peak_memory_method" in epochs.columns:
        methods = epochs["peak_memory_method"].dropna()
        out["peak_memory_method"] = str(methods.iloc[-1]) if not methods.empty else None
    return out


def _restarts_lost(attempts: list[dict] | None) -> list[tuple[int, float]]:
    """Per restart: (the epoch whose checkpoint it resumed from, 0 with none; the seconds it lost)."""
    attempts = attempts or []
    if len(attempts) < 2:
        return []
    first = attempts[0]["first_step_unix"]
    return [
        (a.get("resumed_from_epoch") or 0, a["first_step_unix"] - (a["resume_point_unix"] or first))
        for a in attempts[1:]
    ]


def restarts_and_time_lost(attempts: list[dict] | None) -> tuple[int, float]:
    """(restarts, time_lost_s) from the run's attempts (see the module docstring)."""
    lost = _restarts_lost(attempts)
    return len(lost), float(sum(seconds for _, seconds in lost))


def time_lost_before_epoch(attempts: list[dict] | None, epoch: int) -> float:
    """The time lost by the restarts that redid part of epoch `epoch` or earlier: those resumed
    from a checkpoint older than `epoch` (the epoch a target was reached in)."""
    return float(sum(seconds for resumed_from, seconds in _restarts_lost(attempts) if resumed_from < epoch))


def node_cost_usd(seconds, num_nodes, price_per_node_hour):
    """USD for `num_nodes` nodes held `seconds` at `price_per_node_hour` (numbers or pandas Series);
    NaN where the price is unknown (0) or either other figure is missing."""
    if isinstance(price_per_node_hour, pd.Series):
        price = price_per_node_hour.where(price_per_node_hour > 0)
    else:
        price = price_per_node_hour if price_per_node_hour and price_per_node_hour > 0 else math.nan
    if seconds is None or num_nodes is None:
        return math.nan
    return seconds / 3600.0 * num_nodes * price


def run_costs(
    tta_s: float | None, time_lost_s: float, num_nodes: int | None, price_per_node_hour: float | None
) -> dict:
    """`cost_to_accuracy_usd` and `time_lost_cost_usd` of one run (see the module docstring)."""
    if tta_s is None:
        return {"cost_to_accuracy_usd": None, "time_lost_cost_usd": None}
    return {
        "cost_to_accuracy_usd": _finite_or_none(node_cost_usd(tta_s, num_nodes, price_per_node_hour)),
        "time_lost_cost_usd": _finite_or_none(node_cost_usd(time_lost_s, num_nodes, price_per_node_hour)),
    }


def steady_step_s(epochs: pd.DataFrame, global_batch: int) -> tuple[float, list[dict]]:
    """A run's steady-state step time from its epochs: the median over the epochs after the first
    of `train_s / steps` (steps = samples / global batch; evaluation and calibration are not in
    train_s), as `time_per_epoch_s` takes the epochs. What the benchmarks compare between arms.

    Returns (that median, one dict per epoch: epoch, train_s, steps, step_s). ValueError when
    there is no epoch after the first.
    """
    rows = []
    for row in epochs.itertuples():
        steps = row.samples / global_batch
        rows.append(
            {
                "epoch": int(row.epoch),
                "train_s": float(row.train_s),
                "steps": int(steps),
                "step_s": float(row.train_s) / steps,
            }
        )
    steady = [r["step_s"] for r in rows if r["epoch"] > 1]
    if not steady:
        raise ValueError("no epoch after the first; run 2 epochs or more")
    return float(pd.Series(steady).median()), rows


def worker_counts(attempts: list[dict] | None) -> dict:
    """`workers_first_attempt`, `workers_last_attempt`, `worker_count_changed` (see the module docstring)."""
    counts = [a.get("num_workers") for a in attempts or []]
    if not counts or any(c is None for c in counts):
        return {"workers_first_attempt": None, "workers_last_attempt": None, "worker_count_changed": None}
    return {
        "workers_first_attempt": int(counts[0]),
        "workers_last_attempt": int(counts[-1]),
        "worker_count_changed": any(c != counts[0] for c in counts),
    }


def _ab_overhead(out: dict, accumulator, num_workers: int, steps_recorded: bool, ab_calibration, nothing: str):
    """The A/B figures into `out` (comm_delta_s, comm_overhead_pct, interference_s: 0 by definition at one worker,
    else from the calibration pairs); returns why they are absent, or None."""
    step_s = out["step_s"]
    ab_reason = None
    if num_workers == 1:
        # 0 by definition (nothing to communicate), said only of a run that recorded steps
        definitional = 0.0 if steps_recorded else None
        out["comm_delta_s"] = out["comm_overhead_pct"] = out["interference_s"] = definitional
        ab_reason = None if steps_recorded else nothing
    else:
        calibration = accumulator.calibration_frame()
        delta = comm_delta_s(calibration) if not calibration.empty else None
        out["comm_delta_s"] = delta
        synced = _synced_per_step(out)
        out["comm_overhead_pct"] = 100.0 * delta * synced / step_s if (delta is not None and step_s) else None
        interference = interference_s(calibration) if not calibration.empty else None
        out["interference_s"] = interference * synced if interference is not None else None
        if delta is None:
            ab_reason = (
                "the job gave the instrument no forward_backward function"
                if not ab_calibration
                else nothing
                if not steps_recorded
                else "no calibration steps recorded"
            )
    return ab_reason


def summarize_run(
    steps: pd.DataFrame,
    epochs: pd.DataFrame,
    target_accuracy: float,
    num_workers: int,
    compute_profile: dict | None = None,
    attempts: list[dict] | None = None,
    ab_calibration: bool = True,
    evals: pd.DataFrame | None = None,
    tta_rule: str = "first_eval",
    target_loss: float | None = None,
) -> dict:
    """The run's figures; fields absent from the records come back as None.

    `steps`: the step records as one DataFrame, or as an iterable of DataFrame batches (the
    columns in STEP_COLUMNS suffice) for a record set too large to hold
    (scaling.results.step_batches). `num_nodes` (distinct node ranks) is in the result.

    `target_accuracy` None: no target, no TTA. `target_loss`: the target is the validation loss
    instead, reached at or below it (module docstring). `ab_calibration` False: the job gave the
    instrument no forward+backward function, so the A/B figure is absent (`comm_overhead_note`).
    """
    out: dict = {}
    restarts, time_lost_s = restarts_and_time_lost(attempts)
    out["restarts"] = restarts
    out["time_lost_s"] = time_lost_s
    out["tta_includes_restarts"] = restarts > 0
    out.update(worker_counts(attempts))
    accumulator = StepAccumulator()
    for batch in [steps] if isinstance(steps, pd.DataFrame) else steps:
        accumulator.add(batch)
    for name, value in accumulator.means().items():
        out[name] = _finite_or_none(value)
    out["num_nodes"] = len(accumulator.node_ranks) or None
    # what each figure rests on: steady-state step records (all ranks), and those whose collectives were
    # timed (every one unless instrument.collective_timing_every > 1; NaN columns on the others)
    part = "steady" if any(accumulator.counts["steady"].values()) else "train"
    out["steps_recorded"] = accumulator.counts[part]["step_s"]
    out["comm_timed_steps"] = accumulator.counts[part]["exposed_comm_s"]
    out["interference_s"] = None
    steps_named = sum(accumulator.stragglers.values())
    if steps_named:
        straggler = max(accumulator.stragglers, key=accumulator.stragglers.get)
        out["straggler_rank"] = straggler
        out["straggler_share"] = accumulator.stragglers[straggler] / steps_named
    else:
        out["straggler_rank"], out["straggler_share"] = None, None
    out["ranks"] = accumulator.ranks_table()  # popped by scaling.launch.finish.write_summary into ranks.parquet
    out.update(ddp_second_opinion(epochs, accumulator.rank0_span_frame()))
    step_s = out["step_s"]
    # each share over the steps that recorded its numerator (SHARE_FIELDS): a communication share over
    # the steps whose collectives were timed, never a mean over them divided by a mean over all steps
    for name in SHARE_FIELDS:
        pct, half_width = accumulator.share(name)
        out[name.removesuffix("_s") + "_pct"] = pct if out.get(name) is not None else None
        if name in ("allreduce_s", "exposed_comm_s"):
            out[name.removesuffix("_s") + "_pct_half_width"] = half_width if out.get(name) is not None else None
    out.update(accumulator.timing_effect())
    out.update(peak_memory(epochs))
    out.update(noise_scale_figures(epochs, num_workers))

    out["comm_overhead_note"] = None
    steps_recorded = accumulator.counts["train"]["step_s"] > 0
    nothing = NO_EPOCH if epochs.empty else NO_STEP  # why a figure of the steps has no observations
    ab_reason = _ab_overhead(out, accumulator, num_workers, steps_recorded, ab_calibration, nothing)

    out["instrument_host_pct"] = (
        100.0 * out["instrument_host_s"] / step_s if (step_s and out["instrument_host_s"] is not None) else None
    )
    # interference is the A/B's, beside waiting and transfer (the timed steps'): over the same denominator
    timed_step_s = accumulator.denominator_s("exposed_comm_s")
    value = out["interference_s"]
    out["interference_pct"] = 100.0 * value / timed_step_s if (value is not None and timed_step_s) else None

    out["epochs_run"] = int(len(epochs))
    out.update(tta_rule="epoch_end", epochs_to_target_progress=None, tta_epoch_end_s=None)
    if epochs.empty:
        out.update(
            best_accuracy=None,
            best_val_loss=None,
            epochs_to_target=None,
            tta_s=None,
            tta_wall_s=None,
            time_per_epoch_s=None,
            throughput_samples_per_s=None,
            throughput_steps_per_s=None,
            calibration_s=None,
            eval_s=None,
        )
        out.update(tokens_figures(None, compute_profile))
        out.update(utilisation(None, num_workers, compute_profile))
        return _with_not_measured(
            out, epochs_recorded=False, steps_recorded=steps_recorded, ab_reason=ab_reason, profile=compute_profile
        )
    steady_epochs = epochs.iloc[1:] if len(epochs) > 1 else epochs
    out["time_per_epoch_s"] = float(steady_epochs["train_s"].median())
    out["throughput_samples_per_s"] = float((steady_epochs["samples"] / steady_epochs["train_s"]).median())
    out["throughput_steps_per_s"] = (
        float((steady_epochs["steps"] / steady_epochs["train_s"]).median())
        if "steps" in steady_epochs.columns
        else None
    )
    out.update(tokens_figures(out["throughput_samples_per_s"], compute_profile))
    out["calibration_s"] = float(epochs["calibration_s"].sum())
    out["eval_s"] = float(epochs["eval_s"].sum())
    out.update(utilisation(out["throughput_samples_per_s"], num_workers, compute_profile))
    accuracy = epochs["val_accuracy"]
    out["best_accuracy"] = _finite_or_none(accuracy.max())
    out["best_val_loss"] = _finite_or_none(epochs["val_loss"].min()) if "val_loss" in epochs.columns else None
    reached = epochs[target_reached(epochs, target_accuracy, target_loss)]
    if reached.empty:
        out.update(epochs_to_target=None, tta_s=None, tta_wall_s=None)
    else:
        first = reached.iloc[0]
        out["epochs_to_target"] = int(first["epoch"])
        lost = time_lost_before_epoch(attempts, int(first["epoch"]))
        out["tta_includes_restarts"] = lost > 0
        out["tta_epoch_end_s"] = float(epochs.loc[epochs["epoch"] <= first["epoch"], "train_s"].sum()) + lost
        out["tta_s"] = out["tta_epoch_end_s"]
        out["tta_wall_s"] = float(first["elapsed_wall_s"])
        out["epochs_to_target_progress"] = float(first["epoch"])
    if (
        tta_rule == "first_eval"
        and evals is not None
        and not evals.empty
        and (target_accuracy is not None or target_loss is not None)
    ):
        out["tta_rule"] = "first_eval"
        at_target = evals[target_reached(evals, target_accuracy, target_loss)].sort_values("elapsed_train_s")
        if not at_target.empty:
            first_eval = at_target.iloc[0]
            lost = time_lost_before_epoch(attempts, int(first_eval["epoch"]))
            out["tta_includes_restarts"] = lost > 0
            out["tta_s"] = float(first_eval["elapsed_train_s"]) + lost
            out["epochs_to_target_progress"] = float(first_eval["epoch_progress"])
            if "elapsed_wall_s" in first_eval.index and pd.notna(first_eval["elapsed_wall_s"]):
                out["tta_wall_s"] = float(first_eval["elapsed_wall_s"])
    return _with_not_measured(
        out, epochs_recorded=True, steps_recorded=steps_recorded, ab_reason=ab_reason, profile=compute_profile
    )


def _with_not_measured(
    out: dict, *, epochs_recorded: bool, steps_recorded: bool, ab_reason: str | None, profile: dict | None = None
) -> dict:
    """`out` with `not_measured` (figure -> why it is None) and the two notes that repeat it (module docstring)."""
    reasons = {}
    profile_error = (profile or {}).get("error")
    if profile_error and epochs_recorded:  # the model's input not understood, or its FLOPs not counted
        reasons.update({name: profile_error for name in PROFILE_FIGURES if out.get(name) is None})
        if out.get("mfu") is None:
            out["mfu_note"] = profile_error
    if not steps_recorded:
        nothing = NO_STEP if epochs_recorded else NO_EPOCH
        reasons.update({name: nothing for name in STEP_FIGURES if out.get(name) is None})
    if ab_reason is not None:
        reasons.update({name: ab_reason for name in AB_FIGURES if out.get(name) is None})
    if not epochs_recorded:
        reasons.update({name: NO_EPOCH for name in EPOCH_FIGURES if out.get(name) is None})
        out["mfu_note"] = NO_EPOCH
    out["not_measured"] = reasons
    if "comm_overhead_pct" in reasons:
        out["comm_overhead_note"] = f"A/B not measured: {reasons['comm_overhead_pct']}"
    return out
