"""The run directory and atomic writes of its files.

Every results file is written to a temporary name in the same folder and renamed into place
(`os.replace` is atomic on POSIX), so a crash never leaves a half-written file.

A run directory holds (schema in docs/results.md):
    config.yaml        the resolved config
    summary.json       the run's figures (scaling.analysis.run_metrics.summarize_run)
    epochs.parquet     one row per epoch
    steps.parquet/     one row per (rank, step), training and calibration steps: a directory of
                       parts, one per (rank, epoch), `rank00003-epoch00012.parquet`, each written by
                       its rank (scaling/instrument/recorder.py). `pandas.read_parquet` reads the
                       directory whole; `step_batches` reads it by column, in batches, for figures
                       that only aggregate (a 1,024-rank run's records never need to fit in memory).
    telemetry.parquet/ the same layout, GPU runs with NVML
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd

# Version 3 (this one): steps.parquet and telemetry.parquet are directories of per-rank parts,
# evals.parquet and job.json are new. Version 2 added per-epoch top-1/top-5 and first_step_unix,
# FLOPs/MFU, restarts and link bandwidth to the summary. Versions 1 and 2 are still read
# (missing figures are null; a single-file steps.parquet reads like a directory of one part).
SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
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


def rank_part_path(table: Path, rank: int, epoch: int) -> Path:
    """One rank's part of a per-rank table (steps.parquet/, telemetry.parquet/) for one epoch."""
    return Path(table) / f"rank{rank:05d}-epoch{epoch:05d}.parquet"


def rank_parts(table: Path, rank: int | None = None) -> list[Path]:
    """The parts of a per-rank table (of one rank, or of all); [] for a missing or single-file table."""
    table = Path(table)
    if not table.is_dir():
        return []
    return sorted(table.glob(f"rank{rank:05d}-epoch*.parquet" if rank is not None else "rank*-epoch*.parquet"))


def part_epoch(part: Path) -> int:
    return int(Path(part).stem.rsplit("-epoch", 1)[1])


def read_table(path: Path) -> pd.DataFrame:
    """A whole table: a file, a directory of parts, or empty when absent (e.g. step timing off)."""
    path = Path(path)
    if path.is_dir() and not rank_parts(path):
        return pd.DataFrame()
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def step_batches(run_dir: Path, columns: list[str], batch_rows: int = 1 << 20):
    """steps.parquet's `columns` (those present), as DataFrames of at most `batch_rows` rows: memory bounded by a batch."""
    import pyarrow.dataset as ds

    path = Path(run_dir) / "steps.parquet"
    if not path.exists() or (path.is_dir() and not rank_parts(path)):
        return
    dataset = ds.dataset(str(path), format="parquet")
    present = [c for c in columns if c in dataset.schema.names]
    for batch in dataset.to_batches(columns=present, batch_size=batch_rows):
        yield batch.to_pandas()


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

    from scaling.analysis.run_metrics import STEP_COLUMNS

    run_dir = Path(run_dir)
    steps = step_batches(run_dir, STEP_COLUMNS)  # by column, in batches: never the whole record set
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
    num_nodes = figures.pop("num_nodes")
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
