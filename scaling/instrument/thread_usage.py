"""What the kernel says about the training thread during an epoch's training: CPU time, how often
it was preempted, and how many pages it had to fault in.

Wall time per step is what users care about, but on its own it cannot tell a slower loop from a
loop that was kept off its core. These three counters (getrusage(RUSAGE_THREAD), Linux) can:

- `train_thread_cpu_s`: CPU seconds of the thread that runs the training loop. Equal to
  `train_s` when the loop had its core to itself; `train_s - train_thread_cpu_s` is the time it
  waited (preempted by other processes or threads, blocked on a lock or I/O).
- `train_preemptions`: involuntary context switches of that thread (it was runnable but something
  else got the core). A few per second is the kernel's normal tick; hundreds per second means
  other work is being scheduled on the training core (e.g. Ray's own processes, each of whose
  Python workers wakes 100 times a second).
- `train_minor_faults`: pages the kernel had to map (and zero) for the thread: an allocator that
  hands freed memory back to the OS and takes it again every step shows up here.

They count rank 0's training thread only (the thread that called `start`), from `start` to `stop`.
On platforms without RUSAGE_THREAD they are NaN.
"""

from __future__ import annotations

import math
import resource
import time

RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)
COLUMNS = ("train_thread_cpu_s", "train_preemptions", "train_minor_faults")


class ThreadUsage:
    """usage = ThreadUsage(); ...train...; usage.stop() -> {column: value}. Call both on the same thread."""

    def __init__(self):
        self._cpu = time.thread_time()
        self._rusage = resource.getrusage(RUSAGE_THREAD) if RUSAGE_THREAD is not None else None

    def stop(self) -> dict:
        if self._rusage is None:
            return {column: math.nan for column in COLUMNS}
        now = resource.getrusage(RUSAGE_THREAD)
        return {
            "train_thread_cpu_s": time.thread_time() - self._cpu,
            "train_preemptions": float(now.ru_nivcsw - self._rusage.ru_nivcsw),
            "train_minor_faults": float(now.ru_minflt - self._rusage.ru_minflt),
        }
