"""Where a worker's records go: each rank writes its own, once per epoch, to the run's storage.

The instrument only calls `recorder.step(marks)` and `recorder.end_epoch(epoch_row)`.
`RunRecorder` resolves the step marks (one clock resolve per epoch) and every rank writes
its own step records as one file, `steps.parquet/rank<R>-epoch<E>.parquet` (scaling/results.py:
`steps.parquet` is a directory of parts, read whole by `pandas.read_parquet` or by column
and in aggregate with pyarrow), and its GPU telemetry likewise under `telemetry.parquet/`.
No collective, and nothing of another rank passes through rank 0: its per-epoch cost is the
same at 2 ranks and at 1,024 (bench/records_scale.py). Rank 0 also writes the small per-run
tables, `epochs.parquet` and `evals.parquet`. Every file is written atomically, so a crash
loses at most the epoch in progress. With `run_dir=None` nothing is written (a job the
instrument times without a run directory).

Each step record also carries `model_flops` (samples x training FLOPs per sample, once the
instrument has counted them: `flops_per_sample`) and `achieved_flops_per_s` (model_flops /
step_s, per rank).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scaling.instrument.timing import Clock, StepMarks
from scaling.results import part_epoch, rank_part_path, rank_parts, write_json_atomic, write_parquet_atomic


class RunRecorder:
    def __init__(self, clock: Clock, rank: int, node_rank: int, local_rank: int, run_dir: Path | None):
        self.clock = clock
        self.rank = rank
        self.identity = {"rank": rank, "node_rank": node_rank, "local_rank": local_rank}
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._pending: list[StepMarks] = []
        self.epoch_rows: list[dict] = []
        self.eval_rows: list[dict] = []  # rank 0: every evaluation so far (evals.parquet)
        self.flops_per_sample: float | None = None  # training FLOPs per sample, set by the loop

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the records: the epoch and evaluation rows written so far."""
        return {"epoch_rows": list(self.epoch_rows), "eval_rows": list(self.eval_rows)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: its epochs are kept, anything recorded after it is dropped."""
        self.epoch_rows = list(state["epoch_rows"])
        self.eval_rows = list(state.get("eval_rows", []))
        last_epoch = self.epoch_rows[-1]["epoch"] if self.epoch_rows else 0
        if self.run_dir is None:
            return
        # This rank's files of epochs after the checkpoint (written before the failure) would be duplicates.
        for table in ("steps.parquet", "telemetry.parquet"):
            for part in rank_parts(self.run_dir / table, self.rank):
                if part_epoch(part) > last_epoch:
                    part.unlink()
        if self.rank == 0:
            write_parquet_atomic(self.run_dir / "epochs.parquet", pd.DataFrame(self.epoch_rows))
            if self.eval_rows:
                write_parquet_atomic(self.run_dir / "evals.parquet", pd.DataFrame(self.eval_rows))

    def record_attempt(self, first_step_unix: float, resumed_from: dict | None) -> None:
        """Every rank: its process id (run_dir/workers/rank<R>.json); rank 0: this attempt (attempts.json).

        An attempt is one start of the worker group: the first, and one per restart after a
        failure. `resume_point_unix` is when the checkpoint it resumed from was taken (None on
        the first attempt); the summary derives the restart count and time lost from these.
        """
        if self.run_dir is None:
            return
        import json
        import os
        import socket

        write_json_atomic(self.run_dir / "workers" / f"rank{self.rank}.json",
                          {**self.identity, "pid": os.getpid(), "hostname": socket.gethostname(), "first_step_unix": first_step_unix})
        if self.rank != 0:
            return
        path = self.run_dir / "attempts.json"
        attempts = json.loads(path.read_text())["attempts"] if path.exists() else []
        if attempts and resumed_from is None:
            # A restart with no checkpoint to resume from starts the records afresh.
            for table in ("steps.parquet", "telemetry.parquet"):
                for part in rank_parts(self.run_dir / table):
                    part.unlink()
            (self.run_dir / "epochs.parquet").unlink(missing_ok=True)
            (self.run_dir / "evals.parquet").unlink(missing_ok=True)
        attempts.append({
            "attempt": len(attempts),
            "first_step_unix": first_step_unix,
            "resumed_from_epoch": resumed_from["epoch"] if resumed_from else None,
            "resume_point_unix": resumed_from["saved_unix"] if resumed_from else None,
        })
        write_json_atomic(path, {"attempts": attempts})

    def first_attempt_unix(self) -> float | None:
        """Rank 0: the first attempt's first step, if this run was started before (a restart)."""
        import json

        path = self.run_dir / "attempts.json" if (self.run_dir is not None and self.rank == 0) else None
        if path is None or not path.exists():
            return None
        attempts = json.loads(path.read_text())["attempts"]
        return attempts[0]["first_step_unix"] if attempts else None

    def write_json(self, name: str, data: dict) -> None:
        """Rank 0 writes `name` into the run directory (atomically); other ranks do nothing."""
        if self.rank == 0 and self.run_dir is not None:
            write_json_atomic(self.run_dir / name, data)

    def _resolved(self, marks: StepMarks) -> dict:
        row = {**marks.resolve(self.clock), **self.identity}
        if self.flops_per_sample is not None:
            row["model_flops"] = marks.samples * self.flops_per_sample
            row["achieved_flops_per_s"] = row["model_flops"] / row["step_s"] if row["step_s"] > 0 else float("nan")
        return row

    def step(self, marks: StepMarks) -> None:
        self._pending.append(marks)

    def end_epoch(self, epoch_row: dict, telemetry: list[dict] | None = None, evals: list[dict] | None = None) -> None:
        """Resolve and write this rank's records of the epoch (rank 0: also the epoch's row). Every rank calls it."""
        self.clock.resolve()
        rows = [self._resolved(m) for m in self._pending]
        self._pending = []
        epoch = epoch_row["epoch"]
        if self.run_dir is not None:
            if rows:  # none with instrument.step_timing off
                write_parquet_atomic(rank_part_path(self.run_dir / "steps.parquet", self.rank, epoch), pd.DataFrame(rows))
            if telemetry:
                samples = pd.DataFrame([{**sample, **self.identity} for sample in telemetry])
                write_parquet_atomic(rank_part_path(self.run_dir / "telemetry.parquet", self.rank, epoch), samples)
        if self.rank != 0:
            return
        self.epoch_rows.append(epoch_row)
        self.eval_rows += evals or []
        if self.run_dir is not None:
            if self.eval_rows:
                write_parquet_atomic(self.run_dir / "evals.parquet", pd.DataFrame(self.eval_rows))
            write_parquet_atomic(self.run_dir / "epochs.parquet", pd.DataFrame(self.epoch_rows))
