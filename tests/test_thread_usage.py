"""The training thread's kernel counters (scaling/instrument/thread_usage.py) against known work:
a sleep (no CPU), a busy loop (CPU, bounded by wall time) and pages written for the first time."""

import mmap
import re
import resource
import sys
import threading
import time
from pathlib import Path

import pytest

from scaling.instrument.thread_usage import COLUMNS, ThreadUsage

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RUSAGE_THREAD is Linux-only")


def test_sleep_uses_no_cpu_and_busy_loop_no_more_than_wall_time():
    usage = ThreadUsage()
    time.sleep(0.3)
    slept = usage.stop()
    assert set(slept) == set(COLUMNS)
    assert slept["train_thread_cpu_s"] < 0.05

    # Busy until the kernel's own account of the thread (getrusage, not the clock ThreadUsage
    # reads) says 0.1 s of CPU: how long that takes in wall time depends on the load, what was
    # used does not. Both counts tick at least every 4 ms (CONFIG_HZ=250 at the coarsest).
    def rusage_cpu_s():
        used = resource.getrusage(resource.RUSAGE_THREAD)
        return used.ru_utime + used.ru_stime

    def proc_preemptions():  # the same kernel count through another interface: /proc's, not getrusage's
        status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
        return int(re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", status).group(1))

    usage, start, cpu_start, proc_start = ThreadUsage(), time.perf_counter(), rusage_cpu_s(), proc_preemptions()
    while rusage_cpu_s() - cpu_start < 0.1:
        pass
    busy, wall, proc_end = usage.stop(), time.perf_counter() - start, proc_preemptions()
    assert 0.1 - 0.01 <= busy["train_thread_cpu_s"] <= wall + 0.01  # a thread cannot use more CPU than wall time
    # ThreadUsage's reads come just before /proc's first read and just before its second: a preemption
    # between the first two reads counts in ThreadUsage's and not in /proc's, one between the last two in
    # /proc's and not ThreadUsage's (a loaded run preempted this loop 45 times and counted 46)
    proc = proc_end - proc_start
    assert proc - 1 <= busy["train_preemptions"] <= proc + 1


def test_minor_faults_count_pages_touched_for_the_first_time():
    pages = 2048
    region = mmap.mmap(-1, pages * mmap.PAGESIZE)  # anonymous: no page is mapped until written
    usage = ThreadUsage()
    for page in range(pages):
        region[page * mmap.PAGESIZE] = 1
    faults = usage.stop()["train_minor_faults"]
    region.close()
    # each page faults once (a transparent huge page can serve many at once, so allow far fewer)
    assert 1 <= faults <= pages + 64
