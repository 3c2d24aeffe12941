"""A sweep: every (axis values x worker count x repeat seed) as its own run, resumable.

    scaling sweep experiments/quickstart.yaml --workers 1,2 --repeats 3 --out results/qs

The config file is a run config with an optional `sweep:` section:

    sweep:
      workers: [1, 2]          # --workers overrides
      repeats: 3               # --repeats overrides; repeat r runs with train.seed + r; "auto": see below
      axes:                    # any other config field, by dotted key
        train.per_worker_batch: [64, 128]

Layout of the sweep directory (names and readers: scaling/results.py, `SweepDir`):
    sweep.yaml        the resolved base config and the sweep spec
    runs/<run_key>/   one run directory per run (docs/results.md); run_key `w<N>[-<axis><value>]-r<repeat>`
    runs.parquet      index: one row per finished run, its summary flattened, plus
                      run_key, run_dir, repeat and one `sweep.<key>` column per axis (`summary_row`)

`repeats: auto` (`--repeats auto`) starts with 2 repeats per point and keeps adding one to each
point whose 95% interval (scaling/analysis/intervals.py, `group_interval`) of its median
throughput or of its mean TTA is wider than ±`--interval-width` (default 5%) of the figure,
until every point is that narrow or has `--max-repeats` (default 6) runs; it says which.

Re-running the same command resumes: runs whose summary.json says reached_target or
max_epochs are kept; failed, interrupted or never-finished runs are run again, from their
latest checkpoint where Ray Train registered one (a run that lost a node for longer than
failure.capacity_wait_s goes on from there), else from scratch. A failed run is recorded and
the sweep goes on. Every file is written atomically.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from scaling import writer_lock
from scaling.config import ConfigError, apply_overrides, from_dict, read_config_file, validate
from scaling.errors import UsageError
from scaling.results import RunDir, SweepDir, point_key, run_key, summary_row, write_text_atomic

DONE_STATUSES = ("reached_target", "max_epochs")
AUTO_START_REPEATS = 2


@dataclass
class SweepSpec:
    workers: list[int]
    repeats: int = 1
    axes: dict[str, list] = field(default_factory=dict)


@dataclass
class PlannedRun:
    key: str
    repeat: int
    axis_values: dict
    config: object  # ExperimentConfig


def _parse_spec(raw: dict | None, workers: list[int] | None, repeats: int | None) -> SweepSpec:
    raw = dict(raw or {})
    unknown = set(raw) - {"workers", "repeats", "axes"}
    if unknown:
        raise ConfigError(f"unknown key 'sweep.{sorted(unknown)[0]}'; valid keys here: workers, repeats, axes")
    spec = SweepSpec(workers=raw.get("workers", [1]), repeats=raw.get("repeats", 1), axes=raw.get("axes", {}) or {})
    if workers is not None:
        spec.workers = workers
    if repeats is not None:
        spec.repeats = repeats
    if (
        not isinstance(spec.workers, list)
        or not spec.workers
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in spec.workers)
    ):
        raise ConfigError(f"sweep workers must be a non-empty list of integers, got {spec.workers!r}")
    if any(w < 1 for w in spec.workers):
        raise ConfigError(f"sweep workers must be >= 1, got {spec.workers}")
    if spec.repeats != "auto" and (
        not isinstance(spec.repeats, int) or isinstance(spec.repeats, bool) or spec.repeats < 1
    ):
        raise ConfigError(f"sweep repeats must be an integer >= 1 or auto, got {spec.repeats!r}")
    if not isinstance(spec.axes, dict) or not all(isinstance(v, list) and v for v in spec.axes.values()):
        raise ConfigError("sweep.axes must map dotted config keys to non-empty lists of values")
    for key in spec.axes:
        if key in ("workers.num_workers", "train.seed"):
            raise ConfigError(f"sweep.axes.{key}: use sweep.workers / sweep.repeats for this")
    return spec


def parse_workers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--workers expects a comma-separated list of integers such as 1,2,4, got {text!r}") from None


def parse_repeats(text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--repeats expects a whole number or auto, got {text!r}") from None


def plan_sweep(
    config_path: Path, workers: list[int] | None, repeats: int | str | None, overrides: list[str] | None = None
) -> tuple[dict, SweepSpec, list[PlannedRun]]:
    """Every run of the sweep, each config's shape validated before anything runs (the world: `preflight_sweep`)."""
    data = read_config_file(config_path)
    spec = _parse_spec(data.pop("sweep", None), workers, repeats)
    data = apply_overrides(data, overrides or [])
    base = from_dict(copy.deepcopy(data))
    validate(base)
    planned = []
    axis_keys = list(spec.axes)
    for values in itertools.product(*(spec.axes[k] for k in axis_keys)):
        axis_values = dict(zip(axis_keys, values))
        for num_workers in spec.workers:
            for repeat in range(AUTO_START_REPEATS if spec.repeats == "auto" else spec.repeats):
                overrides = [f"{k}={json.dumps(v)}" for k, v in axis_values.items()]
                run_data = apply_overrides(copy.deepcopy(data), overrides)
                cfg = from_dict(run_data)
                cfg.workers.num_workers = num_workers
                cfg.train.seed = base.train.seed + repeat
                try:
                    validate(cfg)
                except ConfigError as exc:
                    raise ConfigError(f"sweep run w{num_workers} {axis_values or ''}: {exc}") from None
                planned.append(PlannedRun(run_key(num_workers, axis_values, repeat), repeat, axis_values, cfg))
    largest = max(spec.workers)
    if base.instrument.inject_straggler_s and base.instrument.straggler_rank >= largest:
        raise ConfigError(
            f"instrument.straggler_rank={base.instrument.straggler_rank} is no rank of any run of this sweep "
            f"(at most {largest} workers)"
        )
    return data, spec, planned


def another_repeat(run: PlannedRun, repeat: int) -> PlannedRun:
    """`run`'s point once more, as repeat `repeat` (seed = the base seed + repeat)."""
    cfg = copy.deepcopy(run.config)
    cfg.train.seed = run.config.train.seed - run.repeat + repeat
    return PlannedRun(point_key(run.key) + f"-r{repeat}", repeat, dict(run.axis_values), cfg)


def plan_more_repeats(
    sweep_dir: Path, planned: list[PlannedRun], width: float, max_repeats: int
) -> tuple[list[PlannedRun], list[str]]:
    """`repeats: auto`: one more repeat for every point whose interval is still too wide (module docstring).

    Returns (runs to add, one line per point on where its intervals stand).
    """
    from scaling.analysis.intervals import group_interval

    index = write_index(sweep_dir, planned)
    points: dict[str, list[PlannedRun]] = {}
    for run in planned:
        points.setdefault(point_key(run.key), []).append(run)
    more, notes = [], []
    for point, runs in points.items():
        rows = index[index["run_key"].isin([r.key for r in runs])] if not index.empty else index
        widths = {}
        for label, statistic in (("throughput", "throughput_samples_per_s"), ("TTA", "tta_mean_s")):
            reached = int(rows["tta_s"].notna().sum()) if "tta_s" in rows.columns else 0
            if rows.empty or (statistic == "tta_mean_s" and reached < 2):
                continue  # fewer than 2 repeats reached the target: TTA has no interval to narrow
            estimate, lo, hi, _ = group_interval(rows, statistic)
            finite = all(math.isfinite(v) for v in (estimate, lo, hi)) and estimate != 0
            widths[label] = (hi - lo) / 2 / abs(estimate) if finite else math.inf
        too_wide = {label: half for label, half in widths.items() if half > width}
        text = ", ".join(
            f"{label} ±{half:.1%}" if math.isfinite(half) else f"{label} no interval" for label, half in widths.items()
        )
        if too_wide and len(runs) < max_repeats:
            more.append(another_repeat(runs[-1], max(r.repeat for r in runs) + 1))
            notes.append(f"{point}: {len(runs)} repeats, {text}: one more")
        elif too_wide:
            notes.append(f"{point}: {len(runs)} repeats (the cap), {text}: wider than ±{width:.0%}")
        else:
            notes.append(f"{point}: {len(runs)} repeats, {text}: within ±{width:.0%}")
    return more, notes


def _sweep_description(data: dict, spec: SweepSpec) -> str:
    return yaml.safe_dump(
        {"base": data, "sweep": {"workers": spec.workers, "repeats": spec.repeats, "axes": spec.axes}}, sort_keys=False
    )


def prepare_sweep_dir(sweep_dir: Path, data: dict, spec: SweepSpec) -> None:
    """Create the sweep directory, or check that it holds this very sweep (resume)."""
    description = _sweep_description(data, spec)
    existing = SweepDir(sweep_dir).spec_path
    if existing.exists():
        if yaml.safe_load(existing.read_text()) != yaml.safe_load(description):
            raise UsageError(f"{sweep_dir} holds a different sweep ({existing.name} differs); choose another --out")
    elif sweep_dir.exists() and any(p.name not in writer_lock.FILES for p in sweep_dir.iterdir()):
        raise UsageError(f"{sweep_dir} exists and is not a sweep directory; choose another --out")
    write_text_atomic(existing, description)


def is_done(run_dir: Path) -> bool:
    return RunDir(run_dir).status() in DONE_STATUSES


def prepare_rerun(run_dir: Path, launcher: str) -> int | None:
    """Make a run that is not done ready to run again; returns the epoch it resumes from, or None.

    A Ray run that left a registered checkpoint (it lost a node and found no room within
    failure.capacity_wait_s, ran out of restarts, or was interrupted) keeps its directory: Ray
    Train finds its own record of the checkpoints there (same RunConfig name and storage path)
    and hands the latest to the new workers, so the run resumes with every epoch before it kept,
    and its attempts record the resume (its time lost runs to the resumed first step). Anything
    else is redone from scratch.
    """
    run = RunDir(run_dir)
    if not run_dir.exists():
        return None
    epoch = run.checkpoint_epoch() if launcher == "ray" else None
    if epoch is None:
        shutil.rmtree(run_dir)
        return None
    run.summary_path.unlink(missing_ok=True)  # the failed attempt's; the resumed run writes its own
    run.error_path.unlink(missing_ok=True)
    return epoch


def write_index(sweep_dir: Path, planned: list[PlannedRun]) -> pd.DataFrame:
    """runs.parquet: one row per run that has a summary (finished or failed)."""
    sweep = SweepDir(sweep_dir)
    rows = []
    for run in planned:
        run_dir = sweep.run(run.key)
        if not run_dir.summary_path.exists():
            continue
        rows.append(summary_row(run_dir.summary(), run.key, run.repeat, run.axis_values))
    return sweep.write_index(rows)


class _EpochWatcher(threading.Thread):
    """Polls the running run's epochs.parquet so the progress line shows epoch and accuracy."""

    def __init__(self, run_dir: Path, update):
        super().__init__(daemon=True)
        self.run_dir, self.update, self.stopped = run_dir, update, threading.Event()

    def run(self):
        while not self.stopped.wait(1.0):
            try:
                epochs = RunDir(self.run_dir).epochs()
            except Exception:  # a file being replaced: try again next tick
                continue
            if not epochs.empty:
                last = epochs.iloc[-1]
                self.update(f"epoch {int(last['epoch'])}, val acc {last['val_accuracy']:.3f}")


def run_sweep(sweep_dir: Path, planned: list[PlannedRun], launcher: str, console) -> pd.DataFrame:
    """Run every planned run not yet done; returns the index (runs.parquet). The caller has
    preflighted the runs (`scaling.launch.preflight.preflight_sweep`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from scaling.launch.run import execute_run

    sweep = SweepDir(sweep_dir)
    todo = [run for run in planned if not is_done(sweep.run(run.key).path)]
    kept = len(planned) - len(todo)
    if kept:
        console.print(f"resuming: {kept} of {len(planned)} runs already finished, {len(todo)} to run")
    failed = []
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[current]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sweep", total=len(planned), completed=kept, current="")
        for run in todo:
            run_dir = sweep.run(run.key).path
            resume_epoch = prepare_rerun(run_dir, launcher)
            if resume_epoch is not None:
                progress.console.print(f"run {run.key}: resuming from its epoch {resume_epoch} checkpoint")
            progress.update(task, current=f"{run.key}: starting")
            watcher = _EpochWatcher(run_dir, lambda text, key=run.key: progress.update(task, current=f"{key}: {text}"))
            watcher.start()
            try:
                summary = execute_run(run.config, run_dir, launcher=launcher, preflighted=True)
            finally:
                watcher.stopped.set()
                write_index(sweep_dir, planned)
            if summary["status"] == "failed":
                failed.append(run.key)
                progress.console.print(f"[red]run {run.key} failed:[/red] {summary['error']}")
            else:
                tta = f"TTA {summary['tta_s']:.1f} s" if summary["tta_s"] is not None else "target not reached"
                epoch = summary["time_per_epoch_s"]
                per_epoch = f"{epoch:.2f} s/epoch" if epoch is not None else "time per epoch not measured"
                progress.console.print(f"run {run.key}: {summary['status']}, {tta}, {per_epoch}")
            progress.update(task, advance=1, current="")
    index = write_index(sweep_dir, planned)
    if failed:
        console.print(
            f"[red]{len(failed)} run(s) failed[/red]: {', '.join(failed)} (re-run the same command to redo them)"
        )
    return index
