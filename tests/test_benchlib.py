"""The benchmarks' step-interleaving bookkeeping (bench/benchlib.py `StepWindows`, `block_means`),
whose windows and block means decide the cost benchmarks' verdicts: a window books the clocks
between two marks, an iterator's closing call adds to its arm's last step, the garbage collector's
time is booked in the window it ran in, and a block's means take wall clock from rank 0 and sum
CPU over the ranks."""

import gc
import time

import pytest

from bench.benchlib import StepWindows, block_means


@pytest.fixture()
def windows():
    booked = StepWindows()
    yield booked
    booked.close()


def test_a_window_books_the_clocks_between_its_marks_and_a_closing_call_joins_the_last_step(windows):
    start = windows.now()
    # CPU work on this thread: its 0.02 s are in the window's process CPU time and, since a thread's
    # CPU time never runs ahead of the wall clock, in its wall time too, whatever other threads do
    deadline = time.thread_time() + 0.02
    while time.thread_time() < deadline:
        pass
    windows.add(1, "a", start, windows.now())
    closing = windows.now()
    time.sleep(0.01)  # wall clock without CPU
    windows.add(1, "a", closing, windows.now(), into_last=True)
    windows.add(1, "b", windows.now(), windows.now())
    assert [(r["block"], r["arm"]) for r in windows.rows] == [(1, "a"), (1, "b")]
    a = windows.rows[0]
    assert a["cpu_s"] >= 0.02 and a["wall_s"] >= 0.03  # the busy loop, then the sleep added into the same step


def test_a_garbage_collection_is_booked_in_the_window_it_ran_in(windows):
    start = windows.now()
    gc.collect()
    windows.add(1, "a", start, windows.now())
    quiet = windows.now()
    windows.add(1, "b", quiet, windows.now())
    assert windows.rows[0]["gc_s"] > 0 and windows.rows[1]["gc_s"] == 0
    windows.close()
    start = windows.now()
    gc.collect()  # after close, no longer watched
    assert windows.now()[2] == start[2]


def test_block_means_take_rank_0s_wall_clock_and_sum_the_ranks_cpu():
    def row(block, arm, wall, cpu):
        return {"block": block, "arm": arm, "wall_s": wall, "cpu_s": cpu, "gc_s": 0.0}

    rank0 = [row(1, "a", 1.0, 0.5), row(1, "a", 3.0, 1.5), row(1, "b", 1.0, 1.0), row(2, "a", 1.0, 1.0)]
    rank1 = [row(1, "a", 9.0, 0.25), row(1, "a", 9.0, 0.75), row(1, "b", 9.0, 2.0), row(2, "a", 1.0, 1.0)]
    (block,) = block_means([rank0, rank1], ("a", "b"))  # block 2 has no "b" step: left out
    assert block["block"] == 1
    assert block["a"] == {"steps": 2, "wall_s": 2.0, "cpu_s": 1.0 + 0.5, "gc_s": 0.0}
    assert block["b"]["wall_s"] == 1.0 and block["b"]["cpu_s"] == 3.0


def test_no_benchmark_imports_another():
    """What benchmarks share lives in bench/benchlib.py (records, statistics) and bench/benchjobs.py (jobs and
    measurements several of them run); a benchmark importing another would run its module's top level. The
    harness is not a benchmark: run_all.py lists them, summarize.py renders each one's table with that
    benchmark's own function, and own_job_interleaved.py is a job's train function that a run imports."""
    import ast
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench"
    harness = {"benchlib", "benchjobs", "run_all", "summarize", "own_job_interleaved"}
    scripts = {p.stem for p in bench.glob("*.py")} - harness
    crossing = []
    for path in sorted(p for p in bench.glob("*.py") if p.stem != "summarize"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            crossing += [f"{path.name} imports {n}" for n in names if n.split(".")[-1] in scripts]
    assert not crossing, crossing
