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
