"""The run and sweep directories: every file name, the readers, and atomic writes; nothing else.

Every name a results directory uses is defined here, once (schema in docs/results.md); the
launchers and the instrument write under these names, and the run's finish, the report, the
sweep, the projection's callers, the notebooks and the benchmarks read through `RunDir` and
`SweepDir`. What the records mean is analysis' (scaling/analysis/), and which runs a figure
leaves out too (`scaling_tables.left_out_of_figures`): this module only reads and writes.

    run = RunDir("results/qs/runs/w2-r0")
    run.summary(); run.epochs(); run.steps(["rank", "step_s"]); run.config
    sweep = SweepDir.resolve("results/qs")          # also under $SCALING_RESULTS_DIR, the repo root
    sweep.runs; sweep.epochs; sweep.warnings; sweep.incomplete

A run directory holds:
    config.yaml        the resolved config
    summary.json       the run's figures (scaling.analysis.run_metrics.summarize_run), written when
                       the run finishes (scaling/launch/finish.py `write_summary`)
    epochs.parquet     one row per epoch
    evals.parquet      one row per validation
    steps.parquet/     one row per (rank, step), training and calibration steps: a directory of
                       parts, one per (rank, epoch), `rank00003-epoch00012.parquet`, each written by
                       its rank (scaling/instrument/recorder.py). `pandas.read_parquet` reads the
                       directory whole; `step_batches` reads it by column, in batches, for figures
                       that only aggregate (a 1,024-rank run's records never need to fit in memory).
    telemetry.parquet/ the same layout, GPU runs with NVML
    ranks.parquet      per rank, who waits for whom; trace.json, a sample of steps (Chrome trace),
                       merged from trace/, each rank's sampled events per epoch
    ray_train/         Ray Train's run state: its checkpoints and the record of them (`checkpoint_epoch`)
    machine.json, compute_profile.json, attempts.json, job.json, workers/, error.txt,
    dawnbench.tsv, dawnbench.json, mlperf.log (scaling/launch/exports.py)

A sweep directory holds `sweep.yaml`, `runs/<run key>/` (one run directory each), `runs.parquet`
(the index: one flattened summary row per run, `summary_row`) and, once reported, `report/`.

Every results file is written to a temporary name in the same folder and renamed into place
(`os.replace` is atomic on POSIX), so a crash never leaves a half-written file.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scaling import writer_lock
from scaling.errors import UsageError

# Version 4 (this one): the summary's `not_measured` (figure -> why it is null: nothing was
# observed for it), and a figure nothing measured is null, never 0 (a 1-worker run without steps
# said A/B overhead 0 in version 3). Version 3 made steps.parquet and telemetry.parquet
# directories of per-rank parts, and added evals.parquet and job.json. Version 2 added per-epoch
# top-1/top-5 and first_step_unix, FLOPs/MFU, restarts and link bandwidth to the summary.
# Versions 1 to 3 are still read (missing figures are null, a missing `not_measured` is empty; a
# single-file steps.parquet reads like a directory of one part).
SCHEMA_VERSION = 4
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
PARQUET_VERSION_KEY = b"scaling.schema_version"  # key in every Parquet file's metadata

# Where relative result paths live: a relative --out is taken under it (scaling.launch.run.resolve_out;
# inside `ray job submit` the working directory is a temporary copy), and a sweep path is looked up there.
RESULTS_ROOT_ENV = "SCALING_RESULTS_DIR"

# ---------------------------------------------------------------------------- file names

# a run directory
CONFIG_YAML = "config.yaml"
SUMMARY_JSON = "summary.json"
EPOCHS_PARQUET = "epochs.parquet"
EVALS_PARQUET = "evals.parquet"
STEPS_PARQUET = "steps.parquet"  # a directory of per-rank parts (rank_part_path)
TELEMETRY_PARQUET = "telemetry.parquet"  # the same layout
COLLECTIVES_PARQUET = "collectives.parquet"  # the same layout: a sharded job's every all-gather and reduce-scatter
MACHINE_JSON = "machine.json"
COMPUTE_PROFILE_JSON = "compute_profile.json"
ATTEMPTS_JSON = "attempts.json"
JOB_JSON = "job.json"
ERROR_TXT = "error.txt"
WORKERS_DIR = "workers"  # rank<R>.json per rank: its process; rank<R>-<name>.json: its own small records
DAWNBENCH_TSV = "dawnbench.tsv"
DAWNBENCH_JSON = "dawnbench.json"
MLPERF_LOG = "mlperf.log"
BUCKETS_PARQUET = "buckets.parquet"  # per-bucket ready times, read by the projection if a run has them
RANKS_PARQUET = "ranks.parquet"  # per rank: who waits for whom (scaling.analysis.run_metrics)
TRACE_JSON = "trace.json"  # a sample of steps, all ranks, Chrome trace format (scaling/instrument/trace.py)
TRACE_PARTS_DIR = "trace"  # each rank's sampled events per epoch, merged into trace.json when the run finishes
HOROVOD_TIMELINE_JSON = "horovod_timeline.json"  # Horovod's own timeline, Horovod runs
RAY_TRAIN_DIR = "ray_train"  # Ray Train's own run state: RunConfig(name=RAY_TRAIN_DIR, storage_path=<run dir>)
# inside it, Ray Train's controller's record of the checkpoints it registered (the latest is what a restart gets)
CHECKPOINT_SNAPSHOT_JSON = "checkpoint_manager_snapshot.json"
# a sweep directory
SWEEP_YAML = "sweep.yaml"
RUNS_PARQUET = "runs.parquet"
RUNS_DIR = "runs"
REPORT_DIR = "report"


def write_atomic(path: Path, write) -> None:
    """`write(tmp)` writes the file at a temporary name in `path`'s folder, which is then renamed
    to `path` (module docstring); a failure leaves `path` as it was and no temporary file."""
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
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))


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

    write_atomic(path, write)


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


def part_rank(part: Path) -> int:
    return int(Path(part).stem.split("-epoch", 1)[0].removeprefix("rank"))


def read_table(path: Path) -> pd.DataFrame:
    """A whole table: a file, a directory of parts, or empty when absent (e.g. step timing off)."""
    path = Path(path)
    if path.is_dir() and not rank_parts(path):
        return pd.DataFrame()
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def worker_record_path(run_dir: Path, rank: int) -> Path:
    """One rank's process record (its pid, host), written when the rank starts."""
    return Path(run_dir) / WORKERS_DIR / f"rank{rank}.json"


def rank_record_path(run_dir: Path, rank: int, name: str) -> Path:
    """One rank's own small record `name` (e.g. its clock offset: "clock")."""
    return Path(run_dir) / WORKERS_DIR / f"rank{rank}-{name}.json"


def trace_part_path(run_dir: Path, rank: int, epoch: int) -> Path:
    """One rank's sampled trace events of one epoch (scaling/instrument/trace.py)."""
    return Path(run_dir) / TRACE_PARTS_DIR / f"rank{rank:05d}-epoch{epoch:05d}.json"


def _read_columns(path: Path, columns: list[str] | None) -> pd.DataFrame:
    if columns is None:
        return read_table(path)
    if not path.exists() or (path.is_dir() and not rank_parts(path)):
        return pd.DataFrame(columns=columns)
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(path), format="parquet")
    return dataset.to_table(columns=[c for c in columns if c in dataset.schema.names]).to_pandas()


def step_batches(run_dir: Path, columns: list[str], batch_rows: int = 1 << 18):
    """steps.parquet's `columns` (those present), as DataFrames of about `batch_rows` rows: memory bounded by a batch.

    Parts (one per rank and epoch: a few hundred rows each) are read a group at a time and
    coalesced into batches of about `batch_rows` rows before they become DataFrames, and each
    group's readers are dropped before the next: neither the rows nor per-file metadata pile up
    with 10^5 parts (bench/records_scale.py). A single-file steps.parquet (schema 1-2) is read
    in row groups.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(run_dir) / STEPS_PARQUET
    if path.is_file():
        reader = pq.ParquetFile(path)
        present = [c for c in columns if c in reader.schema_arrow.names]
        for batch in reader.iter_batches(batch_size=batch_rows, columns=present):
            yield batch.to_pandas()
        return
    parts = rank_parts(path)
    if not parts:
        return
    pending, rows = [], 0
    for part in parts:
        # each part's own columns: an elastic run's parts from a 1-worker attempt lack the
        # cross-rank ones (straggler_rank, ...), which the concatenation fills with nulls
        reader = pq.ParquetFile(part)
        table = reader.read(columns=[c for c in columns if c in reader.schema_arrow.names])
        pending.append(table)
        rows += table.num_rows
        if rows >= batch_rows:
            yield pa.concat_tables(pending, promote_options="permissive").to_pandas()
            pending, rows = [], 0
    if pending:
        # permissive: a count column is int64 in a part whose steps were all timed and double (NaN on the
        # untimed steps) in another (instrument.collective_timing_every); parts written before the recorder
        # wrote counts as floats may differ so
        yield pa.concat_tables(pending, promote_options="permissive").to_pandas()


def _read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


class RunDir:
    """One run directory: where each of its files is, and readers for them.

    A reader of an absent file gives an empty table (tables) or None (JSON records); `summary()`
    raises, as a run without a summary is not finished (OSError, or ValueError when unreadable).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    __str__ = __fspath__  # a path wherever a string is made of it

    @property
    def name(self) -> str:
        """The directory's name (a sweep's run key, `w2-r0`)."""
        return self.path.name

    # where each file is
    config_path = property(lambda self: self.path / CONFIG_YAML)
    summary_path = property(lambda self: self.path / SUMMARY_JSON)
    epochs_path = property(lambda self: self.path / EPOCHS_PARQUET)
    evals_path = property(lambda self: self.path / EVALS_PARQUET)
    steps_path = property(lambda self: self.path / STEPS_PARQUET)
    telemetry_path = property(lambda self: self.path / TELEMETRY_PARQUET)
    collectives_path = property(lambda self: self.path / COLLECTIVES_PARQUET)
    machine_path = property(lambda self: self.path / MACHINE_JSON)
    compute_profile_path = property(lambda self: self.path / COMPUTE_PROFILE_JSON)
    attempts_path = property(lambda self: self.path / ATTEMPTS_JSON)
    job_path = property(lambda self: self.path / JOB_JSON)
    error_path = property(lambda self: self.path / ERROR_TXT)
    buckets_path = property(lambda self: self.path / BUCKETS_PARQUET)
    ranks_path = property(lambda self: self.path / RANKS_PARQUET)
    trace_path = property(lambda self: self.path / TRACE_JSON)

    @property
    def has_summary(self) -> bool:
        """Whether summary.json is there: the run finished (done or failed); asks without reading it."""
        return self.summary_path.is_file()

    def summary(self) -> dict:
        """summary.json as a dict: the run's status, its headline figures and their intervals, the
        hardware and the config it ran (every key: docs/results.md, "summary.json").

        Raises OSError when the run has no summary (still going, or interrupted) and ValueError
        when the file is unreadable; `status()` and `has_summary` ask without raising.
        """
        return _read_json(self.summary_path)

    def status(self) -> str | None:
        """The summary's status; None without a readable summary (a run still going, or interrupted)."""
        try:
            return self.summary()["status"]
        except (OSError, ValueError, KeyError):
            return None

    @property
    def config(self) -> dict:
        """The resolved config.yaml as a dict ({} if absent or unreadable)."""
        import yaml

        try:
            data = yaml.safe_load(self.config_path.read_text())
        except (OSError, yaml.YAMLError):
            return {}
        return data if isinstance(data, dict) else {}

    def epochs(self) -> pd.DataFrame:
        """epochs.parquet: one row per finished epoch (written by rank 0; `epoch` 1-based), with its training
        time, losses and validation figures, throughput and peak memory (every column: docs/results.md,
        "epochs.parquet"); an empty DataFrame when the run finished no epoch."""
        return pd.read_parquet(self.epochs_path) if self.epochs_path.exists() else pd.DataFrame()

    def evals(self) -> pd.DataFrame:
        """evals.parquet: one row per validation, end of epoch or inside one (`epoch`, `epoch_progress`,
        `step`, the training time and the metrics at that point: docs/results.md); TTA is read from it.
        An empty DataFrame for runs recorded before schema 3 or without validation."""
        return pd.read_parquet(self.evals_path) if self.evals_path.exists() else pd.DataFrame()

    def steps(self, columns: list[str] | None = None) -> pd.DataFrame:
        """Every step record (or only `columns`, those present); empty when there are none."""
        return _read_columns(self.steps_path, columns)

    def step_batches(self, columns: list[str], batch_rows: int = 1 << 18):
        """steps.parquet's `columns` as DataFrames of about `batch_rows` rows: memory bounded by a batch
        (the module's `step_batches`)."""
        return step_batches(self.path, columns, batch_rows)

    def telemetry(self, columns: list[str] | None = None) -> pd.DataFrame:
        """telemetry.parquet (or only `columns`, those present): one row per (rank, NVML sample) of a GPU
        run; empty without NVML."""
        return _read_columns(self.telemetry_path, columns)

    def collectives(self, columns: list[str] | None = None) -> pd.DataFrame:
        """A sharded job's every all-gather and reduce-scatter (one row each); empty for other backends."""
        return _read_columns(self.collectives_path, columns)

    def ranks(self) -> pd.DataFrame:
        """ranks.parquet: one row per rank, who waits for whom (written when the run finishes); empty before."""
        return pd.read_parquet(self.ranks_path) if self.ranks_path.exists() else pd.DataFrame()

    def _json(self, path: Path) -> dict | None:
        return _read_json(path) if path.exists() else None

    def compute_profile(self) -> dict | None:
        """compute_profile.json: training FLOPs and bytes per sample and the device's peaks; None if absent."""
        return self._json(self.compute_profile_path)

    def attempts(self) -> list[dict] | None:
        """attempts.json's attempts (start, restart, resume), in order; None if absent."""
        record = self._json(self.attempts_path)
        return record["attempts"] if record is not None else None

    def machine(self) -> dict | None:
        """machine.json: rank 0's hardware; None if absent."""
        return self._json(self.machine_path)

    def checkpoint_epoch(self) -> int | None:
        """The epoch of the latest checkpoint Ray Train's controller registered for this run (the one a
        restart, or a resumed run, is handed); None before any, or for a run without Ray checkpoints.

        Read from the controller's own record: a checkpoint directory on disk alone may not be
        registered yet, and a run restarted before registration starts from scratch."""
        path = self.path / RAY_TRAIN_DIR / CHECKPOINT_SNAPSHOT_JSON
        try:
            latest = json.loads(path.read_text())["latest_checkpoint_result"]
        except (OSError, ValueError, KeyError):  # not there yet, or being rewritten in place this instant
            return None
        return int(latest["metrics"]["epoch"]) if latest else None

    def job(self) -> dict | None:
        """job.json: what the instrument saw of the job (model class, backend, precision, batch); None if absent."""
        return self._json(self.job_path)

    def buckets(self) -> pd.DataFrame:
        """buckets.parquet, one row per (rank, step, bucket), where a run has one; empty otherwise."""
        return pd.read_parquet(self.buckets_path) if self.buckets_path.is_file() else pd.DataFrame()

    def rank_records(self, name: str) -> list[dict]:
        """Every rank's record `name` (`rank_record_path`), by rank; [] when none was written."""
        workers = self.path / WORKERS_DIR
        paths = (
            sorted(workers.glob(f"rank*-{name}.json"), key=lambda p: int(p.name[4:].split("-", 1)[0]))
            if workers.is_dir()
            else []
        )
        return [_read_json(p) for p in paths]

    def trace_parts(self) -> list[Path]:
        """The ranks' sampled trace events, one file per (rank, epoch), in name order."""
        parts = self.path / TRACE_PARTS_DIR
        return sorted(parts.glob("rank*-epoch*.json")) if parts.is_dir() else []


# ---------------------------------------------------------------------------- a sweep's runs


def run_key(num_workers: int, axis_values: dict, repeat: int) -> str:
    """A sweep run's name: `w<workers>[-<axis><value>...]-r<repeat>`, an axis by its last dotted part."""
    axes = "".join(f"-{key.split('.')[-1]}{value}" for key, value in axis_values.items())
    return f"w{num_workers}{axes}-r{repeat}"


def point_key(key: str) -> str:
    """The run key without its repeat: the sweep point the run repeats."""
    return key.rsplit("-r", 1)[0]


def key_repeat(key: str) -> int | None:
    """The repeat a run key ends in (`-r<repeat>`); None for a key that does not."""
    match = re.search(r"-r(\d+)$", key)
    return int(match.group(1)) if match else None


def summary_row(summary: dict, key: str, repeat: int | None, axis_values: dict | None = None) -> dict:
    """A run's row of the sweep index: its summary flattened (`hardware.cpu_model`, ...), plus
    run_key, run_dir (relative to the sweep), repeat and one `sweep.<dotted key>` column per axis."""
    row = pd.json_normalize(summary, sep=".").iloc[0].to_dict()
    row.update(run_key=key, run_dir=f"{RUNS_DIR}/{key}", repeat=repeat)
    row.update({f"sweep.{k}": v for k, v in (axis_values or {}).items()})
    return row


# Columns of a run copied onto each of its epochs (the keys the accuracy curves may group by).
EPOCH_KEYS = ("run_key", "num_workers", "seed", "global_batch", "repeat", "status", "backend", "num_nodes")
_RUN_POSITION = "__run_position"


@dataclass
class Sweep:
    """What a sweep directory (or several, merged) holds for analysis.

    runs: one row per run with a summary (runs.parquet, or built from runs/*/summary.json).
    epochs: epochs.parquet rows of those runs plus run_id, run_key, num_workers, seed,
    global_batch, repeat, status, backend, num_nodes and the sweep.* columns.
    warnings: what was left out, and why; incomplete: run directories without a summary yet.
    """

    runs: pd.DataFrame
    epochs: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)


def resolve_sweep_dir(path: str | os.PathLike) -> Path:
    """A sweep path as typed by a person: absolute, or relative to the working directory, to
    $SCALING_RESULTS_DIR, or to the repository root (a notebook runs in notebooks/); the first
    that exists. Unchanged if none does (reading it then says so)."""
    path = Path(path)
    if path.is_absolute():
        return path
    roots = [Path.cwd()]
    if os.environ.get(RESULTS_ROOT_ENV):
        roots.append(Path(os.environ[RESULTS_ROOT_ENV]))
    roots.append(Path(__file__).resolve().parent.parent)  # the repository root of an editable install
    for root in roots:
        if (root / path).exists():
            return root / path
    return path


class SweepDir:
    """One sweep directory (made by `scaling sweep`): where its files are, and its runs read for analysis.

    `runs`, `epochs`, `warnings` and `incomplete` are read once, on first use (`read()` reads
    anew); reading raises UsageError, in one line, when the directory is missing, empty or not a sweep.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @classmethod
    def resolve(cls, path: str | os.PathLike) -> "SweepDir":
        """A sweep path as typed by a person (`resolve_sweep_dir`)."""
        return cls(resolve_sweep_dir(path))

    def __repr__(self) -> str:
        return f"SweepDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    __str__ = __fspath__  # a path wherever a string is made of it

    spec_path = property(lambda self: self.path / SWEEP_YAML)
    index_path = property(lambda self: self.path / RUNS_PARQUET)
    runs_path = property(lambda self: self.path / RUNS_DIR)
    report_path = property(lambda self: self.path / REPORT_DIR)

    def run(self, key: str) -> RunDir:
        """The run directory of run key `key` (`w2-r0`), whether or not it exists."""
        return RunDir(self.runs_path / key)

    def run_dirs(self) -> list[RunDir]:
        """Every run directory, finished or not, by name."""
        if not self.runs_path.is_dir():
            return []
        return [RunDir(p) for p in sorted(self.runs_path.iterdir()) if p.is_dir()]

    def epochs_to_target(self) -> dict[int, float]:
        """Per global batch, the median `epochs_to_target` of the sweep's runs that reached their target
        (scaling/analysis/run_metrics.py defines it); {} where none did. The projection's measured points."""
        runs = self.read().runs
        if runs.empty or not {"global_batch", "epochs_to_target"} <= set(runs.columns):
            return {}
        reached = runs[runs["epochs_to_target"].notna() & runs["global_batch"].notna()]
        medians = reached.groupby(reached["global_batch"].astype(int))["epochs_to_target"].median()
        return {int(batch): float(epochs) for batch, epochs in medians.items()}

    def write_index(self, rows: list[dict]) -> pd.DataFrame:
        """runs.parquet from `summary_row` rows; returns it."""
        index = pd.DataFrame(rows)
        write_parquet_atomic(self.index_path, index)
        return index

    def read(self) -> Sweep:
        """The sweep read anew (`Sweep`: runs, epochs, warnings, incomplete); UsageError when it is not a sweep."""
        return _read_sweep(self.path)

    @functools.cached_property
    def _contents(self) -> Sweep:
        return self.read()

    runs = property(lambda self: self._contents.runs, doc="One row per run with a summary (`Sweep.runs`).")
    epochs = property(lambda self: self._contents.epochs, doc="Those runs' epochs (`Sweep.epochs`).")
    warnings = property(lambda self: self._contents.warnings, doc="What was left out of the reading, and why.")
    incomplete = property(lambda self: self._contents.incomplete, doc="Run directories without a summary yet.")


def read_sweeps(sweep_dirs) -> Sweep:
    """One sweep directory, or a list of them merged (`_merge`: run keys become `<sweep>/<run key>`
    and a `sweep` column names the directory)."""
    if isinstance(sweep_dirs, (list, tuple)):
        sweep_dirs = [Path(d) for d in sweep_dirs]
        return SweepDir(sweep_dirs[0]).read() if len(sweep_dirs) == 1 else _merge(sweep_dirs)
    return SweepDir(sweep_dirs).read()


def _read_sweep(sweep_dir: Path) -> Sweep:
    if not sweep_dir.exists():
        raise UsageError(f"sweep directory not found: {sweep_dir}")
    if not sweep_dir.is_dir():
        raise UsageError(f"{sweep_dir} is not a directory; give a sweep directory (made by scaling sweep)")
    if not any(sweep_dir.iterdir()):
        raise UsageError(
            f"{sweep_dir} is empty: no sweep to report (make one with: scaling sweep CONFIG --out {sweep_dir})"
        )
    sweep = SweepDir(sweep_dir)
    index_path = sweep.index_path
    run_dirs = sweep.run_dirs()
    with_summary = [run for run in run_dirs if run.has_summary]
    in_summaries = f"{RUNS_DIR}/*/{SUMMARY_JSON}"
    if not index_path.exists() and not with_summary:
        if (sweep_dir / SUMMARY_JSON).exists():
            raise UsageError(f"{sweep_dir} is a run directory, not a sweep (no {RUNS_PARQUET}, no {in_summaries})")
        if sweep.spec_path.exists():
            raise UsageError(f"{sweep_dir}: no run of this sweep has finished yet (no {in_summaries})")
        raise UsageError(f"{sweep_dir} is not a sweep directory: no {RUNS_PARQUET} and no {in_summaries}")

    warnings: list[str] = []
    runs = pd.DataFrame()
    if index_path.exists():
        try:
            runs = pd.read_parquet(index_path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            warnings.append(
                f"{RUNS_PARQUET} is unreadable ({type(exc).__name__}); the run table was built from {in_summaries}"
            )
    if runs.empty:
        runs = _runs_from_summaries(with_summary, sweep_dir, warnings)
        if index_path.exists() and not runs.empty:
            warnings.append(f"{RUNS_PARQUET} lists no runs; the run table was built from {len(runs)} {in_summaries}")
        elif not runs.empty:
            warnings.append(
                f"no {RUNS_PARQUET} (interrupted sweep?); the run table was built from {len(runs)} "
                f"{in_summaries}, without the sweep axes"
            )
    if runs.empty:
        raise UsageError(f"{sweep_dir}: no run of this sweep has finished yet")
    if "run_key" not in runs.columns:
        runs["run_key"] = runs["run_id"] if "run_id" in runs.columns else [f"run{i}" for i in range(len(runs))]
    if "run_dir" not in runs.columns:
        runs["run_dir"] = f"{RUNS_DIR}/" + runs["run_key"].astype(str)
    if "status" not in runs.columns:
        runs["status"] = "failed"
    runs = _readable_versions(runs, warnings)

    listed = set(runs["run_key"].astype(str))
    incomplete = [run.name for run in run_dirs if not run.has_summary and run.name not in listed]
    writing = writer_lock.holder(sweep_dir)
    if writing is not None:
        warnings.append(
            f"the sweep is being written ({writer_lock.describe(writing)}): {len(listed)} finished runs read, "
            f"{len(incomplete)} without a summary yet (running or to run) left out"
        )
    elif incomplete:
        warnings.append(f"incomplete runs (no {SUMMARY_JSON} yet), left out: {', '.join(incomplete)}")
    unlisted = [run.name for run in with_summary if run.name not in listed]
    if unlisted:
        warnings.append(
            f"runs with a {SUMMARY_JSON} that {RUNS_PARQUET} does not list yet, left out: {', '.join(unlisted)}"
        )

    epochs, corrupt = _read_epochs(sweep_dir, runs, warnings)
    if corrupt:
        runs = runs[~runs["run_key"].astype(str).isin(corrupt)]
        if runs.empty:
            raise UsageError(f"{sweep_dir}: every run's records are unreadable ({', '.join(corrupt)})")
    return Sweep(runs.reset_index(drop=True), epochs, warnings, incomplete)


def _merge(sweep_dirs: list[Path]) -> Sweep:
    """Several sweeps as one: runs and epochs concatenated, each run's key prefixed with its sweep.

    The column `sweep` names the directory each run came from. It becomes a group key (its own
    series in every table and figure) only where the other keys do not already tell the sweeps
    apart (scaling.analysis.scaling_tables.group_keys): a DDP sweep and a `--set backend=horovod`
    sweep differ by `backend` already.
    """
    labels = [d.name or str(d) for d in sweep_dirs]
    if len(set(labels)) < len(labels):
        labels = [str(d) for d in sweep_dirs]
    if len(set(labels)) < len(labels):
        raise UsageError(f"the same sweep directory is given twice: {' '.join(map(str, sweep_dirs))}")
    runs, epochs, warnings, incomplete = [], [], [], []
    for label, sweep_dir in zip(labels, sweep_dirs):
        sweep = _read_sweep(sweep_dir)
        prefix = f"{label}/"
        runs.append(
            sweep.runs.assign(
                run_key=prefix + sweep.runs["run_key"].astype(str),
                run_dir=[str(sweep_dir / d) for d in sweep.runs["run_dir"].astype(str)],
                sweep=label,
            )
        )
        if not sweep.epochs.empty:
            epochs.append(sweep.epochs.assign(run_key=prefix + sweep.epochs["run_key"].astype(str), sweep=label))
        warnings += [f"{label}: {w}" for w in sweep.warnings]
        incomplete += [prefix + name for name in sweep.incomplete]
    merged = pd.concat(runs, ignore_index=True)
    merged_epochs = pd.concat(epochs, ignore_index=True) if epochs else sweep.epochs
    return Sweep(merged, merged_epochs, warnings, incomplete)


def _readable_versions(runs: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Keep runs whose schema version this lab reads; name the others (READABLE_SCHEMA_VERSIONS)."""
    if "schema_version" not in runs.columns:
        warnings.append("runs without a schema_version: read as version 1")
        return runs
    version = pd.to_numeric(runs["schema_version"], errors="coerce")
    unreadable = runs[~version.isin(READABLE_SCHEMA_VERSIONS)]
    if unreadable.empty:
        return runs
    named = ", ".join(f"{row.run_key} (schema_version {row.schema_version})" for row in unreadable.itertuples())
    readable = ", ".join(str(v) for v in READABLE_SCHEMA_VERSIONS)
    if len(unreadable) == len(runs):
        raise UsageError(
            f"no run here has a schema version this lab reads ({readable}): {named}; "
            "report them with the version of the lab that wrote them"
        )
    warnings.append(f"runs of a schema version this lab cannot read (reads {readable}), left out: {named}")
    return runs[version.isin(READABLE_SCHEMA_VERSIONS)]


def _runs_from_summaries(run_dirs: list[RunDir], sweep_dir: Path, warnings: list[str]) -> pd.DataFrame:
    rows = []
    for run in run_dirs:
        try:
            summary = run.summary()
        except (OSError, ValueError) as exc:
            warnings.append(f"unreadable {SUMMARY_JSON} in {run.path.relative_to(sweep_dir)}, left out: {exc}")
            continue
        rows.append(summary_row(summary, run.name, key_repeat(run.name)))  # the sweep's run keys end in -r<repeat>
    return pd.DataFrame(rows)


def _read_epochs(sweep_dir: Path, runs: pd.DataFrame, warnings: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Every run's epochs with its keys, and the runs whose epochs.parquet is unreadable (named in a warning).

    Each file is read with pyarrow and the tables are joined once: a pandas read plus a column
    assign per run took 1.5 s of a 200-run report (bench/analysis_speed.py).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = [c for c in EPOCH_KEYS if c in runs.columns] + [c for c in runs.columns if c.startswith("sweep.")]
    runs = runs.reset_index(drop=True)
    tables, missing, corrupt = [], [], []
    for position, (key, run_dir, status) in enumerate(
        zip(runs["run_key"].astype(str), runs["run_dir"].astype(str), runs["status"])
    ):
        path = RunDir(sweep_dir / run_dir).epochs_path
        if not path.is_file():
            if status != "failed":
                missing.append(key)
            continue
        try:
            table = pq.ParquetFile(path).read()
        except Exception as exc:  # a damaged file: name the run and report the rest
            corrupt.append(key)
            warnings.append(f"run {key}: unreadable {path.name} ({type(exc).__name__}), left out")
            continue
        if table.num_rows:
            tables.append(table.append_column(_RUN_POSITION, pa.array([position] * table.num_rows, pa.int64())))
    if missing:
        warnings.append(f"runs without {EPOCHS_PARQUET} (no accuracy curve): {', '.join(missing)}")
    if not tables:
        return pd.DataFrame(columns=["run_id", *keys, "epoch", "val_accuracy"]), corrupt
    epochs = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    run_ids = runs["run_id"] if "run_id" in runs.columns else runs["run_key"]
    run_ids = run_ids.where(run_ids.map(lambda v: isinstance(v, str)), runs["run_key"])
    per_run = runs[keys].assign(run_id=run_ids)[["run_id", *keys]]
    epochs = epochs.drop(columns=[c for c in per_run.columns if c in epochs.columns])
    epochs = epochs.join(per_run, on=_RUN_POSITION).drop(columns=_RUN_POSITION)
    return epochs, corrupt
