"""A Chrome / Perfetto trace of a sample of steps: what each rank did, on one time base.

Each rank writes the trace events of its sampled training steps (the `trace_steps` after the
warm-up: scaling/instrument/meter.py) per epoch (`scaling.results.trace_part_path`), with times
in seconds on rank 0's clock (clock_sync.py). When the run finishes (scaling/launch/finish.py),
`merge_trace` turns them into `trace.json` in the Trace Event Format that Perfetto
(ui.perfetto.dev) and chrome://tracing open: one process per rank, with two tracks (threads):
"phases" (each step, and inside it data | forward | backward | optimizer, which nest in it and
add up to it) and "all-reduce" (each gradient bucket from its hand-over to its completion); a
sharded job (FSDP2) has "all-gather" and "reduce-scatter" tracks instead of the latter, each
collective named by its module and pass. Times are µs from the earliest event.
"""

from __future__ import annotations

import json
from pathlib import Path

from scaling.results import RunDir, trace_part_path, write_json_atomic

TRACKS = {"phases": 0, "all-reduce": 1}  # always named; any other track (a collective kind) follows, by name


def write_rank_events(run_dir: Path, rank: int, epoch: int, events: list[dict]) -> None:
    write_json_atomic(trace_part_path(run_dir, rank, epoch), {"events": events})


def merge_trace(run_dir: Path) -> Path | None:
    """trace.json from every rank's sampled events (module docstring); None when there are none."""
    run = RunDir(run_dir)
    events = []
    for part in run.trace_parts():
        events += json.loads(part.read_text())["events"]
    if not events:
        return None
    origin = min(e["start_s"] for e in events)
    ranks = sorted({e["rank"] for e in events})
    tracks = dict(TRACKS)
    for track in sorted({e["track"] for e in events} - set(TRACKS)):
        tracks[track] = len(tracks)
    trace = []
    for rank in ranks:
        trace.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for track, tid in tracks.items():
            trace.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": track}})
    for e in sorted(events, key=lambda e: (e["rank"], e["start_s"], -e["end_s"])):
        trace.append(
            {
                "ph": "X",
                "name": e["name"],
                "cat": e["cat"],
                "pid": e["rank"],
                "tid": tracks[e["track"]],
                "ts": round((e["start_s"] - origin) * 1e6, 3),
                "dur": round(max(0.0, e["end_s"] - e["start_s"]) * 1e6, 3),
                "args": e["args"],
            }
        )
    path = run.trace_path
    write_json_atomic(
        path,
        {
            "traceEvents": trace,
            "displayTimeUnit": "ms",
            "otherData": {"source": "scaling lab: a sample of training steps, all ranks on rank 0's clock"},
        },
    )
    return path
