"""The run directory and atomic writes of its files.

Every results file is written to a temporary name in the same folder and renamed into place
(`os.replace` is atomic on POSIX), so a crash never leaves a half-written file.

A run directory holds (schema in docs/results.md):
    config.yaml        the resolved config
    summary.json       the run's figures (scaling.analysis.run_metrics.summarize_run)
    epochs.parquet     one row per epoch
    steps.parquet      one row per (rank, step), training and calibration steps
    parts/             per-epoch step records while the run is going; merged into steps.parquet
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd

# Version 2 (this one) added per-epoch top-1/top-5 and first_step_unix, FLOPs/MFU, restarts
# and link bandwidth to the summary; version 1 files are still read (missing figures are null).
SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
PARQUET_VERSION_KEY = b"scaling.schema_version"  # key in every Parquet file's metadata


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    _atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=_json_default) + "\n")


def write_parquet_atomic(path: Path, frame: pd.DataFrame) -> None:
    """Write `frame` with the schema version in the file's metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(tmp):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        metadata = {**(table.schema.metadata or {}), PARQUET_VERSION_KEY: str(SCHEMA_VERSION).encode()}
        pq.write_table(table.replace_schema_metadata(metadata), tmp)

    _atomic_write(path, write)


def parquet_schema_version(path: Path) -> int | None:
    """The schema version a Parquet file was written with (None: written before versions were recorded)."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    value = metadata.get(PARQUET_VERSION_KEY)
    return int(value) if value is not None else None


def _json_default(value):
    # numpy scalars and the like
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def step_part_path(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / "parts" / f"steps-epoch{epoch:05d}.parquet"


def merge_step_parts(run_dir: Path) -> pd.DataFrame:
    """Merge per-epoch step files into steps.parquet (atomically) and remove the parts."""
    run_dir = Path(run_dir)
    parts = sorted((run_dir / "parts").glob("steps-epoch*.parquet"))
    if parts:
        steps = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    elif (run_dir / "steps.parquet").exists():
        return pd.read_parquet(run_dir / "steps.parquet")
    else:
        steps = pd.DataFrame()
    write_parquet_atomic(run_dir / "steps.parquet", steps)
    for p in parts:
        p.unlink()
    if (run_dir / "parts").is_dir() and not any((run_dir / "parts").iterdir()):
        (run_dir / "parts").rmdir()
    return steps


def read_epochs(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / "epochs.parquet"
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def write_summary(run_dir: Path, description: dict, *, status: str | None, error: str | None,
                  started_at, wall_s: float) -> dict:
    """Merge the run's step parts, compute its figures and write summary.json (and the exports).

    `description` says what the run was (the lab's: scaling.launch.run.run_description, from
    the config; a job on its own: scaling.instrument.meter.StepMeter.finish); the figures come
    from the records (scaling.analysis.run_metrics.summarize_run). `status` None: reached_target
    or max_epochs, from the records.
    """
    from scaling.analysis.run_metrics import summarize_run
    from scaling.instrument.machine import describe_hardware, describe_versions

    run_dir = Path(run_dir)
    steps = merge_step_parts(run_dir)
    epochs = read_epochs(run_dir)
    profile_path = run_dir / "compute_profile.json"
    profile = _read_json(profile_path) if profile_path.exists() else None
    attempts_path = run_dir / "attempts.json"
    attempts = _read_json(attempts_path)["attempts"] if attempts_path.exists() else None
    evals_path = run_dir / "evals.parquet"
    evals = pd.read_parquet(evals_path) if evals_path.exists() else None
    figures = summarize_run(steps, epochs, description["target_accuracy"], description["num_workers"], profile,
                            attempts, ab_calibration=description.get("ab_calibration", True), evals=evals,
                            tta_rule=description.get("tta_rule", "first_eval"))
    if status is None:
        status = "reached_target" if figures["epochs_to_target"] is not None else "max_epochs"
    machine_path = run_dir / "machine.json"
    hardware = _read_json(machine_path) if machine_path.exists() else describe_hardware()
    num_nodes = int(steps["node_rank"].nunique()) if not steps.empty else None
    summary = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_dir.name,
        **description,
        "num_nodes": num_nodes,
        "workers_per_node": description["num_workers"] / num_nodes if num_nodes else None,
        "status": status,
        "error": error,
        **figures,
        "started_at": started_at.isoformat(timespec="seconds"),
        "run_wall_s": wall_s,
        "versions": describe_versions(),
        "hardware": hardware,
    }
    write_json_atomic(run_dir / "summary.json", summary)
    if not epochs.empty:
        from scaling.exports import write_exports

        write_exports(run_dir, summary, epochs)
    return summary
