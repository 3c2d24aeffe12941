"""What every benchmark in bench/ shares: the result envelope, the A/B order, the statistics.

Each benchmark script (bench/<name>.py) measures one thing, defined in its own docstring, and
writes `bench/results/<name>.json` (`--quick`: `bench/results/quick/<name>.json`) through
`Benchmark.finish` (`write_result`), which wraps its figures in the same envelope:

    benchmark    the script's name
    what         one paragraph: what is measured and how (the script's docstring, first paragraph)
    command      the exact command line that produced the file
    date         local date and time with UTC offset, ISO 8601, when the benchmark ended
    wall_s       how long the whole benchmark took
    quick        true for the few-minute variant (fewer repeats and sizes)
    machine      {"hardware": describe_hardware(), "versions": describe_versions(), "load_avg_start",
                  "load_avg_end"} (scaling.launch.machine; load averages: /proc/loadavg, to spot contention)
    comparisons  list of {name, a, b, a_median, b_median, unit, ratio, ratio_definition, budget,
                  budget_on ("ratio" or "a": what the budget bounds), budget_definition, pass, note}:
                  the rows `bench/summarize.py` turns into the table
    ...          the benchmark's own details (per-run values, per-size timings, ...)

A and B are always run in the same benchmark, alternating in ABBA order (A B B A A B ...), so
that a slow drift of the machine (another job starting, thermal state) lands on both arms
equally; figures are medians, never means, so that one disturbed run does not move them.
Run the scripts with the repository's venv from the repository root, e.g.
`.venv/bin/python bench/instrumentation_overhead.py --quick`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def abba(n_pairs: int, a="A", b="B") -> list:
    """The alternating order of 2 x n_pairs runs: A B B A A B B A ..."""
    order = []
    for i in range(n_pairs):
        order += [a, b] if i % 2 == 0 else [b, a]
    return order


def adjacent_pairs(sequence: list[tuple], a="A", b="B") -> list[tuple]:
    """Pair each A with the B run next to it in an ABBA sequence of (arm, value): [(a_value, b_value), ...]."""
    pairs = []
    for i in range(0, len(sequence) - 1, 2):
        (arm1, v1), (arm2, v2) = sequence[i], sequence[i + 1]
        values = {arm1: v1, arm2: v2}
        if set(values) == {a, b}:
            pairs.append((values[a], values[b]))
    return pairs


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def ratio(numerator, denominator) -> float | None:
    if numerator is None or not denominator:
        return None
    return float(numerator) / float(denominator)


def median_order_interval(values, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """The distribution-free interval of the median of `values`, from their order statistics (the
    sign test's): [x_(k), x_(n+1-k)] of the n sorted values, k the largest with P(Binomial(n, 1/2)
    < k) <= (1 - confidence) / 2. It covers the median with probability >= `confidence` whatever
    the values' distribution (independent draws of one continuous distribution), so a few
    outliers (a run another job disturbed) cannot narrow it. (None, None) below the smallest n
    that has one: 6 values at 95% (then [min, max], 96.9%); 10 give [x_(2), x_(9)], 16 [x_(4), x_(13)]."""
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    n, tail = len(xs), (1 - confidence) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) < k + 1)
    while k < n:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    return (xs[k - 1], xs[n - k]) if k > 0 else (None, None)


def steady_run_overrides(epochs: int, quick: bool) -> list[str]:
    """Overrides that make the quickstart a timing run of `epochs` epochs: the target never reached (every
    epoch trains), no A/B calibration and a small validation set (neither is inside `train_s`); quick:
    shorter epochs (the step is the same)."""
    return [
        f"train.max_epochs={epochs}",
        "train.target_accuracy=1.0",
        "instrument.calibration_pairs=0",
        "data.val_samples=512",
        *(["data.train_samples=2048"] if quick else []),
    ]


UNDECIDED = "undecided: more pairs needed"


def interval_verdict(lo: float | None, hi: float | None, budget: float) -> str:
    """A ratio's verdict against its budget by its interval: "pass" when the whole interval is within
    it (hi <= budget), "miss" when the whole interval is beyond it (lo > budget), else `UNDECIDED`."""
    if lo is None or hi is None:
        return UNDECIDED
    if hi <= budget:
        return "pass"
    return "miss" if lo > budget else UNDECIDED


def comparison(
    name: str,
    a: str,
    b: str,
    a_median,
    b_median,
    unit: str,
    ratio_value,
    ratio_definition: str,
    budget: float | None = None,
    budget_definition: str = "",
    note: str = "",
    budget_on: str = "ratio",
    pair_ratios=None,
    decided_by_interval: bool = False,
) -> dict:
    """One row of the summary table. `pass`: the ratio (budget_on="ratio") or A's median
    (budget_on="a", a budget in `unit`) is <= budget; null without a budget or a value.

    With `pair_ratios` (the per-pair ratios the median ratio is taken over), the row carries the
    95% interval of that median (`ratio_lo`, `ratio_hi`: percentile bootstrap over pairs,
    scaling/analysis/intervals.py) and `within_noise`: whether it includes 1 (no difference
    between A and B shown) and, with a budget, `budget_within_noise`: whether it straddles it.

    `decided_by_interval` (a ratio budget and `pair_ratios`): the interval is the order-statistic one
    (`median_order_interval`, which holds at few pairs where the bootstrap's is too narrow) and it
    alone decides: `verdict` is `interval_verdict`'s, and `pass` true on "pass", false on "miss",
    null while undecided."""
    from scaling.analysis.intervals import median_interval

    value = ratio_value if budget_on == "ratio" else a_median
    passed = None if budget is None or value is None else bool(value <= budget)
    decided = decided_by_interval and budget is not None and budget_on == "ratio"
    if decided:
        lo, hi = median_order_interval(pair_ratios or [])
    else:
        lo, hi = median_interval(pair_ratios) if pair_ratios else (None, None)
        lo, hi = (None, None) if lo is None or lo != lo else (lo, hi)
    row = {
        "name": name,
        "a": a,
        "b": b,
        "a_median": a_median,
        "b_median": b_median,
        "unit": unit,
        "ratio": ratio_value,
        "ratio_lo": lo,
        "ratio_hi": hi,
        "ratio_definition": ratio_definition,
        "within_noise": None if lo is None else bool(lo <= 1.0 <= hi),
        "budget_within_noise": None
        if lo is None or budget is None or budget_on != "ratio"
        else bool(lo <= budget < hi),
        "budget": budget,
        "budget_on": budget_on,
        "budget_definition": budget_definition,
        "pass": passed,
        "note": note,
    }
    if decided:
        verdict = interval_verdict(lo, hi, budget)
        row.update(
            interval="95% order-statistic (sign-test) interval of the median over pairs",
            verdict=verdict,
            pairs=len([r for r in pair_ratios or [] if r is not None]),
            budget_within_noise=verdict == UNDECIDED,
            **{"pass": {"pass": True, "miss": False}.get(verdict)},
        )
    return row


def command_line() -> str:
    """The command that is running, as one could type it again from the repository root."""

    def rel(path: str) -> str:
        try:
            return (
                os.path.relpath(Path(path).absolute(), REPO)
                if Path(path).is_absolute() or Path(path).exists()
                else path
            )
        except ValueError:
            return path

    python = rel(sys.executable)
    return shlex.join([python, rel(sys.argv[0]), *sys.argv[1:]])


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


class RunQueue:
    """Contention meter: samples the kernel's count of runnable tasks (`procs_running` in /proc/stat)
    every `interval_s` while a benchmark run is going; `mean` is their average. A 2-worker run on
    its own keeps it near 2-3 (its workers plus short-lived helper threads); clearly more means
    something else wanted the CPUs at the same time.

        with RunQueue() as rq:
            run()
        rq.mean
    """

    def __init__(self, interval_s: float = 0.25):
        import threading

        self.interval_s = interval_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                for line in Path("/proc/stat").read_text().splitlines():
                    if line.startswith("procs_running"):
                        self.samples.append(int(line.split()[1]) - 1)  # minus this sampler itself
                        break
            except OSError:
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RunQueue":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 2) if self.samples else None


def contention_note(runs: list[dict]) -> str:
    values = [r["mean_runnable"] for r in runs if r.get("mean_runnable") is not None]
    if not values:
        return ""
    return f"mean runnable tasks per run {min(values):.1f}-{max(values):.1f} (contention meter, see bench/benchlib.py)"


class TreeCpu:
    """CPU time of process trees, from /proc, split into the training workers (Ray's
    `ray::RayTrainWorker` actors; the plain launcher's processes, forked by its fork server) and everything else
    under the roots (the driver; a Ray head's GCS, raylet, dashboard, Train controller and helper
    actors), plus the whole machine's busy CPU (/proc/stat).

    Every `interval_s` the cumulative CPU seconds of each known process are read (and the tree is
    walked for new processes every `discover_every` samples, through /proc/PID/task/*/children);
    `cpu_s(kind, start, end)` interpolates linearly between samples, so a window's CPU is exact to
    within the change of rate inside one interval. CPU time, unlike wall time, hardly moves when
    other jobs take the cores: a robust second view of an overhead on a shared machine.

        with TreeCpu([os.getpid()]) as tree:
            run()
        tree.cpu_s("train_workers", t0, t1); tree.cores(t0, t1)
    """

    TICK = os.sysconf("SC_CLK_TCK")
    KINDS = ("train_workers", "other")

    def __init__(self, roots: list[int], interval_s: float = 0.2, discover_every: int = 10):
        import threading

        self.roots = list(roots)
        self.interval_s = interval_s
        self.discover_every = discover_every
        self.kinds: dict[int, str] = {}
        self.series: dict[int, list[tuple[float, float]]] = {}  # pid -> [(unix time, cpu seconds)]
        self.sample_times: list[float] = []
        self.machine: list[tuple[float, float]] = []  # (unix time, busy cpu seconds of the whole machine)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @classmethod
    def _machine_busy_s(cls) -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        return (sum(fields) - fields[3] - fields[4]) / cls.TICK  # all but idle and iowait

    @classmethod
    def _cpu_s(cls, pid: int) -> float | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        rest = stat[stat.rindex(")") + 2 :].split()
        return (int(rest[11]) + int(rest[12])) / cls.TICK  # utime + stime

    FORK_SERVER = "from multiprocessing.forkserver import main"

    @classmethod
    def kind(cls, cmd: str, parent_cmd: str = "") -> str:
        """A training worker: Ray Train's actor, a spawned process, or a process a fork server forked
        (the plain launcher's, scaling/launch/local.py: it carries the server's command line, and
        its parent is the server); anything else is "other"."""
        if cmd.startswith("ray::RayTrainWorker") or "spawn_main" in cmd:
            return "train_workers"
        return "train_workers" if cls.FORK_SERVER in cmd and cls.FORK_SERVER in parent_cmd else "other"

    def _discover(self) -> None:
        todo, seen = [(root, "") for root in self.roots], set()
        while todo:
            pid, parent_cmd = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                for task in os.scandir(f"/proc/{pid}/task"):
                    todo += [(int(c), cmd) for c in Path(f"{task.path}/children").read_text().split()]
            except OSError:
                continue
            if pid not in self.kinds or self.kinds[pid] == "other":  # the title of a Ray actor is set after start
                self.kinds[pid] = self.kind(cmd, parent_cmd)

    def _run(self) -> None:
        count = 0
        while not self._stop.is_set():
            if count % self.discover_every == 0:
                self._discover()
            now = time.time()
            for pid in list(self.kinds):
                cpu = self._cpu_s(pid)
                if cpu is not None:
                    self.series.setdefault(pid, []).append((now, cpu))
            self.sample_times.append(now)
            self.machine.append((now, self._machine_busy_s()))
            count += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "TreeCpu":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _at(points: list[tuple[float, float]], t: float, born: float | None) -> float:
        """A cumulative counter at time t, linear between samples; 0 at `born` (before the first sample)."""
        if born is not None and points[0][0] > born:
            points = [(born, 0.0), *points]
        if t <= points[0][0]:
            return points[0][1]
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if t <= t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
        return points[-1][1]

    def _born(self, first_seen: float) -> float | None:
        """A process first seen at `first_seen` started after the sample before (its CPU counts from then)."""
        earlier = [t for t in self.sample_times if t < first_seen]
        return earlier[-1] if earlier else None

    def cpu_s(self, kind: str, start: float, end: float) -> float:
        total = 0.0
        for pid, points in self.series.items():
            if self.kinds.get(pid) == kind:
                born = self._born(points[0][0])
                total += self._at(points, end, born) - self._at(points, start, born)
        return total

    def cores(self, start: float, end: float) -> dict | None:
        """Cores used on average in [start, end] by the training workers, by everything else under the
        roots, and by the rest of the machine (busy CPU outside the trees: other jobs, this script)."""
        if end <= start or len(self.machine) < 2:
            return None
        wall = end - start
        used = {kind: self.cpu_s(kind, start, end) for kind in self.KINDS}
        machine = self._at(self.machine, end, None) - self._at(self.machine, start, None)
        return {
            "window_s": round(wall, 2),
            "train_workers_cores": round(used["train_workers"] / wall, 3),
            "lab_and_ray_other_cores": round(used["other"] / wall, 3),
            "rest_of_machine_cores": round((machine - sum(used.values())) / wall, 3),
        }


def training_windows(epochs, first_step_unix: float) -> list[tuple[int, float, float]]:
    """[(epoch, start, end)] in unix time of each epoch's training (epochs.parquet rows): it ends
    where validation began, i.e. elapsed_wall_s - eval_s - calibration_s after the first step."""
    windows = []
    for row in epochs.itertuples():
        end = first_step_unix + float(row.elapsed_wall_s) - float(row.eval_s) - float(row.calibration_s)
        windows.append((int(row.epoch), end - float(row.train_s), end))
    return windows


def steady_cpu(tree: TreeCpu, epochs, global_batch: int) -> dict:
    """A run's CPU in its steady state (the epochs after the first, training only): the training
    workers' CPU seconds per step (all workers together) and the cores each kind used."""
    first_step_unix = float(epochs["first_step_unix"].iloc[0])
    windows = [w for w in training_windows(epochs, first_step_unix) if w[0] > 1]
    steps = float((epochs[epochs["epoch"] > 1]["samples"] / global_batch).sum())
    if not windows or not steps:
        return {"worker_cpu_s_per_step": None, "cores": None}
    worker_cpu = sum(tree.cpu_s("train_workers", start, end) for _, start, end in windows)
    return {"worker_cpu_s_per_step": worker_cpu / steps, "cores": tree.cores(windows[0][1], windows[-1][2])}


class StepWindows:
    """Arms interleaved step by step in one process: each arm's steps timed by wall clock
    (`time.perf_counter`), the process's CPU (`time.process_time`: every thread, gloo's included)
    and the time Python's cyclic garbage collector ran inside them (`gc.callbacks`).

    `now()` is a mark; `add(block, arm, start, end)` books the window between two marks. Why
    interleave steps: on a shared 2-CPU machine a step's time moves with other VMs' work on the
    same cores, in bursts of seconds, so whole runs (or epochs) of A and B seconds apart differ
    by +-5% whatever A and B do; A and B steps alternating within one block see the same
    bursts, and a block's A / B ratio spreads far less (bench/fsdp_overhead.py's docstring has the
    measured spreads). What interleaving cannot separate: a collection the garbage collector
    runs when allocations cross its threshold lands in whichever arm's step crosses it, so each
    arm's collection time is booked too, to bound what that could move."""

    def __init__(self):
        import gc

        self.rows: list[dict] = []
        self._gc_s, self._gc_start = 0.0, None
        self._gc = gc
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self._gc_s += time.perf_counter() - self._gc_start
            self._gc_start = None

    def close(self) -> None:
        if self._on_gc in self._gc.callbacks:
            self._gc.callbacks.remove(self._on_gc)

    def now(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.process_time(), self._gc_s

    def add(
        self,
        block: int,
        arm: str,
        start: tuple[float, float, float],
        end: tuple[float, float, float],
        into_last: bool = False,
    ) -> None:
        """Book a step's window; `into_last`: add it to this arm's last step in the block instead (an
        iterator's closing call, which ends the last step and starts none)."""
        row = {
            "block": block,
            "arm": arm,
            "wall_s": end[0] - start[0],
            "cpu_s": end[1] - start[1],
            "gc_s": end[2] - start[2],
        }
        last = (
            next((r for r in reversed(self.rows) if r["block"] == block and r["arm"] == arm), None)
            if into_last
            else None
        )
        if last is not None:
            for key in ("wall_s", "cpu_s", "gc_s"):
                last[key] += row[key]
        else:
            self.rows.append(row)


def block_means(rows_by_rank: list[list[dict]], arms: tuple[str, ...]) -> list[dict]:
    """Per block, each arm's mean step: wall clock on rank 0, CPU summed over ranks (the workers'
    CPU per step), garbage collection on rank 0; `steps`: rank 0's steps of the arm in the block."""
    blocks = sorted({r["block"] for r in rows_by_rank[0]})
    out = []
    for block in blocks:
        row = {"block": block}
        for arm in arms:
            per_rank = [[r for r in rows if r["block"] == block and r["arm"] == arm] for rows in rows_by_rank]
            if not all(per_rank):
                break
            first = per_rank[0]
            row[arm] = {
                "steps": len(first),
                "wall_s": sum(r["wall_s"] for r in first) / len(first),
                "cpu_s": sum(sum(r["cpu_s"] for r in rows) / len(rows) for rows in per_rank),
                "gc_s": sum(r["gc_s"] for r in first) / len(first),
            }
        else:
            out.append(row)
    return out


def measure_until_decided(
    measure_next, rows, started: float, max_minutes: float, name: str, unit: str, once: bool = False
) -> int:
    """Call `measure_next(index)` (one more pair of processes, or run) until no verdict of
    `rows()` is undecided, or another would end after `max_minutes` from `started` (judged by the
    mean so far); `once`: the first only (a quick check). `unit` says what one is, for the
    progress lines. Returns how many were measured."""
    index = 0
    while True:
        if index:
            if once or UNDECIDED not in [c["verdict"] for c in rows()]:
                return index
            elapsed = time.time() - started
            if elapsed + elapsed / index > 60 * max_minutes:
                print(
                    f"[{name}] undecided after {index} ({unit} each), and one more would end after "
                    f"{max_minutes:g} min: stopping",
                    flush=True,
                )
                return index
        print(f"[{name}] #{index + 1}: {unit}", flush=True)
        measure_next(index)
        index += 1


class LabBatchesWithBareSteps:
    """The lab's dataset, whose training batches each come after one step of a bare job: the
    lab's loop and a bare loop interleaved step by step (`lab_with_bare_steps`).

    Before each of the lab's batches is handed over, the bare job takes one step (`bare.step(*next(
    bare.batches(epoch)))`). The lab's window runs from the end of one bare step to the start of
    the next: one whole step of the lab's loop (its meter's bookkeeping, forward, backward,
    optimizer, scheduler, loss bookkeeping) and the making of its next batch; the bare window is
    the bare job's batch and step. The last lab step of an epoch runs into the epoch's end (its
    validation, its records) and is not bracketed: per epoch, one lab window fewer than bare ones."""

    def __init__(self, dataset, bare, windows: StepWindows, epochs: int):
        self._dataset, self._bare, self._windows, self._epochs = dataset, bare, windows, epochs

    def __getattr__(self, name):
        return getattr(self._dataset, name)

    def train_batches(self, rank: int, world_size: int, epoch: int, seed: int, batch_size: int):
        lab_batches = self._dataset.train_batches(rank, world_size, epoch, seed, batch_size)
        if not 1 <= epoch <= self._epochs:  # calibration's batches pass through untouched
            yield from lab_batches
            return
        bare_batches, lab_start = self._bare.batches(epoch), None
        for batch in lab_batches:
            bare_start = self._windows.now()
            if lab_start is not None:
                self._windows.add(epoch, "lab", lab_start, bare_start)
            self._bare.step(*next(bare_batches))
            lab_start = self._windows.now()
            self._windows.add(epoch, "bare", bare_start, lab_start)
            yield batch


def lab_with_bare_steps(cfg, ctx, run_dir, make_bare, windows: StepWindows) -> None:
    """The lab's loop on this worker as a launcher runs it (`train_worker` in `lab_context`), with
    `make_bare(dataset)`'s job stepping before each of its training batches
    (`LabBatchesWithBareSteps`); the bare job is made when the loop loads its dataset, and may use it.
    Needs an evaluation only at epochs' ends (`train.eval_every=1`), or one would fall in a lab window."""
    import scaling.train.loop as lab_loop
    from scaling.train.user_function import lab_context

    if cfg.train.eval_every != 1:
        raise ValueError(
            "lab_with_bare_steps needs train.eval_every=1: a mid-epoch evaluation would count as a lab step"
        )
    load_dataset = lab_loop.load_dataset

    def load_with_bare_steps(*args, **kwargs):
        dataset = load_dataset(*args, **kwargs)
        return LabBatchesWithBareSteps(dataset, make_bare(dataset), windows, cfg.train.max_epochs)

    lab_loop.load_dataset = load_with_bare_steps
    try:
        with lab_context(cfg, run_dir):
            lab_loop.train_worker(cfg, ctx, run_dir)
    finally:
        lab_loop.load_dataset = load_dataset


def describe_machine(load_avg_start=None) -> dict:
    from scaling.launch.machine import describe_hardware, describe_versions

    return {
        "hardware": describe_hardware(),
        "versions": describe_versions(),
        "load_avg_start": load_avg_start,
        "load_avg_end": load_average(),
    }


def what(doc: str) -> str:
    """The first paragraph of a module docstring, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def results_dir(quick: bool) -> Path:
    """bench/results/ (committed), or bench/results/quick/ (a check that the benchmarks run; ignored by git)."""
    if not quick:
        return RESULTS
    folder = RESULTS / "quick"
    folder.mkdir(parents=True, exist_ok=True)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# quick-mode results: not committed\n*\n")
    return folder


class Benchmark:
    """One benchmark from its command line to its result file: the arguments the A/B benchmarks share
    (`--quick`, and where asked `--pairs`, `--epochs`, `--config`, each resolved to its full or quick
    default), when it started, and the tail every benchmark ends with (`finish`).

        bench = bl.Benchmark(NAME, __doc__, quick="1 pair of 2-epoch runs", pairs=(2, 1), epochs=(3, 2))
        bench.parser.add_argument(...)  # the benchmark's own
        args = bench.parse()
        ...
        bench.finish(comparisons, runs=runs)
    """

    def __init__(
        self,
        name: str,
        doc: str,
        quick: str,
        *,
        pairs: tuple[int, int] | None = None,
        epochs: tuple[int, int] | None = None,
        config: str | None = None,
    ):
        self.name, self.doc = name, doc
        self.parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
        self.parser.add_argument("--quick", action="store_true", help=f"{quick} (into bench/results/quick/)")
        self._defaults: dict[str, tuple[int, int]] = {}
        if pairs is not None:
            self._counted("pairs", pairs, "A/B pairs")
        if epochs is not None:
            self._counted("epochs", epochs, "epochs per run")
        if config is not None:
            self.parser.add_argument("--config", default=config, help=f"the experiment config (default {config})")
        self.quick, self.started, self.load_start = False, time.time(), None

    def _counted(self, name: str, defaults: tuple[int, int], what: str) -> None:
        self._defaults[name] = defaults
        self.parser.add_argument(f"--{name}", type=int, help=f"{what} (default {defaults[0]}; quick {defaults[1]})")

    def parse(self, argv: list[str] | None = None) -> argparse.Namespace:
        """The command line, each shared count resolved; the benchmark's clock and load start here."""
        args = self.parser.parse_args(argv)
        for name, (full, quick) in self._defaults.items():
            if getattr(args, name) is None:
                setattr(args, name, quick if args.quick else full)
        self.quick, self.started, self.load_start = args.quick, time.time(), load_average()
        return args

    def finish(self, comparisons: list[dict], **details) -> Path:
        """Write the result (`write_result`), print its comparisons and where it went; its path."""
        path = write_result(self.name, self.doc, self.quick, self.started, self.load_start, comparisons, **details)
        print_comparisons(comparisons)
        print(f"[{self.name}] wrote {path.relative_to(REPO)}", flush=True)
        return path


def write_result(
    name: str, doc: str, quick: bool, started: float, load_avg_start, comparisons: list[dict], **details
) -> Path:
    """Write results/<name>.json (atomically) and return its path."""
    out_dir = results_dir(quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "what": what(doc),
        "command": command_line(),
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "wall_s": round(time.time() - started, 1),
        "quick": quick,
        "machine": describe_machine(load_avg_start),
        "comparisons": comparisons,
        **details,
    }
    path = out_dir / f"{name}.json"
    from scaling.results import write_json_atomic  # here, not at the top: pandas would slow every --help

    write_json_atomic(path, record)
    return path


def print_comparisons(comparisons: list[dict]) -> None:
    for c in comparisons:
        verdict = "" if c["pass"] is None else ("  PASS" if c["pass"] else "  MISS")
        if c.get("verdict"):
            interval = f" [{c['ratio_lo']:.3f}, {c['ratio_hi']:.3f}]" if c.get("ratio_lo") is not None else ""
            verdict = f"{interval}, {c['pairs']} pairs: {c['verdict'].upper()}"
        on = "" if c.get("budget_on", "ratio") == "ratio" else f" {c['unit']}, on A"
        budget = f" (budget <= {c['budget']}{on})" if c["budget"] is not None else ""
        r = f"{c['ratio']:.3f}" if c["ratio"] is not None else "-"
        print(
            f"{c['name']}: A {c['a']} = {_fmt(c['a_median'])} {c['unit']}, B {c['b']} = {_fmt(c['b_median'])} "
            f"{c['unit']}; ratio {r}{budget}{verdict}",
            flush=True,
        )


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


if __name__ == "__main__":
    # A library, not a benchmark: run as a script it only says so (and answers --help).
    import argparse

    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="A library the benchmarks import; it measures nothing itself. Run them with bench/run_all.py.",
    ).parse_args()
    print("bench/benchlib.py is the benchmarks' library; run them with bench/run_all.py (see --help)")
