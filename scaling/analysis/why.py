"""Why a job scales as it does: the causes its records show, each defined once beside the figures it
reads, ranked by what they cost the step (`scaling why`, the report's first section). Pure
numpy/pandas: a run's (or a sweep's) figures in, findings out; the price of each fix is the
projection's (scaling/why.py), which this layer may not import.

    evidence = run_evidence(summary, steps, ranks, telemetry)          # one run
    evidence = sweep_evidence(runs, largest)                            # a sweep: runs.parquet + its largest run
    findings = diagnose(evidence)                                       # [Finding], ranked

A cause is a small class with one method, `assess(evidence) -> Finding | None` (None: the data
rules it out, or it does not apply). A finding's `cost_pct` is its share of the step (the
training time it costs, as every step of an epoch is a step), with a 95% interval; a
`decided` False finding is one the data cannot decide, with `decides`: the run that would.

The shares with intervals (`step_shares`): steady training steps, the mean over ranks per
step, cut in time order into blocks (compare.time_blocks: the batch-means method, as
`scaling compare` takes a run's steps); the share is sum(part) / sum(step_s) over the steps
that recorded the part, and its interval a percentile bootstrap over the blocks
(intervals.RESAMPLES, SEED). Listing rule (`NOTABLE_PCT`): a cause whose whole interval lies
below it is ruled out and not listed; one whose estimate reaches it but whose interval holds 0,
or whose estimate is below it while its interval reaches it, is undecided ("a longer run
decides").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scaling.analysis.compare import time_blocks
from scaling.analysis.intervals import CONFIDENCE, RESAMPLES, SEED
from scaling.analysis.scaling_tables import group_keys, in_fixed_count_figures
from scaling.schema import PHASE_COLUMNS, ddp_settings_with_work

NOTABLE_PCT = 2.0  # a cause costing less than this share of the step (its whole interval) is ruled out
STRAGGLER_SHARE = 0.6  # one rank last in at least this share of steps: a straggler, not jitter among equals
STRAGGLER_EXPLAINED = 0.5  # its extra input or compute time must be at least this share of the others' wait
MFU_LOW = 0.5  # below it, at fp32 where the device has a faster precision, the precision is a suspect
GPU_BUSY_PCT = 85.0  # NVML's utilisation below this during training: the host does not keep the GPU fed
SHARE_COLUMNS = (*PHASE_COLUMNS, "step_s", "exposed_comm_s", "waiting_s", "transfer_s", "wrapper_s")


@dataclass(frozen=True)
class Share:
    """A share of the step (%) with its 95% interval (NaN where there is none)."""

    pct: float
    lo: float = math.nan
    hi: float = math.nan

    def scaled(self, factor: float) -> Share:
        return Share(self.pct * factor, self.lo * factor, self.hi * factor)

    def shifted(self, points: float) -> Share:
        return Share(self.pct + points, self.lo + points, self.hi + points)

    def text(self) -> str:
        if not math.isfinite(self.pct):
            return "-"
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return f"{self.pct:.1f}% (no interval)"
        return f"{self.pct:.1f}% [{self.lo:.1f}, {self.hi:.1f}]"


@dataclass
class Finding:
    """A cause the data shows (or cannot decide), its figure, the fix, and what prices the fix."""

    cause: str  # the cause's key (CAUSES)
    title: str
    cost: Share  # share of the step
    figure: str  # the measured figure(s) it rests on, in words
    fix: str  # one line a user can act on
    price: dict | None = None  # what the projection changes to price the fix (scaling/why.py); None: estimated
    estimate: str = "the measured share removed"  # how the gain is estimated where the projection cannot price it
    decided: bool = True
    decides: str | None = None  # undecided: the run that would decide
    of: str = "step"  # what `cost` is a share of: the step, or the job's wall time (outside its steps)
    gain: dict = field(default_factory=dict)  # filled by scaling/why.py: the projected gain


@dataclass
class Evidence:
    """What the causes read: a run's summary, its step shares, ranks and telemetry; a sweep's runs."""

    summary: dict
    shares: dict[str, Share]
    ranks: pd.DataFrame
    interference_relative: tuple[float, float] | None = None  # interference_interval
    gpu_util_pct: float | None = None  # mean NVML utilisation over training (None: no telemetry)
    sweep: pd.DataFrame | None = None  # per worker count: medians over its finished runs (sweep_table)
    precisions: dict[str, np.ndarray] | None = None  # a sweep's runs beside it at other precisions (precision_runs)
    outside: dict | None = None  # the job's time outside its steps (outside_steps)
    job: dict | None = None  # what the instrument saw of the job (job.json): its wrapper's per-step settings

    def get(self, name: str) -> float | None:
        value = self.summary.get(name)
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None


def _bootstrap_ratio(nums: np.ndarray, dens: np.ndarray) -> tuple[float, float]:
    """Percentile bootstrap of 100 x sum(nums) / sum(dens) over blocks (resampled whole)."""
    if len(nums) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(nums), (RESAMPLES, len(nums)))
    with np.errstate(all="ignore"):
        ratios = 100 * nums[picks].sum(axis=1) / dens[picks].sum(axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.nanpercentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def step_shares(steps: pd.DataFrame) -> dict[str, Share]:
    """Each column of SHARE_COLUMNS as a share of the step over the steady steps that recorded it
    (module docstring); {} without steady training steps."""
    if steps.empty or "kind" not in steps.columns:
        return {}
    train = steps[(steps["kind"] == "train") & ~steps["warmup"].astype(bool)]
    if train.empty:
        train = steps[steps["kind"] == "train"]
    if train.empty:
        return {}
    columns = [c for c in SHARE_COLUMNS if c in train.columns]
    per_step = train.groupby(["epoch", "step"], sort=True)[columns].mean().reset_index()
    out = {}
    for column in columns:
        if column == "step_s":
            continue
        had = per_step[per_step[column].notna() & per_step["step_s"].notna()]
        if had.empty or had["step_s"].sum() <= 0:
            continue
        blocks = time_blocks(had)
        nums = np.array([b[column].sum() for b in blocks])
        dens = np.array([b["step_s"].sum() for b in blocks])
        lo, hi = _bootstrap_ratio(nums, dens)
        out[column] = Share(100 * float(had[column].sum() / had["step_s"].sum()), lo, hi)
    return out


def interference_interval(steps: pd.DataFrame) -> tuple[float, float] | None:
    """The 95% interval of the A/B's interference relative to its own estimate: per calibration pair, the
    synchronised half's step less the unsynchronised half's, less the exposed time it added
    (run_metrics.interference_s's per-pair values); a percentile bootstrap of their median over pairs,
    each end over the median itself (the run's figure is scaled by these). None without 2 pairs."""
    if steps.empty or "pair" not in steps.columns or not steps["kind"].isin(["calib_sync"]).any():
        return None
    keys = ["epoch", "rank", "pair"]
    halves = {}
    for kind in ("calib_sync", "calib_nosync"):
        half = steps[steps["kind"] == kind].drop_duplicates(keys).set_index(keys)
        exposed = half["exposed_comm_s"].fillna(0.0) if "exposed_comm_s" in half.columns else 0.0
        halves[kind] = half["step_s"] - exposed
    values = (halves["calib_sync"] - halves["calib_nosync"]).dropna().to_numpy(dtype=float)
    median = float(np.median(values)) if len(values) else math.nan
    if len(values) < 2 or not median > 0:
        return None
    rng = np.random.default_rng(SEED)
    medians = np.median(values[rng.integers(0, len(values), (RESAMPLES, len(values)))], axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo / median), float(hi / median)


def mean_gpu_util(telemetry: pd.DataFrame) -> float | None:
    """Mean NVML utilisation (%) over a run's telemetry samples; None without any."""
    if telemetry.empty or "gpu_util_pct" not in telemetry.columns:
        return None
    values = pd.to_numeric(telemetry["gpu_util_pct"], errors="coerce").dropna()
    return float(values.mean()) if not values.empty else None


def run_evidence(
    summary: dict,
    steps: pd.DataFrame,
    ranks: pd.DataFrame,
    epochs: pd.DataFrame | None = None,
    telemetry: pd.DataFrame | None = None,
    job: dict | None = None,
) -> Evidence:
    return Evidence(
        summary=summary,
        shares=step_shares(steps),
        ranks=ranks if ranks is not None else pd.DataFrame(),
        interference_relative=interference_interval(steps),
        gpu_util_pct=mean_gpu_util(telemetry) if telemetry is not None else None,
        outside=outside_steps(summary, epochs) if epochs is not None else None,
        job=job,
    )


SWEEP_FIGURES = ("per_worker_batch", "throughput_samples_per_s", "step_s", "data_s", "forward_s", "backward_s")


def sweep_table(runs: pd.DataFrame, series: dict | None = None) -> pd.DataFrame:
    """Per worker count: the medians over its runs in the figures (`in_fixed_count_figures`) of
    SWEEP_FIGURES, exposed_comm_s (0 where a run timed none: one worker), compute_s (forward + backward
    less exposed communication: what the workers compute), critical_s (compute_s plus the wait for the
    slowest rank: each rank computes, then waits until the slowest has, so about the slowest rank's
    compute), data_pct, and the runs' values of compute_s, critical_s and step_s (`compute_runs`,
    `critical_runs`, `step_runs`) for the intervals; sorted by worker count. `series`: the
    report's group keys but num_workers and their values (the largest run's), so that one series of a
    sweep over another axis is compared with itself."""
    ok = _series_runs(runs, series or {})
    ok = ok[pd.to_numeric(ok.get("num_workers"), errors="coerce").notna()].copy()
    if ok.empty:
        return pd.DataFrame()
    for column in (*SWEEP_FIGURES, "exposed_comm_s", "waiting_s"):
        ok[column] = pd.to_numeric(ok[column], errors="coerce") if column in ok.columns else math.nan
    ok["compute_s"] = ok["forward_s"] + ok["backward_s"] - ok["exposed_comm_s"].fillna(0.0)
    ok["critical_s"] = ok["compute_s"] + ok["waiting_s"].fillna(0.0)
    ok["data_pct"] = 100 * ok["data_s"] / ok["step_s"]
    rows = []
    for workers, group in ok.groupby("num_workers", sort=True):
        row = {"num_workers": int(workers), "n_runs": len(group)}
        for column in (*SWEEP_FIGURES, "compute_s", "data_pct"):
            row[column] = float(group[column].median())
        row["exposed_comm_s"] = float(group["exposed_comm_s"].fillna(0.0).median())
        row["critical_s"] = float(group["critical_s"].median())
        row["compute_runs"] = group["compute_s"].dropna().to_numpy(dtype=float)
        row["critical_runs"] = group["critical_s"].dropna().to_numpy(dtype=float)
        row["step_runs"] = group["step_s"].dropna().to_numpy(dtype=float)
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_evidence(runs: pd.DataFrame, largest: Evidence, row: pd.Series) -> Evidence:
    """The largest run's evidence (`row`: its runs.parquet row) with its series' per-worker-count table beside it."""
    # a batch axis is what strong scaling reads: it splits no series
    keys = [k for k in group_keys(runs) if k != "num_workers" and k in runs.columns and "batch" not in k]
    table = sweep_table(runs, {k: row[k] for k in keys})
    largest.sweep = table if len(table) > 1 else sweep_table(runs)
    largest.precisions = precision_runs(runs, row, [k for k in keys if "precision" not in k])  # sweep.train.precision
    return largest


def _series_runs(runs: pd.DataFrame, series: dict) -> pd.DataFrame:
    """The runs in the figures (`in_fixed_count_figures`) whose values of `series`' keys are its values."""
    ok = runs[in_fixed_count_figures(runs)] if "status" in runs.columns else runs
    for key, value in series.items():
        ok = ok[ok[key].isna()] if pd.isna(value) else ok[ok[key] == value]
    return ok


def precision_runs(runs: pd.DataFrame, row: pd.Series, keys: list[str]) -> dict[str, np.ndarray] | None:
    """Per precision: the time per sample (step_s / per_worker_batch) of each finished run at `row`'s worker
    count and its values of `keys` (a sweep over train.precision: what Precision reads); None where
    the sweep has one precision there."""
    if "precision" not in runs.columns:
        return None
    ok = _series_runs(runs, {key: row[key] for key in ("num_workers", *keys)})
    per_sample = pd.to_numeric(ok["step_s"], errors="coerce") / pd.to_numeric(ok["per_worker_batch"], errors="coerce")
    found = {
        str(precision): values.dropna().to_numpy(dtype=float)
        for precision, values in per_sample.groupby(ok["precision"])
        if values.notna().any()
    }
    return found if len(found) > 1 else None


def _ruled_out(share: Share) -> bool:
    return math.isfinite(share.hi) and share.hi < NOTABLE_PCT


LONGER_RUN = "a longer run (more steady steps) narrows the interval"
MORE_REPEATS = "more repeats at each worker count (scaling sweep --repeats auto) narrow the interval"


def _finding_from_share(share: Share, decides: str = LONGER_RUN, **kwargs) -> Finding | None:
    """A finding for a measured share, or None where it is ruled out (module docstring: NOTABLE_PCT)."""
    if share is None or not math.isfinite(share.pct) or _ruled_out(share):
        return None
    if not math.isfinite(share.hi) and share.pct < NOTABLE_PCT:
        return None  # no interval and below the bar: nothing says it costs anything
    finding = Finding(cost=share, **kwargs)
    if share.pct < NOTABLE_PCT or (math.isfinite(share.lo) and share.lo <= 0):
        finding.decided = False
        finding.decides = decides
    return finding


class Cause:
    """One cause: `assess` reads the evidence and returns a Finding, or None where it is ruled out."""

    key = ""
    title = ""

    def assess(self, ev: Evidence) -> Finding | None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError


class InputBound(Cause):
    """The step waits for its batch: data_s's share of the step (and, across a sweep, its growth)."""

    key, title = "input_bound", "input-bound steps"

    def assess(self, ev):
        share, step = ev.shares.get("data_s"), ev.get("step_s")
        if share is None:
            return None
        slow = straggler(ev)
        if slow and slow["phase"] == "input" and step:
            # one rank's slow input is the straggler's cause: what remains is the wait every rank shares
            share = share.shifted(-100 * slow["extra_s"] / slow["workers"] / step)
        figure = f"data wait {share.text()} of step"
        table = ev.sweep
        if table is not None and len(table) > 1 and table["data_pct"].notna().all():
            first, last = table.iloc[0], table.iloc[-1]
            figure += (
                f"; {first['data_pct']:.1f}% at {first['num_workers']} worker(s), "
                f"{last['data_pct']:.1f}% at {last['num_workers']}"
            )
        return _finding_from_share(
            share,
            cause=self.key,
            title=self.title,
            figure=figure,
            fix="more DataLoader workers (num_workers), pin_memory=True, prefetch_factor; or pre-decoded data",
        )


class ExposedComm(Cause):
    """Communication backward did not hide, once every rank was ready (transfer_s; the wait for the
    slowest rank is the straggler's)."""

    key, title = "exposed_comm", "exposed communication"

    def assess(self, ev):
        if (ev.get("num_workers") or 1) < 2:
            return None
        share = ev.shares.get("transfer_s") or ev.shares.get("exposed_comm_s")
        if share is None:
            return None
        total = ev.shares.get("exposed_comm_s")
        micro, synced = ev.get("micro_batches") or 1.0, ev.get("synced_micro_batches") or 1.0
        if micro > 1.5 and synced > 1.5:
            share = share.scaled(1 / synced)  # the one sync a step needs; the others are accumulation's
        figure = f"exposed transfer {share.text()} of step"
        if total is not None and total is not share:
            figure += f" (exposed in all {total.pct:.1f}%)"
        compression = ev.summary.get("grad_compression") or "none"
        # Syncing less often per sample pays off whatever the exposed time is made of (a cost per sync or
        # per byte): it is the fix priced. Halving the bytes serves only the per-byte part, which one run
        # cannot tell from the rest (`scaling/why.py`), so it is named beside it, unpriced.
        fix = (
            "sync less often per sample: double the per-worker batch (lab: train.per_worker_batch; the global "
            "batch doubles) or accumulate 2 micro-batches under no_sync()"
        )
        if compression in ("none", None):
            fix += "; if the time is per byte: bf16 gradient compression (DDP bf16_compress_hook; lab: "
            fix += "instrument.grad_compression: bf16)"
        price = {"per_gpu_batch_factor": 2}
        return _finding_from_share(share, cause=self.key, title=self.title, figure=figure, fix=fix, price=price)


def straggler(ev: Evidence) -> dict | None:
    """The rank last to finish backward in most steps (STRAGGLER_SHARE), from the summary, and from
    ranks.parquet where it has each rank's phases: whether it spends more than the others' mean in
    its input (`phase` "input") or its compute ("compute"), by how much per step (`extra_s`), or in
    neither by at least STRAGGLER_EXPLAINED of the others' wait (None: its steps start late)."""
    rank, last = ev.get("straggler_rank"), ev.get("straggler_share")
    if rank is None or last is None or last < STRAGGLER_SHARE:
        return None
    out = {"rank": int(rank), "last": last, "phase": None, "extra_s": 0.0}
    ranks = ev.ranks
    needed = {"rank", "data_s", "forward_s", "backward_s", "exposed_comm_s", "waiting_s"}
    if ranks is None or ranks.empty or not needed <= set(ranks.columns) or rank not in set(ranks["rank"]):
        return out
    table = ranks.set_index("rank")
    compute = table["forward_s"] + table["backward_s"] - table["exposed_comm_s"].fillna(0.0)
    others = [r for r in table.index if r != rank]
    out.update(
        data_s=float(table.loc[rank, "data_s"]),
        others_data_s=float(table.loc[others, "data_s"].mean()),
        compute_s=float(compute.loc[rank]),
        others_compute_s=float(compute.loc[others].mean()),
        workers=len(table),
    )
    extras = {"input": out["data_s"] - out["others_data_s"], "compute": out["compute_s"] - out["others_compute_s"]}
    phase = max(extras, key=extras.get)
    if extras[phase] >= STRAGGLER_EXPLAINED * float(table.loc[others, "waiting_s"].mean()):
        out.update(phase=phase, extra_s=extras[phase])
    return out


class Straggler(Cause):
    """One rank is last to finish backward in most steps: the others wait for it (waiting_s), and its
    own extra input or compute time is in the mean step too (/ the ranks). `straggler` says which."""

    key, title = "straggler", "a straggler rank"

    def assess(self, ev):
        share, slow = ev.shares.get("waiting_s"), straggler(ev)
        step = ev.get("step_s")
        if share is None or slow is None or not step:
            return None
        rank = slow["rank"]
        own = 100 * slow["extra_s"] / slow.get("workers", 1) / step  # its own excess, in the mean over ranks
        cost = share.shifted(own)
        head = f"others wait {share.text()} of step for rank {rank} (last in {100 * slow['last']:.0f}% of steps)"
        if slow["phase"] == "input":
            why = f": its input, data {1e3 * slow['data_s']:.1f} ms vs {1e3 * slow['others_data_s']:.1f} on the others"
            fix = f"rank {rank} waits for its input: more loader workers or local/cached data on its node"
        elif slow["phase"] == "compute":
            why = (
                f": its compute, {1e3 * slow['compute_s']:.1f} ms vs {1e3 * slow['others_compute_s']:.1f} on the others"
            )
            fix = (
                f"rank {rank} computes slower: free its cores/GPU of other work (workers.pin_cpus), or replace its node"
            )
        elif "data_s" in slow:
            why = ": neither its input nor its compute is slower on average (its steps start late)"
            fix = f"rank {rank}'s steps start late (scheduling jitter): pin workers to cores (workers.pin_cpus)"
        else:
            why, fix = (
                "",
                "find why that rank is slower: its input or its compute (ranks.parquet has each rank's phases)",
            )
        return _finding_from_share(
            cost,
            cause=self.key,
            title=self.title,
            figure=head + why,
            fix=fix,
            price={"straggler_s": 0.0, "plus_pct": own},
            estimate="the others' wait and the slow rank's own excess removed",
        )


class Interference(Cause):
    """Communication taking compute: the A/B overhead beyond the exposed time (interference_pct)."""

    key, title = "interference", "interference (communication taking compute)"

    def assess(self, ev):
        value = ev.get("interference_pct")
        if (ev.get("num_workers") or 1) < 2 or value is None:
            return None
        relative = ev.interference_relative
        share = Share(value, value * relative[0], value * relative[1]) if relative else Share(value)
        overhead = ev.get("comm_overhead_pct")
        figure = (
            f"A/B overhead {overhead:.1f}% of step, of which beyond its exposed time {share.text()}"
            if overhead is not None
            else ""
        )
        return _finding_from_share(
            share,
            cause=self.key,
            title=self.title,
            figure=figure or f"{share.text()} of step",
            fix=(
                "leave a core to the collectives' threads (workers.cpus_per_worker one below each worker's share "
                "of the cores); larger buckets overlap less but expose more"
            ),
            price={"overlap_slowdown": 0.0},
            decides="more A/B pairs (instrument.calibration_pairs) narrow the interval",
        )


class AccumulationSyncsEvery(Cause):
    """Gradient accumulation that all-reduces every micro-batch: all but one sync per step are waste."""

    key, title = "accumulation_syncs", "accumulation syncing every micro-batch"

    def assess(self, ev):
        micro, synced = ev.get("micro_batches"), ev.get("synced_micro_batches")
        exposed = ev.shares.get("exposed_comm_s")
        if not micro or not synced or micro < 1.5 or synced < 1.5 or exposed is None:
            return None
        waste = (synced - 1) / synced
        base = exposed
        return _finding_from_share(
            base.scaled(waste),
            cause=self.key,
            title=self.title,
            figure=f"{synced:.0f} of {micro:.0f} micro-batches sync; each sync costs {base.pct / synced:.1f}% of step",
            fix="wrap all but the last micro-batch in model.no_sync() (FSDP2: set_requires_gradient_sync(False))",
            estimate=f"the communication of {synced - 1:.0f} of {synced:.0f} syncs removed",
        )


class Precision(Cause):
    """The run computes at a slower precision than it could.

    Measured, in a sweep over train.precision: the sweep's runs beside the explained one (the same worker
    count and series) at another precision. Its cost is the time per sample the fastest of them saves,
    median over each precision's runs, with the interval of both medians resampled over runs; a precision
    measured no faster rules the cause out, whichever way round (bf16 is slower than fp32 on many CPUs).
    Its gain is that measured saving. Without such runs: low MFU (below MFU_LOW) at fp32 is a suspect the
    data cannot decide, since what a faster precision gains on a device is measured, not assumed."""

    key = "precision"

    def assess(self, ev):
        mfu, precision = ev.get("mfu"), ev.summary.get("precision")
        low_fp32 = mfu is not None and precision == "fp32" and mfu < MFU_LOW
        mfu_text = f"MFU {100 * mfu:.1f}% of the {precision} peak" if mfu is not None else ""
        measured = ev.precisions or {}
        others = [p for p in measured if p != precision]
        if precision in measured and others:
            saved = {p: _saving(measured[precision], measured[p]) for p in others}
            best = max(others, key=lambda p: saved[p].pct)
            said = f"the sweep's {best} runs: time per sample {saved[best].text()} lower than at {precision}"
            return _finding_from_share(
                saved[best],
                cause=self.key,
                title=f"{precision} slower than {best}",
                figure=f"{mfu_text}; {said}" if mfu_text else said,
                fix=f"train.precision: {best}" + (" (autocast); on a GPU also TF32 matmuls" if best != "fp32" else ""),
                estimate=f"the saving the sweep's {best} runs measured against {precision}",
                decides=MORE_REPEATS,
            )
        if not low_fp32:
            return None
        return Finding(
            cause=self.key,
            title="low MFU at fp32",
            cost=Share(math.nan),
            figure=mfu_text,
            fix="train.precision: bf16 (autocast); on a GPU also TF32 matmuls",
            decided=False,
            decides=(
                "the same run with train.precision=bf16, or a sweep over it (sweep.axes: {train.precision: "
                "[fp32, bf16]}): what bf16 gains on this device is measured, not assumed"
            ),
        )


def _saving(slow: np.ndarray, fast: np.ndarray) -> Share:
    """100 x (median(slow) - median(fast)) / median(slow), with a 95% interval where both have 2 runs or more
    (each median resampled over its runs)."""
    share = Share(100 * (1 - np.median(fast) / np.median(slow)))
    medians = _resampled_medians(slow, fast)
    return share if medians is None else _with_interval(share, 100 * (1 - medians[1] / medians[0]))


class HostBound(Cause):
    """A GPU idle between kernels: the host does not keep it fed (telemetry's utilisation)."""

    key, title = "host_bound", "host-bound GPU step"

    def assess(self, ev):
        hardware = ev.summary.get("hardware") or {}
        if not hardware.get("gpu_name"):
            return None  # a CPU run: no GPU to starve
        if ev.gpu_util_pct is None:
            return Finding(
                cause=self.key,
                title=self.title,
                cost=Share(math.nan),
                figure="no GPU telemetry in this run",
                fix="",
                decided=False,
                decides="a run with telemetry on (instrument.telemetry_interval_s: 1)",
            )
        idle = 100.0 - ev.gpu_util_pct
        if ev.gpu_util_pct >= GPU_BUSY_PCT:
            return None
        return _finding_from_share(
            Share(idle),
            cause=self.key,
            title=self.title,
            figure=f"GPU busy {ev.gpu_util_pct:.0f}% of the time (NVML)",
            fix="CUDA graphs / torch.compile(mode='reduce-overhead'), a larger per-GPU batch, fewer host syncs",
            estimate="the GPU's idle share removed (an upper bound)",
        )


class StrongScaling(Cause):
    """A sweep whose per-worker batch falls as workers are added: each worker does less per step.

    Cost: the per-worker throughput lost between the smallest and the largest worker count, whatever
    lost it. Gain of the fix (the per-worker batch kept), in time per sample at the largest count,
    bracketed from the sweep's own runs by two steps at the smallest count's batch (`weak_scaling_gain`):
    - the largest count's step with its compute grown in proportion to the batch (its input, optimizer
      and communication kept): a compute with no part fixed per step, which makes the gain smallest;
    - the smallest count's step plus the communication the largest count exposes beyond it: each
      worker computing beside the others as fast as alone, which makes the gain largest.
    The estimate is the bracket's middle; the interval the bracket, each end resampled over its counts'
    runs (`step_runs`, `compute_runs`) where a count has 2 or more. On 2 shared cores (the lab loop's
    CNN and an attached MLP, bench/why_planted_faults.py) the realised gain fell inside it."""

    key, title = "strong_scaling", "strong scaling (per-worker batch falls)"

    def assess(self, ev):
        table = ev.sweep
        if table is None or len(table) < 2 or table["per_worker_batch"].isna().any():
            return None
        first, last = table.iloc[0], table.iloc[-1]
        if not last["per_worker_batch"] < first["per_worker_batch"]:
            return None
        per_worker = (last["throughput_samples_per_s"] / last["num_workers"]) / (
            first["throughput_samples_per_s"] / first["num_workers"]
        )
        lost = 100 * (1 - per_worker)
        finding = Finding(
            cause=self.key,
            title=self.title,
            cost=Share(lost),
            figure=(
                f"per-worker batch {first['per_worker_batch']:.0f} -> {last['per_worker_batch']:.0f} "
                f"({first['num_workers']} -> {last['num_workers']} workers); per-worker throughput -{lost:.0f}%"
            ),
            fix=(
                "keep train.per_worker_batch fixed as workers grow (weak scaling) "
                "and scale the LR with the global batch"
            ),
            estimate="per-worker throughput lost against the smallest worker count",
            decided=math.isfinite(lost) and lost > 0,
            decides=None if lost > 0 else "a sweep at a fixed per-worker batch",
        )
        finding.gain = weak_scaling_gain(first, last)
        return finding


def weak_scaling_gain(first: pd.Series, last: pd.Series) -> dict:
    """The strong-scaling fix's gain in time per sample at `last`'s worker count, between the two steps of
    StrongScaling's docstring, with its interval; {} where the sweep's rows lack a figure it needs."""
    grown = first["per_worker_batch"] / last["per_worker_batch"]
    exposed_beyond = max(0.0, last["exposed_comm_s"] - first["exposed_comm_s"])

    def gain(kept, last_step):
        return 100 * (1 - (kept / first["per_worker_batch"]) / (last_step / last["per_worker_batch"]))

    def proportional(last_step, last_compute):  # the smallest gain
        return gain(last_step + last_compute * (grown - 1), last_step)

    def alone(first_step, last_step):  # the largest gain
        return gain(first_step + exposed_beyond, last_step)

    needed = (first["step_s"], last["step_s"], last["compute_s"], last["exposed_comm_s"])
    if not all(math.isfinite(x) for x in needed):
        return {}
    low, high = proportional(last["step_s"], last["compute_s"]), alone(first["step_s"], last["step_s"])
    lo, hi = min(low, high), max(low, high)
    a, b, c = first["step_runs"], last["step_runs"], last["compute_runs"]
    if len(a) >= 2 and len(b) >= 2 and len(c) == len(b):
        rng = np.random.default_rng(SEED)
        pick_a, pick_b = rng.integers(0, len(a), (RESAMPLES, len(a))), rng.integers(0, len(b), (RESAMPLES, len(b)))
        ra, rb, rc = (np.median(x[pick], axis=1) for x, pick in ((a, pick_a), (b, pick_b), (c, pick_b)))
        tail = 100 * (1 - CONFIDENCE) / 2
        lo = min(lo, float(np.percentile(proportional(rb, rc), tail)))
        hi = max(hi, float(np.percentile(alone(ra, rb), 100 - tail)))
    return {
        "how": (
            f"estimated from the sweep's runs, between {last['num_workers']} workers' compute grown with the batch "
            f"and {first['num_workers']} worker(s)' step at batch {first['per_worker_batch']:.0f} plus the "
            "communication exposed beyond it"
        ),
        "per": "sample",
        "step_pct": float((low + high) / 2),
        "step_pct_lo": float(lo),
        "step_pct_hi": float(min(100.0, hi)),
        "at_workers": int(last["num_workers"]),
    }


class ComputeSlowing(Cause):
    """Compute itself slows as workers are added (workers sharing cores, memory bandwidth or a GPU):
    forward + backward less exposed communication per step at N workers against the smallest count.

    Cost: that growth, a share of the N-worker step. Gain of the fix (each worker its own cores, or a
    quieter machine), bracketed from the sweep's runs by what the contention is taken to have slowed:
    - the workers' mean compute only (the cost): the smallest gain;
    - the slowest rank's compute (`critical_s`: the compute plus the wait for the slowest rank), whose
      growth also holds the ranks' spread under contention, all of it removed: the largest gain.
    The estimate is the bracket's middle; the interval the bracket, each end resampled over its counts'
    runs where a count has 2 or more. On 2 shared cores with 2 programs spinning beside the job
    (bench/why_planted_faults.py), the wait for the slowest rank grew with the contention and went with it."""

    key, title = "compute_slowing", "compute slowing as workers are added"

    def assess(self, ev):
        table = ev.sweep
        if table is None or len(table) < 2 or table["compute_s"].isna().any():
            return None
        first, last = table.iloc[0], table.iloc[-1]
        if first["per_worker_batch"] != last["per_worker_batch"]:
            return None  # less work per worker: strong scaling's, not the same compute
        share = _growth_share(first, last, "compute")
        finding = _finding_from_share(
            share,
            cause=self.key,
            title=self.title,
            figure=(
                f"forward+backward {1e3 * first['compute_s']:.1f} -> {1e3 * last['compute_s']:.1f} ms/step "
                f"({first['num_workers']} -> {last['num_workers']} workers): {share.text()} of step"
            ),
            fix="give each worker its own cores/GPU (workers.cpus_per_worker, workers.pin_cpus) or a quieter machine",
            decides=MORE_REPEATS,
        )
        if finding is not None:
            widest = _growth_share(first, last, "critical")
            ends = [x for x in (share.pct, share.lo, share.hi, widest.pct, widest.lo, widest.hi) if math.isfinite(x)]
            low, high = min(share.pct, widest.pct), max(share.pct, widest.pct)
            finding.gain = {
                "how": (
                    f"estimated from the sweep's runs, between the growth of the workers' mean compute and of the "
                    f"slowest rank's ({first['num_workers']} -> {last['num_workers']} workers) removed"
                ),
                "per": "step",
                "step_pct": float((low + high) / 2),
                "step_pct_lo": float(max(0.0, min(ends))),
                "step_pct_hi": float(min(100.0, max(ends))),
                "at_workers": int(last["num_workers"]),
            }
        return finding


def _growth_share(first: pd.Series, last: pd.Series, figure: str) -> Share:
    """`figure`_s's growth from `first`'s worker count to `last`'s, a share of `last`'s step, with a 95%
    interval where both counts have 2 runs or more (each count's median resampled over its runs)."""
    share = Share(100 * (last[f"{figure}_s"] - first[f"{figure}_s"]) / last["step_s"])
    medians = _resampled_medians(first[f"{figure}_runs"], last[f"{figure}_runs"])
    if medians is None:
        return share
    ra, rb = medians
    return _with_interval(share, 100 * (rb - ra) / last["step_s"])


def _resampled_medians(*runs: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """Each array's median over RESAMPLES percentile-bootstrap resamples of its runs; None unless each has 2 runs
    or more."""
    if any(len(values) < 2 for values in runs):
        return None
    rng = np.random.default_rng(SEED)
    return tuple(np.median(v[rng.integers(0, len(v), (RESAMPLES, len(v)))], axis=1) for v in runs)


def _with_interval(share: Share, resampled: np.ndarray) -> Share:
    """`share` with the 95% percentile interval of its resampled values."""
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(resampled, [tail, 100 - tail])
    return Share(share.pct, float(lo), float(hi))


class LauncherOverhead(Cause):
    """The job's wall time outside training, evaluation and calibration: start-up (the launcher's,
    process groups, data set-up) and teardown. A share of the job, not of its steps: ranked apart."""

    key, title = "launcher", "launcher and start-up overhead"

    def assess(self, ev):
        outside = ev.outside
        if outside is None or outside["launcher_pct"] < NOTABLE_PCT:
            return None
        return Finding(
            cause=self.key,
            title=self.title,
            cost=Share(outside["launcher_pct"]),
            figure=f"{outside['launcher_s']:.1f} s of {outside['wall_s']:.1f} s wall outside training, eval, A/B",
            fix="train longer per launch; keep one Ray cluster up between runs (ray start once); --launcher local",
            estimate="the start-up's share of the wall time: a fixed cost, smaller the longer the job trains",
            of="job",
        )


class DDPSettings(Cause):
    """DDP settings that cost work in every step (job.json `per_step_settings`, the instrument's
    reading of the wrapper; schema.ddp_settings_with_work): `find_unused_parameters` without
    `static_graph` searches the autograd graph after every forward and all-reduces the unused map;
    synchronising buffers broadcasts them from rank 0 in every forward. Their price is the wrapper's
    own time around the module's forward (`wrapper_s`, a share of the step), which the instrument
    times wherever such a setting is on; the unused map's all-reduce, in backward, is not in it.
    Undecided on a run recorded without `wrapper_s`."""

    key, title = "ddp_settings", "DDP settings costing work per step"
    SAID = {
        "find_unused_parameters": (
            "find_unused_parameters=True (a graph traversal and an all-reduce per step)",
            "find_unused_parameters=False, or static_graph=True",
        ),
        "sync_buffers": (
            "buffers broadcast from rank 0 in every forward",
            "forward_sync_buffers=False (torch < 2.13: broadcast_buffers=False)",
        ),
    }

    def assess(self, ev):
        costly = ddp_settings_with_work((ev.job or {}).get("per_step_settings") or {})
        if not costly or (ev.get("num_workers") or 1) < 2:
            return None
        figure = "DDP ran with " + " and ".join(self.SAID[name][0] for name in costly)
        fix = "; ".join(self.SAID[name][1] for name in costly)
        share = ev.shares.get("wrapper_s")
        if share is None:
            return Finding(
                cause=self.key,
                title=self.title,
                cost=Share(math.nan),
                figure=figure,
                fix=fix,
                decided=False,
                decides="the same run with " + fix + " prices it",
            )
        return _finding_from_share(
            share,
            cause=self.key,
            title=self.title,
            figure=f"{figure}: the wrapper's own time around the forward {share.text()} of step",
            fix=fix,
            estimate="the wrapper's own time around the forward removed",
        )


# The causes, in the order they are assessed (the verdict ranks them by cost)
CAUSES: tuple[Cause, ...] = (
    StrongScaling(),
    InputBound(),
    AccumulationSyncsEvery(),
    ExposedComm(),
    Straggler(),
    Interference(),
    ComputeSlowing(),
    Precision(),
    HostBound(),
    DDPSettings(),
    LauncherOverhead(),
)


def diagnose(ev: Evidence) -> list[Finding]:
    """Every cause's finding, the decided ones ranked by cost (largest first), then the undecided."""
    findings = [f for cause in CAUSES if (f := cause.assess(ev)) is not None]
    decided = sorted((f for f in findings if f.decided and f.of == "step"), key=lambda f: -f.cost.pct)
    return decided + [f for f in findings if not f.decided] + [f for f in findings if f.decided and f.of != "step"]


def outside_steps(summary: dict, epochs: pd.DataFrame) -> dict | None:
    """The job's time outside its training steps: start-up and teardown (the launcher's), evaluation and
    the A/B calibration, in seconds and as shares of the run's wall time; None without a wall time."""
    wall = summary.get("run_wall_s")
    if not wall or epochs.empty or "train_s" not in epochs.columns:
        return None
    train = float(epochs["train_s"].sum())
    evals = float(epochs["eval_s"].sum()) if "eval_s" in epochs.columns else 0.0
    calibration = float(epochs["calibration_s"].sum()) if "calibration_s" in epochs.columns else 0.0
    launcher = max(0.0, float(wall) - train - evals - calibration)
    return {
        "wall_s": float(wall),
        "train_s": train,
        "launcher_s": launcher,
        "eval_s": evals,
        "calibration_s": calibration,
        "launcher_pct": 100 * launcher / float(wall),
    }
