"""Where a worker's records go: gathered to rank 0 once per epoch and written there.

The training loop only calls `recorder.step(marks)` and `recorder.end_epoch(epoch_row)`;
it never sees files or other ranks. `RunRecorder` resolves the step marks (one clock
resolve per epoch), gathers every rank's step records to rank 0 with one collective per
epoch, and rank 0 writes `parts/steps-epochNNNNN.parquet` and `epochs.parquet` atomically,
so a crash loses at most the epoch in progress. With `run_dir=None` nothing is written (a job
the instrument times without a run directory).

Each step record also carries `model_flops` (samples x training FLOPs per sample, once the
loop has counted them: `flops_per_sample`) and `achieved_flops_per_s` (model_flops / step_s,
per rank). GPU telemetry rows handed to `end_epoch` go the same way into `telemetry.parquet`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch.distributed as dist

from scaling.instrument.timing import Clock, StepMarks
from scaling.results import step_part_path, write_json_atomic, write_parquet_atomic


class RunRecorder:
    def __init__(self, clock: Clock, rank: int, world_size: int, node_rank: int, local_rank: int, run_dir: Path | None):
        self.clock = clock
        self.rank = rank
        self.world_size = world_size
        self.identity = {"rank": rank, "node_rank": node_rank, "local_rank": local_rank}
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._pending: list[StepMarks] = []
        self.epoch_rows: list[dict] = []
        self.telemetry_rows: list[dict] = []  # rank 0: every rank's telemetry samples so far
        self.eval_rows: list[dict] = []  # rank 0: every evaluation so far (evals.parquet)
        self.flops_per_sample: float | None = None  # training FLOPs per sample, set by the loop

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the records: the epoch rows and telemetry written so far."""
        return {"epoch_rows": list(self.epoch_rows), "telemetry_rows": list(self.telemetry_rows),
                "eval_rows": list(self.eval_rows)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: its epochs are kept, anything recorded after it is dropped."""
        self.epoch_rows = list(state["epoch_rows"])
        self.telemetry_rows = list(state["telemetry_rows"])
        self.eval_rows = list(state.get("eval_rows", []))
        last_epoch = self.epoch_rows[-1]["epoch"] if self.epoch_rows else 0
        if self.rank == 0 and self.run_dir is not None:
            # Step files of epochs after the checkpoint (written before the failure) would be duplicates.
            for part in (self.run_dir / "parts").glob("steps-epoch*.parquet"):
                if int(part.stem.removeprefix("steps-epoch")) > last_epoch:
                    part.unlink()
            write_parquet_atomic(self.run_dir / "epochs.parquet", pd.DataFrame(self.epoch_rows))

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
            for part in (self.run_dir / "parts").glob("steps-epoch*.parquet"):
                part.unlink()
            (self.run_dir / "epochs.parquet").unlink(missing_ok=True)
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
        """Resolve, gather and (rank 0) write this epoch's records. Every rank must call it."""
        self.clock.resolve()
        rows = [self._resolved(m) for m in self._pending]
        self._pending = []
        telemetry = [{**sample, **self.identity} for sample in telemetry or []]
        gathered: list | None = [None] * self.world_size if self.rank == 0 else None
        if self.world_size > 1:
            dist.gather_object((rows, telemetry), gathered, dst=0)
        else:
            gathered = [(rows, telemetry)]
        if self.rank != 0:
            return
        steps = pd.DataFrame([row for rank_rows, _ in gathered for row in rank_rows])
        new_telemetry = [sample for _, rank_samples in gathered for sample in rank_samples]
        if new_telemetry:
            self.telemetry_rows += new_telemetry
            if self.run_dir is not None:
                write_parquet_atomic(self.run_dir / "telemetry.parquet", pd.DataFrame(self.telemetry_rows))
        self.epoch_rows.append(epoch_row)
        self.eval_rows += evals or []
        if self.run_dir is not None:
            if self.eval_rows:
                write_parquet_atomic(self.run_dir / "evals.parquet", pd.DataFrame(self.eval_rows))
            if not steps.empty:  # empty with instrument.step_timing off
                write_parquet_atomic(step_part_path(self.run_dir, epoch_row["epoch"]), steps)
            write_parquet_atomic(self.run_dir / "epochs.parquet", pd.DataFrame(self.epoch_rows))
