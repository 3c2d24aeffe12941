"""The run's figures, live, in Ray's own metrics: each worker exports them through `ray.util.metrics`.

The instrument's live metrics (scaling/instrument/parts.py) in a Ray Train worker: the Ray
launcher hands them to the lab's loop, and the lab's provider of instrument parts
(scaling/launch/instrument_parts.py) to a user's job under Ray Train. The meter calls `update`
once per epoch, at its end, with the epoch's step records of this rank and the epoch's row:
nothing is done per step in the training loop, and the per-step histograms are fed from the
epoch's records then.

Every metric carries the tags Ray Train's own worker metrics carry (ray/train/v2/_internal/
metrics/worker.py: `ray_train_run_name`, `ray_train_run_id`, `ray_train_worker_world_rank`,
`ray_train_worker_actor_id`), so Ray's Train Dashboard and the lab's filter together, plus the
lab's run name (`run`: the instrument's, i.e. the config's `name` for the lab's runs, whose Ray
Train run name is always `ray_train`) and the node's rank (`node_rank`); Ray adds the node's
address (`NodeAddress`) and the worker's id itself. Ray prefixes every name with `ray_`.

Per epoch, gauges (this rank; means over its steady-state training steps, `kind == "train"` and
not warm-up, as scaling/analysis/run_metrics.py defines them; a figure without observations is
not set):

    ray_scaling_epoch                          the epoch these figures are of
    ray_scaling_step_seconds                   step time
    ray_scaling_comm_timed_step_seconds        step time of the steps whose collectives were timed: the
                                               denominator of every communication share (the dashboard's
                                               panels divide by it, as run_metrics' shares do)
    ray_scaling_phase_seconds{phase}           data, forward, backward, optimizer (they add up to the step)
    ray_scaling_communicating_seconds          time with a collective in flight, hidden or not (`comm_s`,
                                               else `allreduce_s`): time communicating
    ray_scaling_exposed_comm_seconds           communication backward did not hide: exposed
    ray_scaling_ab_comm_seconds                the A/B overhead: this rank's median over the epoch's
                                               calibration pairs of (sync - no_sync), x synced micro-batches
    ray_scaling_waiting_seconds                exposed time spent waiting for the slowest rank
    ray_scaling_transfer_seconds               exposed time once every rank was ready
    ray_scaling_straggler_share                share of the steps in which this rank arrived last
    ray_scaling_collective_seconds{kind}       time with a collective of that kind in flight, per kind:
                                               every step column `<kind>_s` whose kind is a collective
                                               (allreduce; allgather, reducescatter, regather from a
                                               sharding adapter; `COLLECTIVE_COLUMN`)
    ray_scaling_collectives_per_step{kind}     collectives of that kind per step: a `<kind>s` column
                                               where the adapter counts them, else for all-reduce
                                               `num_buckets` (one all-reduce per gradient bucket)
    ray_scaling_throughput_samples_per_second  the epoch's training throughput, all ranks (this rank's row)
    ray_scaling_throughput_tokens_per_second   the same in tokens: the epoch's `tokens` / train_s where its row
                                               counts them, else samples/s x tokens per sample where a
                                               sample is a sequence of token ids (run_metrics.tokens_per_sample)
    ray_scaling_achieved_flops_per_second      model FLOP/s per worker, once the instrument counted the
                                               model's FLOPs (run_metrics.utilisation)
    ray_scaling_mfu                            achieved / the device's peak, where the run's
                                               compute_profile.json has one (and the ratio is at most 1)

Per step, histograms (this rank's steady-state steps, cumulative over the worker's life; buckets
`BUCKETS`, 2^(1/4) apart from 61 us to 128 s):

    ray_scaling_step_duration_seconds
    ray_scaling_phase_duration_seconds{phase}
    ray_scaling_exposed_comm_duration_seconds
    ray_scaling_waiting_duration_seconds

Per step, counters (this rank's steady-state steps whose collectives were timed, summed, over the
worker's life; the run-so-far share divides the second by the first, as run_metrics' shares do):

    ray_scaling_comm_timed_step_seconds_total     step time
    ray_scaling_exposed_comm_seconds_total        exposed communication

A histogram's `_sum` would not do: Ray rebuilds it from the buckets' midpoints (`COUNTERS`).

A quantile of a histogram (`histogram_quantile` in PromQL) is interpolated inside its bucket, so
it can be off the exact quantile by up to a bucket's width (19% here); tests/test_dashboard.py
applies the same interpolation to the records' values, to compare.

Ray exports a worker's metrics on its node's metrics endpoint (`ray start
--metrics-export-port`) every few seconds while the worker lives, where Prometheus scrapes them
(Ray's service-discovery file, docs/dashboard.md); the dashboard shipped with the package
(scaling/grafana/scaling_dashboard.json, `scaling dashboard install`) shows them. Made outside
an initialised Ray, or with SCALING_LIVE_METRICS=0 in the workers' environment, they export
nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from pathlib import Path

from scaling.schema import COLLECTIVE_KINDS, JOB_KINDS, PHASES, REGATHER

ENABLE_ENV = "SCALING_LIVE_METRICS"  # "0", "off", "false" or "no": export nothing
# A step column `<kind>_s` that times a gradient collective kind, the re-gathers included (comm_s, the union
# over kinds, is time communicating; a job's own collectives, JOB_KINDS, are not the gradients').
_GRADIENT_KINDS = [kind for kind in COLLECTIVE_KINDS if kind not in JOB_KINDS] + [REGATHER]
COLLECTIVE_COLUMN = re.compile(rf"^({'|'.join(_GRADIENT_KINDS)})_s$")
# 2^(k/4) seconds rounded to 3 significant digits (so the `le` labels read as written), 61 us to 128 s.
BUCKETS = tuple(sorted({float(f"{2.0 ** (k / 4):.3g}") for k in range(-56, 29)}))

RAY_TAGS = ("ray_train_run_name", "ray_train_run_id", "ray_train_worker_world_rank", "ray_train_worker_actor_id")
TAG_KEYS = ("run", *RAY_TAGS, "node_rank")

GAUGES = {  # name (without Ray's `ray_` prefix) -> (extra tag key or None, description)
    "scaling_epoch": (None, "the epoch the lab's figures are of"),
    "scaling_step_seconds": (None, "mean steady-state training step time of the epoch (s)"),
    "scaling_comm_timed_step_seconds": (None, "mean time of the steps whose collectives were timed (s)"),
    "scaling_phase_seconds": ("phase", "mean time per step in each phase: data, forward, backward, optimizer (s)"),
    "scaling_communicating_seconds": (None, "mean time per step with a collective in flight, hidden or not (s)"),
    "scaling_exposed_comm_seconds": (None, "mean communication per step not hidden behind compute (s)"),
    "scaling_ab_comm_seconds": (
        None,
        "A/B: what synchronising costs a step, median over the epoch's calibration pairs (s)",
    ),
    "scaling_waiting_seconds": (None, "mean exposed communication per step spent waiting for the slowest rank (s)"),
    "scaling_transfer_seconds": (None, "mean exposed communication per step once every rank was ready (s)"),
    "scaling_straggler_share": (None, "share of the epoch's steps in which this rank arrived last at the collective"),
    "scaling_collective_seconds": ("kind", "mean time per step with a collective of this kind in flight (s)"),
    "scaling_collectives_per_step": ("kind", "mean collectives of this kind per step"),
    "scaling_throughput_samples_per_second": (None, "training throughput of the epoch, all ranks (samples/s)"),
    "scaling_throughput_tokens_per_second": (None, "training throughput of the epoch, all ranks (tokens/s)"),
    "scaling_achieved_flops_per_second": (None, "model FLOP/s per worker over the epoch"),
    "scaling_mfu": (None, "model FLOPs utilisation over the epoch: achieved / the device's peak"),
}
HISTOGRAMS = {  # name -> (step column, or "phase" for one per phase; description)
    "scaling_step_duration_seconds": ("step_s", "steady-state training step time (s)"),
    "scaling_phase_duration_seconds": ("phase", "time per step in each phase (s)"),
    "scaling_exposed_comm_duration_seconds": ("exposed_comm_s", "exposed communication per step (s)"),
    "scaling_waiting_duration_seconds": (
        "waiting_s",
        "exposed communication per step spent waiting for the slowest rank (s)",
    ),
}

# Ray's histogram `_sum` is not the sum of the observations: Ray's OpenTelemetry recorder rebuilds it
# from bucket midpoints (ray/_private/telemetry/open_telemetry_metric_recorder.py), several % off a
# share. The run-so-far share is a ratio of exact sums, so they are counters.
COUNTERS = {  # name -> (step column summed over the steady-state steps whose collectives were timed; description)
    "scaling_comm_timed_step_seconds_total": (
        "step_s",
        "step time summed over the steady-state steps whose collectives were timed (s)",
    ),
    "scaling_exposed_comm_seconds_total": (
        "exposed_comm_s",
        "exposed communication summed over the same steps (s)",
    ),
}


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and not math.isnan(value) and not math.isinf(value)


def _mean(rows: list[dict], column: str) -> float | None:
    values = [r[column] for r in rows if _finite(r.get(column))]
    return sum(values) / len(values) if values else None


def steady_steps(rows: list[dict] | None) -> list[dict]:
    """The steady-state training steps among an epoch's records."""
    return [r for r in rows or [] if r.get("kind") == "train" and not r.get("warmup")]


def comm_timed(steps: list[dict]) -> list[dict]:
    """The steps whose collectives were timed (their `exposed_comm_s` recorded): a share's steps."""
    return [r for r in steps if _finite(r.get("exposed_comm_s"))]


def ab_comm_s(rows: list[dict] | None, synced_per_step: float | None) -> float | None:
    """This rank's A/B difference of the epoch: the median over its calibration pairs of sync minus
    no_sync step time, times the steps' synchronised micro-batches (run_metrics' comm_delta_s, one rank)."""
    halves: dict[str, dict] = {"calib_sync": {}, "calib_nosync": {}}
    for r in rows or []:
        if r.get("kind") in halves and _finite(r.get("step_s")):
            halves[r["kind"]].setdefault(r.get("pair"), r["step_s"])
    differences = [
        halves["calib_sync"][p] - halves["calib_nosync"][p] for p in halves["calib_sync"] if p in halves["calib_nosync"]
    ]
    if not differences:
        return None
    return statistics.median(differences) * (synced_per_step or 1.0)


def epoch_figures(rows: list[dict] | None, epoch_row: dict, rank: int, profile: dict | None = None) -> list[tuple]:
    """The epoch's gauges: [(name, {extra tags}, value)] (module docstring); only figures with observations."""
    steady = steady_steps(rows)
    figures: list[tuple] = []

    def put(name, value, **tags):
        if _finite(value):
            figures.append((name, tags, float(value)))

    put("scaling_step_seconds", _mean(steady, "step_s"))
    put("scaling_comm_timed_step_seconds", _mean(comm_timed(steady), "step_s"))
    for phase in PHASES:
        put("scaling_phase_seconds", _mean(steady, f"{phase}_s"), phase=phase)
    columns = {c for r in steady for c in r}
    kinds = sorted(m.group(1) for c in columns if (m := COLLECTIVE_COLUMN.match(c)))
    communicating = _mean(steady, "comm_s") if "comm_s" in columns else _mean(steady, "allreduce_s")
    put("scaling_communicating_seconds", communicating)
    put("scaling_exposed_comm_seconds", _mean(steady, "exposed_comm_s"))
    put("scaling_ab_comm_seconds", ab_comm_s(rows, _mean(steady, "synced_micro_batches")))
    put("scaling_waiting_seconds", _mean(steady, "waiting_s"))
    put("scaling_transfer_seconds", _mean(steady, "transfer_s"))
    last = [r["straggler_rank"] for r in steady if _finite(r.get("straggler_rank"))]
    if last:
        put("scaling_straggler_share", sum(1 for s in last if int(s) == rank) / len(last))
    for kind in kinds:
        put("scaling_collective_seconds", _mean(steady, f"{kind}_s"), kind=kind)
        count = f"{kind}s" if f"{kind}s" in columns else ("num_buckets" if kind == "allreduce" else None)
        if count is not None:
            put("scaling_collectives_per_step", _mean(steady, count), kind=kind)
    train_s = epoch_row.get("train_s")
    throughput = epoch_row.get("throughput_samples_per_s")
    put("scaling_throughput_samples_per_second", throughput)
    if _finite(epoch_row.get("tokens")) and _finite(train_s) and train_s > 0:
        put("scaling_throughput_tokens_per_second", epoch_row["tokens"] / train_s)
    elif _finite(throughput) and profile:
        from scaling.analysis.run_metrics import tokens_per_sample

        tokens = tokens_per_sample(profile)  # a sample that is a sequence of T token ids: T, as the summary counts
        put("scaling_throughput_tokens_per_second", throughput * tokens if tokens else None)
    if _finite(throughput) and profile:
        from scaling.analysis.run_metrics import utilisation

        figures_of_use = utilisation(throughput, int(epoch_row.get("num_workers") or 1), profile)
        put("scaling_achieved_flops_per_second", figures_of_use["achieved_flops_per_s"])
        put("scaling_mfu", figures_of_use["mfu"])
    put("scaling_epoch", epoch_row.get("epoch"))  # last: an export that shows this epoch shows its figures
    return figures


def step_observations(rows: list[dict] | None) -> list[tuple]:
    """The epoch's histogram observations: [(name, {extra tags}, [values])], from its steady-state steps."""
    steady = steady_steps(rows)
    observed = []
    for name, (column, _) in HISTOGRAMS.items():
        for tags, col in [({"phase": p}, f"{p}_s") for p in PHASES] if column == "phase" else [({}, column)]:
            values = [float(r[col]) for r in steady if _finite(r.get(col))]
            if values:
                observed.append((name, tags, values))
    return observed


def step_totals(rows: list[dict] | None) -> list[tuple]:
    """The epoch's increments of the counters: [(name, sum)] over its steady-state steps whose
    collectives were timed (none: no increment), so a share of two counters is run_metrics' share."""
    timed = comm_timed(steady_steps(rows))
    if not timed:
        return []
    return [(name, math.fsum(float(r[column]) for r in timed)) for name, (column, _) in COUNTERS.items()]


def _train_context_tags() -> dict:
    """Ray Train's run name and id of this worker, as its own metrics tag them ("" outside Ray Train)."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        context = get_train_context()
        return {
            "ray_train_run_name": str(context.get_experiment_name()),
            "ray_train_run_id": str(context.train_run_context.run_id),
        }
    except Exception:  # noqa: BLE001 - not a Ray Train V2 worker (or its internals moved): tags left empty
        return {"ray_train_run_name": "", "ray_train_run_id": ""}


_METRICS: dict = {}  # one Ray metric per name in a process (a restarted loop in the same worker reuses them)


def _ray_metric(name: str):
    if name not in _METRICS:
        from ray.util.metrics import Counter, Gauge, Histogram

        if name in GAUGES:
            extra, text = GAUGES[name]
            _METRICS[name] = Gauge(name, description=text, tag_keys=TAG_KEYS + ((extra,) if extra else ()))
        elif name in COUNTERS:
            _METRICS[name] = Counter(name, description=COUNTERS[name][1], tag_keys=TAG_KEYS)
        else:
            column, text = HISTOGRAMS[name]
            _METRICS[name] = Histogram(
                name,
                description=text,
                boundaries=list(BUCKETS),
                tag_keys=TAG_KEYS + (("phase",) if column == "phase" else ()),
            )
    return _METRICS[name]


class RayLiveMetrics:
    """This worker's live metrics (module docstring): `update` at every epoch's end."""

    def __init__(self, run: str, identity):
        self.rank = int(identity.rank)
        self.tags: dict = {}
        self.profile: dict | None = None
        import ray

        if not ray.is_initialized() or not enabled():
            return
        self.tags = {
            "run": str(run),
            **_train_context_tags(),
            "ray_train_worker_world_rank": str(identity.rank),
            "ray_train_worker_actor_id": ray.get_runtime_context().get_actor_id() or "",
            "node_rank": str(identity.node_rank),
        }

    def update(self, rows: list[dict] | None, epoch_row: dict) -> None:
        """Set the gauges from the epoch's step records (this rank's) and its row; observe its steps."""
        if not self.tags:
            return
        for name, extra, values in step_observations(rows):
            metric, tags = _ray_metric(name), {**self.tags, **extra}
            for value in values:
                metric.observe(value, tags=tags)
        for name, total in step_totals(rows):
            if total > 0:  # Ray's Counter refuses an increment of 0 (a 1-worker run communicates nothing)
                _ray_metric(name).inc(total, tags=self.tags)
        for name, extra, value in epoch_figures(rows, epoch_row, self.rank, self._compute_profile()):
            _ray_metric(name).set(value, tags={**self.tags, **extra})

    def _compute_profile(self) -> dict | None:
        """The run's compute_profile.json (FLOPs per sample, the device's peak), once rank 0 wrote it at
        the first epoch's end; found through the run the launcher handed this worker (none: no MFU)."""
        if self.profile is None:
            from scaling.instrument.settings import LaunchedRun
            from scaling.results import COMPUTE_PROFILE_JSON

            run = LaunchedRun.from_environment()
            try:
                self.profile = json.loads((Path(run.run_dir) / COMPUTE_PROFILE_JSON).read_text()) if run else None
            except (OSError, ValueError):
                self.profile = None
        return self.profile
