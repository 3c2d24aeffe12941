"""One run, end to end: run directory, launch, records -> summary.json.

Shared by `scaling run` (and the sweep). The order matters for clean failures: the config
is validated and preflighted (scaling/launch/preflight.py) *before* the run directory exists, so a refused run
leaves nothing behind; once training started, any failure still ends in a `summary.json`
with `status: failed` and the error.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import traceback
from pathlib import Path

from scaling.config import ExperimentConfig
from scaling.errors import UsageError
from scaling.launch.finish import write_summary
from scaling.results import RESULTS_ROOT_ENV, RunDir, write_text_atomic


def resolve_out(out: Path | None, default_name: str) -> Path:
    """Where results go. A relative --out is taken under $SCALING_RESULTS_DIR when that is set:
    inside `ray job submit` the working directory is a temporary copy, so a job names shared
    storage there (docs/running.md, "ray job submit")."""
    out = Path(out) if out is not None else Path("results") / default_name
    root = os.environ.get(RESULTS_ROOT_ENV)
    if root and not out.is_absolute():
        out = Path(root) / out
    return out.absolute()


def default_run_name(cfg: ExperimentConfig) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{cfg.name}-w{cfg.workers.num_workers}-{stamp}"


def check_run_dir(run_dir: Path) -> None:
    """Refuse an output directory that holds a run already or cannot be written."""
    run_dir = Path(run_dir)
    summary = RunDir(run_dir).summary_path
    if summary.exists():
        raise UsageError(f"{run_dir} already holds a run ({summary.name}); choose another --out")
    parent = run_dir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"output directory {run_dir} is not writable (at {parent}); choose another --out")


def apply_link_bandwidth(cfg: ExperimentConfig) -> str | None:
    """Set the minicluster's link cap the run asks for; returns the cap in effect (None: not in a minicluster)."""
    from scaling.testbed import minicluster

    cluster = minicluster.current()
    if cluster is None:
        return None  # the preflight refused a link cap outside a minicluster
    if cfg.workers.link_bandwidth:
        cluster = minicluster.set_bandwidth(cfg.workers.link_bandwidth, cluster.name)
    return cluster.bandwidth or "uncapped"


def execute_run(cfg: ExperimentConfig, run_dir: Path, launcher: str = "ray", preflighted: bool = False) -> dict:
    """Launch `cfg`, then write summary.json from the records, whatever happened.

    The preflight (scaling/launch/preflight.py) runs first unless the caller ran it
    (`preflighted`): a refused run leaves nothing behind."""
    if not preflighted:
        from scaling.launch.preflight import preflight

        for note in preflight(cfg, launcher):
            print(note, flush=True)
    link_bandwidth = apply_link_bandwidth(cfg)
    run = RunDir(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run.config_path, cfg.to_yaml())
    started_at = dt.datetime.now(dt.timezone.utc)
    start = time.perf_counter()
    status, error = None, None
    try:
        if launcher == "ray":
            from scaling.launch.ray_train import run_ray

            run_ray(cfg, run.path)
        else:
            from scaling.launch.local import run_local

            run_local(cfg, run.path)
    except KeyboardInterrupt:
        status, error = "failed", "interrupted"
        _write_summary(cfg, run.path, launcher, status, error, started_at, time.perf_counter() - start, link_bandwidth)
        raise
    except Exception as exc:
        status = "failed"
        error = _one_line_error(exc)
        run.error_path.write_text(traceback.format_exc())
    return _write_summary(
        cfg, run.path, launcher, status, error, started_at, time.perf_counter() - start, link_bandwidth
    )


def _one_line_error(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    # Ray wraps the worker's exception; its last line is usually the original error.
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}".strip()


def run_description(cfg: ExperimentConfig, launcher: str, link_bandwidth: str | None = None) -> dict:
    """What a lab run was (from its config), for summary.json (`scaling.launch.finish.write_summary`)."""
    from scaling.train.backends import for_choice

    backend = for_choice(cfg.backend).describe(cfg)  # `backend` (its records' name) and its own settings
    return {
        "name": cfg.name,
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "train_function": cfg.train.function or None,
        "backend": backend.pop("backend"),
        "launcher": launcher,
        "num_workers": cfg.workers.num_workers,
        # > 0: elastic (workers_first_attempt / workers_last_attempt: what it got)
        "min_workers": cfg.workers.min_workers,
        "per_worker_batch": cfg.train.per_worker_batch,
        "global_batch": cfg.global_batch,
        "seed": cfg.train.seed,
        "target_accuracy": cfg.train.target_accuracy,
        "target_metric": cfg.train.target_metric,
        "target_loss": cfg.train.target_loss if cfg.train.target_metric == "val_loss" else None,
        "eval_every": cfg.train.eval_every,
        "tta_rule": cfg.train.tta_rule,
        "precision": cfg.train.precision,
        "channels_last": cfg.train.channels_last,
        "compile": cfg.train.compile,
        "grad_compression": cfg.instrument.grad_compression,
        **backend,
        "step_timing": cfg.instrument.step_timing,
        "inject_comm_delay_s": cfg.instrument.inject_comm_delay_s,
        # minicluster runs: each node's link cap during the run (a tc rate, or "uncapped")
        "link_bandwidth": link_bandwidth,
        "link_bandwidth_bits_per_s": _bits_per_s(link_bandwidth),
        "node_price_per_hour": cfg.workers.node_price_per_hour,
        "market": cfg.workers.market,
        "cluster": cfg.workers.cluster or None,  # a projection's cluster description (scaling/projection/overlay.py)
    }


def _write_summary(cfg, run_dir, launcher, status, error, started_at, wall_s, link_bandwidth=None) -> dict:
    description = run_description(cfg, launcher, link_bandwidth)
    observed = RunDir(run_dir).job() if cfg.train.function else None
    if observed is not None:
        # A user's train function: its model, precision and A/B set-up are what the instrument saw.
        description.update(
            model=observed["model"],
            dataset="own (train.function)",
            precision=observed["precision"],
            ab_calibration=observed["ab_calibration"],
            data_parallel=observed.get("data_parallel"),  # absent from job.json before 2026-11-29
        )
    return write_summary(run_dir, description, status=status, error=error, started_at=started_at, wall_s=wall_s)


def _bits_per_s(rate: str | None) -> float | None:
    if rate in (None, "uncapped"):
        return None
    from scaling.testbed.minicluster import rate_bits_per_s

    return rate_bits_per_s(rate)
