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

A backend whose steps' rule records each collective (`CommRule.per_collective`: FSDP's
all-gathers and reduce-scatters, scaling/instrument/backends/fsdp.py) has them written the same
way, one row per collective, to `collectives.parquet/rank<R>-epoch<E>.parquet`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scaling.instrument.timing import Clock, StepMarks
from scaling.results import (
    ATTEMPTS_JSON,
    COLLECTIVES_PARQUET,
    EPOCHS_PARQUET,
    EVALS_PARQUET,
    STEPS_PARQUET,
    TELEMETRY_PARQUET,
    part_epoch,
    part_rank,
    rank_part_path,
    rank_parts,
    rank_record_path,
    worker_record_path,
    write_json_atomic,
    write_parquet_atomic,
)


class RunRecorder:
    def __init__(
        self,
        clock: Clock,
        rank: int,
        node_rank: int,
        local_rank: int,
        run_dir: Path | None,
        group=None,
        world_size: int = 1,
        offset_s: float = 0.0,
        trace_steps: range = range(0),
    ):
        """`group` (gloo) and `world_size` > 1: attribute each step's exposed communication across
        ranks (`attribute`); `offset_s`: this rank's clock offset to rank 0 (clock_sync.py);
        `trace_steps`: the global training steps whose events go into the trace (trace.py)."""
        self.clock = clock
        self.rank = rank
        self.group, self.world_size, self.offset_s, self.trace_steps = group, world_size, offset_s, trace_steps
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
        # This rank's files of epochs after the checkpoint (written before the failure) would be duplicates;
        # so would those of ranks the restarted group no longer has (an elastic restart with fewer workers),
        # which rank 0 removes.
        for table in (STEPS_PARQUET, TELEMETRY_PARQUET, COLLECTIVES_PARQUET):
            for part in rank_parts(self.run_dir / table, None if self.rank == 0 else self.rank):
                if part_epoch(part) > last_epoch and (
                    part_rank(part) == self.rank or part_rank(part) >= self.world_size
                ):
                    part.unlink()
        if self.rank == 0:
            write_parquet_atomic(self.run_dir / EPOCHS_PARQUET, pd.DataFrame(self.epoch_rows))
            if self.eval_rows:
                write_parquet_atomic(self.run_dir / EVALS_PARQUET, pd.DataFrame(self.eval_rows))

    def record_attempt(self, first_step_unix: float, resumed_from: dict | None) -> None:
        """Every rank: its process id (run_dir/workers/rank<R>.json); rank 0: this attempt (attempts.json).

        An attempt is one start of the worker group: the first, and one per restart after a
        failure. `resume_point_unix` is when the checkpoint it resumed from was taken (None on
        the first attempt), `num_workers` the group's size; the summary derives the restart count,
        the time lost and the worker counts before and after from these.
        """
        if self.run_dir is None:
            return
        import json
        import os
        import socket

        write_json_atomic(
            worker_record_path(self.run_dir, self.rank),
            {**self.identity, "pid": os.getpid(), "hostname": socket.gethostname(), "first_step_unix": first_step_unix},
        )
        if self.rank != 0:
            return
        path = self.run_dir / ATTEMPTS_JSON
        attempts = json.loads(path.read_text())["attempts"] if path.exists() else []
        if attempts and resumed_from is None:
            # A restart with no checkpoint to resume from starts the records afresh.
            for table in (STEPS_PARQUET, TELEMETRY_PARQUET, COLLECTIVES_PARQUET):
                for part in rank_parts(self.run_dir / table):
                    part.unlink()
            (self.run_dir / EPOCHS_PARQUET).unlink(missing_ok=True)
            (self.run_dir / EVALS_PARQUET).unlink(missing_ok=True)
        attempts.append(
            {
                "attempt": len(attempts),
                "first_step_unix": first_step_unix,
                "resumed_from_epoch": resumed_from["epoch"] if resumed_from else None,
                "resume_point_unix": resumed_from["saved_unix"] if resumed_from else None,
                # the worker group's size in this attempt: an elastic restart may have fewer (or more) workers
                "num_workers": self.world_size,
            }
        )
        write_json_atomic(path, {"attempts": attempts})

    def first_attempt_unix(self) -> float | None:
        """Rank 0: the first attempt's first step, if this run was started before (a restart)."""
        import json

        path = self.run_dir / ATTEMPTS_JSON if (self.run_dir is not None and self.rank == 0) else None
        if path is None or not path.exists():
            return None
        attempts = json.loads(path.read_text())["attempts"]
        return attempts[0]["first_step_unix"] if attempts else None

    def write_rank_json(self, name: str, data: dict) -> None:
        """This rank's own small file, workers/rank<R>-<name>.json (e.g. its clock offset)."""
        if self.run_dir is not None:
            write_json_atomic(rank_record_path(self.run_dir, self.rank, name), data)

    def write_json(self, name: str, data: dict) -> None:
        """Rank 0 writes `name` into the run directory (atomically); other ranks do nothing."""
        if self.rank == 0 and self.run_dir is not None:
            write_json_atomic(self.run_dir / name, data)

    def _resolved(self, marks: StepMarks) -> dict:
        row = {**marks.resolve(self.clock, self.offset_s), **self.identity}
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
        traced = [
            event
            for m in self._pending
            if m.kind == "train" and m.step in self.trace_steps
            for event in m.trace_events(self.clock, self.offset_s, self.rank)
        ]
        collectives = [
            {**row, **self.identity}
            for m in self._pending
            if m.comm_rule is not None and m.comm_rule.per_collective
            for row in m.comm_rule.collective_rows(m, self.clock)
        ]
        self._pending = []
        epoch = epoch_row["epoch"]
        if self.world_size > 1 and self.group is not None:
            epoch_row.update(self.attribute(rows))
            if "peak_memory_bytes" in epoch_row:
                epoch_row.update(self.memory_across_ranks(epoch_row["peak_memory_bytes"]))
        for row in rows:
            row.pop("sync_points", None)  # the attribution's input, not a column
        if self.run_dir is not None:
            if collectives:
                write_parquet_atomic(
                    rank_part_path(self.run_dir / COLLECTIVES_PARQUET, self.rank, epoch), pd.DataFrame(collectives)
                )
            if traced:
                from scaling.instrument.trace import write_rank_events

                write_rank_events(self.run_dir, self.rank, epoch, traced)
            if rows:  # none with instrument.step_timing off
                write_parquet_atomic(rank_part_path(self.run_dir / STEPS_PARQUET, self.rank, epoch), pd.DataFrame(rows))
            if telemetry:
                samples = pd.DataFrame([{**sample, **self.identity} for sample in telemetry])
                write_parquet_atomic(rank_part_path(self.run_dir / TELEMETRY_PARQUET, self.rank, epoch), samples)
        if self.rank != 0:
            return rows
        self.epoch_rows.append(epoch_row)
        self.eval_rows += evals or []
        if self.run_dir is not None:
            if self.eval_rows:
                write_parquet_atomic(self.run_dir / EVALS_PARQUET, pd.DataFrame(self.eval_rows))
            write_parquet_atomic(self.run_dir / EPOCHS_PARQUET, pd.DataFrame(self.epoch_rows))
        return rows

    def memory_across_ranks(self, peak_bytes: float) -> dict:
        """The epoch's peak memory over the ranks (collective): the largest rank's and the smallest's.

        `peak_memory_bytes` in the epoch's row becomes the largest rank's (what a device must hold),
        `peak_memory_min_bytes` the smallest's (an uneven sharding shows as a gap between the two).
        """
        import torch
        import torch.distributed as dist

        both = torch.tensor([peak_bytes, -peak_bytes], dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        return {"peak_memory_bytes": float(both[0]), "peak_memory_min_bytes": float(-both[1])}

    def attribute(self, rows: list[dict]) -> dict:
        """Split each training step's exposed communication into waiting and transfer (collective).

        A step's *sync points* are the collectives every rank runs in the same order, each with
        the moment this rank arrived at it (on rank 0's clock) and how long its compute waited
        there. A DDP or Horovod step has one: its last bucket handed over (`compute_end_t`,
        backward compute done) with the step's `exposed_comm_s`; a sharded job's steps have one
        per all-gather and reduce-scatter (`sync_points`, its rule's: backends/fsdp.py). Every
        rank shares its arrivals with one all-gather of a float tensor (steps x points x ranks
        floats; nothing else crosses ranks). Per step:
        - at each point, this rank waited for the slowest rank min(its wait there, latest
          arrival - its own arrival);
        - `waiting_s` = min(exposed_comm_s, the sum of those): the exposed time spent waiting
          for the slowest rank (no faster network helps it);
        - `transfer_s` = exposed_comm_s - waiting_s: the exposed time once every rank was ready
          (moving bytes: bandwidth and latency);
        - `straggler_rank`: the rank that arrived last at the most points (with one point: the
          rank that handed its last bucket over last; ties: the lowest rank).
        Adds the columns to `rows` in place (and takes the rows' `sync_points` out); returns the
        epoch's straggler (the rank most often last among the steady-state steps) and its share
        of them, for the epoch's row.
        """
        import torch
        import torch.distributed as dist

        for row in rows:
            points = row.pop("sync_points", None)
            if row["kind"] == "train":
                row["_points"] = (
                    points
                    if points is not None
                    else [(row["compute_end_t"], row["exposed_comm_s"])]
                    if row["num_buckets"]
                    else []
                )
        train = [r for r in rows if r["kind"] == "train"]
        shape = torch.tensor([len(train), max((len(r["_points"]) for r in train), default=0)], dtype=torch.float64)
        dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=self.group)
        steps, width = int(shape[0].item()), max(1, int(shape[1].item()))
        arrivals = torch.full((steps, width), float("nan"), dtype=torch.float64)
        for i, row in enumerate(train):
            if row["_points"]:
                arrivals[i, : len(row["_points"])] = torch.tensor(
                    [moment for moment, _ in row["_points"]], dtype=torch.float64
                )
        gathered = [torch.empty_like(arrivals) for _ in range(self.world_size)]
        dist.all_gather(gathered, arrivals, group=self.group)
        matrix = torch.stack(gathered)  # ranks x steps x points
        known = ~torch.isnan(matrix).all(dim=0)
        filled = torch.nan_to_num(matrix, nan=float("-inf"))
        latest = torch.where(known, filled.max(dim=0).values, torch.tensor(float("nan"), dtype=torch.float64))
        last_rank = filled.argmax(dim=0)  # steps x points
        stragglers = []
        for i, row in enumerate(train):
            points = row.pop("_points")
            if row["num_buckets"] == 0:
                # nothing communicated, nothing exposed: zero, so that every figure averages over the same steps
                row.update(waiting_s=0.0, transfer_s=0.0, straggler_rank=-1)
                continue
            usable = [k for k, (moment, _) in enumerate(points) if bool(known[i, k]) and moment == moment]
            if not usable:
                row.update(waiting_s=float("nan"), transfer_s=float("nan"), straggler_rank=-1)
                continue
            waited = sum(min(points[k][1], max(0.0, float(latest[i, k]) - points[k][0])) for k in usable)
            waiting = min(row["exposed_comm_s"], waited)
            straggler = int(torch.bincount(last_rank[i, usable], minlength=self.world_size).argmax())
            row.update(waiting_s=waiting, transfer_s=row["exposed_comm_s"] - waiting, straggler_rank=straggler)
            if not row["warmup"]:
                stragglers.append(straggler)
        if not stragglers:
            return {"straggler_rank": -1, "straggler_share": float("nan")}
        most = max(set(stragglers), key=stragglers.count)
        return {"straggler_rank": most, "straggler_share": stragglers.count(most) / len(stragglers)}
