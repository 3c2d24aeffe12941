"""A real 2-node Ray cluster on this machine (network namespaces, veth, bridge, tc caps).

On the session's minicluster (tests/conftest.py: `up` and `down` through the CLI, `down` checked
to leave nothing behind), with every link capped, runs a 2-worker sweep across it (node ranks 0
and 1 in the records; the same sweep submitted again from the other node meanwhile is refused) and checks the
cap against gloo all-reduces between the nodes. A ring
all-reduce of S bytes between 2 nodes sends S bytes each way over each capped link, so it takes
about S x 8 / R seconds plus costs that do not grow with S (latency, the process group's own
work, the token bucket's burst leaving at line speed).

The timing checks follow docs/testing.md: the cap's rate from a paired design, all-reduces of S and
2S bytes alternating (S, 2S, 2S, S) in one probe, whose fastest times' difference is the rate's
alone (the fixed costs cancel; other processes only ever add time); the run's transfer per step
from an order: no transfer of the gradients over a capped link is faster than the cap allows for
the bytes beyond one burst. Measured here (2 cores, load 5.8-12, at 200 mbit): the difference for
S = 10 MB -1.5..+6.0% over S x 8 / R in 7 rounds (TCP/IP and Ethernet framing add about 4.5%); the
fastest all-reduce of the quickstart CNN's 1,154,664 gradient bytes -2.7..+0.4% of its bound in 6,
and the run's fastest transfer per step 46.1 ms for its 46.2 ms bound, both above the burst floor
(-8.7%). Needs root with network-admin rights; skips with the reason where
a probe (tests/conftest.py) finds none, fails where `.ci/run` requires it.
"""

import dataclasses
import os
import subprocess
import threading
import time

import pandas as pd
import pytest

from scaling.cli import main
from scaling.errors import UsageError
from scaling.writer_lock import LOCK_NAME
from tests.conftest import BIN, REPO, run_cli

CAP = "200mbit"
CAP_BITS_PER_S = 200e6
RATE_MARGIN = 0.15  # above S x 8 / R for the rate's paired estimate: 2.5x the worst seen (module docstring)


def test_sweep_across_two_capped_nodes(whole_minicluster, tmp_path):
    from scaling.testbed import minicluster as mc

    name = whole_minicluster
    mc.set_bandwidth(CAP, name)  # whole_minicluster uncaps it again afterwards
    status = mc.status(name)
    assert status["ray_nodes_alive"] == 2
    assert [n["egress_cap"] for n in status["nodes"]] == ["200Mbit", "200Mbit"]

    out = tmp_path / "sweep"
    sweep = [
        "scaling", "sweep", "experiments/quickstart.yaml", "--workers", "2", "--repeats", "1", "--out", str(out),
        "--set", "data.train_samples=1024", "--set", "data.val_samples=256", "--set", "train.max_epochs=2",
        "--set", "instrument.calibration_pairs=4",
    ]  # fmt: skip
    first = subprocess.Popen(
        [str(BIN / "scaling"), "minicluster", "exec", "--name", name, "--", *sweep],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The same sweep submitted again from the other node, on the storage both see, while the first
    # runs: refused in one line naming the first's driver (scaling/writer_lock.py), nothing touched.
    deadline = time.monotonic() + 300
    while not ((out / "runs" / "w2-r0").exists() and (out / LOCK_NAME).exists()) and first.poll() is None:
        assert time.monotonic() < deadline, "the first sweep never started its run"
        time.sleep(0.1)
    second = run_cli("minicluster", "exec", "--name", name, "--node", "1", "--", *sweep)
    assert first.poll() is None, "the first sweep ended before the second was refused: no race was tested"
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert f"{out} is being written by scaling sweep on host" in second.stderr
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-2000:]
    assert "resuming" not in stdout and not (out / LOCK_NAME).exists()
    runs = pd.read_parquet(out / "runs.parquet")
    assert list(runs["status"]) == ["max_epochs"] and int(runs["num_nodes"].iloc[0]) == 2
    steps = pd.read_parquet(next((out / "runs").iterdir()) / "steps.parquet")
    assert sorted(steps.groupby("rank")["node_rank"].first()) == [0, 1]
    assert set(steps["local_rank"]) == {0}

    # the cap's rate: S and 2S alternating in one probe; the fastest of each, their difference against S x 8 / R
    nbytes = 10_000_000
    with mc.AllreduceProbe(name, 2) as probe:
        s1, s2, s3, s4 = probe.measure([nbytes, 2 * nbytes, 2 * nbytes, nbytes], iters=2)
    small, large = min(s1["seconds"] + s4["seconds"]), min(s2["seconds"] + s3["seconds"])
    expected = nbytes * 8 / CAP_BITS_PER_S
    print(f"{nbytes:,} more bytes took {(large - small) * 1e3:.1f} ms more, for a {expected * 1e3:.1f} ms bound")
    # seen -1.5..+6.0%: below -5% the link ran faster than its cap, above +15% (2.5x the worst seen) slower
    assert -0.05 <= (large - small) / expected - 1 <= RATE_MARGIN, (small, large, expected)

    # Why communication costs what it does, on capped links: the exposed transfer of each step
    # (after every rank handed its gradients over) follows the same bandwidth bound for the
    # model's gradients (one bucket: small_cnn's fp32 gradients, all-reduced as the probe's
    # bytes are), and the waiting is no part of it.
    from scaling.models import build_model

    gradient_bytes = 4 * sum(p.numel() for p in build_model("small_cnn", 10).parameters())
    bound = gradient_bytes * 8 / CAP_BITS_PER_S
    steady = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    transfer = float(steady["transfer_s"].median())
    fastest = float(steady["transfer_s"].min())
    floor = (gradient_bytes - mc.tbf_burst_bytes(CAP)) * 8 / CAP_BITS_PER_S  # one burst leaves at line speed
    print(
        f"transfer per step {transfer * 1e3:.1f} ms (fastest {fastest * 1e3:.1f} ms) for a {bound * 1e3:.1f} ms bound, "
        f"{floor * 1e3:.1f} ms floor ({gradient_bytes:,} bytes)"
    )
    # an order: no step moved its gradients faster than the cap allows (a transfer that missed part of the
    # all-reduce, or a cap not in force, falls under it; load only adds time)
    assert fastest >= floor, (fastest, floor)
    # and the gradients went once, not twice: the fastest step's transfer under two bounds' worth (the committed
    # benchmark's mean at 100 mbit is 1.23 bounds, bench/results/minicluster_bandwidth.json; its fastest is less)
    assert fastest < 2 * bound, (fastest, bound)
    # the waiting is no part of it: the steps that waited longest (a rank held up by the machine's other work,
    # which a shared CPU gives some steps) still moved their gradients within two bounds
    waited_most = steady.nlargest(3, "waiting_s")
    assert float(waited_most["transfer_s"].median()) < 2 * bound, waited_most[["waiting_s", "transfer_s"]]


def test_without_root_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["minicluster", "up", "--nodes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs root" in err


class _StartedRay:
    """A `ray start --block` as `_wait_for_nodes` sees it: running (None), or exited with `code`."""

    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


def _one_starting_node(monkeypatch, failing_starts: int) -> tuple:
    """A 2-node cluster whose node 1 is starting; each start of it exits until `failing_starts` have, the next
    joins. Returns the cluster and the list of node indices started again."""
    from scaling.testbed import minicluster as mc

    cluster = mc.MiniCluster(
        name="r1",
        subnet="10.9.0.0/24",
        bridge="smr1br",
        bridge_ip="10.9.0.1",
        bandwidth=None,
        cpus_per_node=1,
        nodes=[
            mc.Node(index=0, namespace="scaling-r1-n0", ip="10.9.0.10", host_iface="smr1h0"),
            mc.Node(index=1, namespace="scaling-r1-n1", ip="10.9.0.11", host_iface="smr1h1"),
        ],
        temp_dir="/tmp/smc-r1",
    )
    restarts, alive = [], {"count": 1}

    def start_again(_, node):
        restarts.append(node.index)
        if len(restarts) + 1 > failing_starts:  # the first start is the caller's
            alive["count"] = 2
            return _StartedRay()
        return _StartedRay(code=1)

    monkeypatch.setattr(mc, "alive_nodes", lambda _: alive["count"])
    monkeypatch.setattr(mc, "_namespace_pids", lambda namespace: [])
    monkeypatch.setattr(mc, "_wait_until_empty", lambda *args: None)
    monkeypatch.setattr(mc, "_start_worker_node", start_again)
    return cluster, restarts


def test_a_node_whose_ray_exits_at_its_start_is_started_again(monkeypatch):
    """A raylet can give up at its start under load (its dashboard agent late to write its port): the node's
    `ray start` exits, and the node is started again rather than waited on until the deadline."""
    from scaling.testbed import minicluster as mc

    said = []
    cluster, restarts = _one_starting_node(monkeypatch, failing_starts=2)
    mc._wait_for_nodes(cluster, 2, {1: _StartedRay(code=1)}, said.append)
    assert restarts == [1, 1] and len(said) == 2 and "starting it again" in said[0]

    cluster, restarts = _one_starting_node(monkeypatch, failing_starts=99)
    with pytest.raises(RuntimeError, match=f"exited at its start {mc.NODE_START_ATTEMPTS} times"):
        mc._wait_for_nodes(cluster, 2, {1: _StartedRay(code=1)})
    assert restarts == [1] * (mc.NODE_START_ATTEMPTS - 1)


def test_pinned_nodes_each_hold_their_own_cpus(monkeypatch):
    """`pin_cpus`: node i on the next cpus_per_node of this process's CPUs (wrapping around), and a node's
    `ray start` (so all it starts) held to them from its first instruction."""
    from scaling.testbed import minicluster as mc

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert mc.node_cpu_sets(2, 1) == [[0], [1]]
    assert mc.node_cpu_sets(2, 2) == [[0, 1], [2, 3]]
    assert mc.node_cpu_sets(3, 3) == [[0, 1, 2], [3, 0, 1], [2, 3, 0]]
    monkeypatch.undo()

    cpu = sorted(os.sched_getaffinity(0))[-1]
    nodes = [mc.Node(index=i, namespace=f"n{i}", ip=f"10.9.0.{10 + i}", host_iface=f"h{i}") for i in range(2)]
    cluster = mc.MiniCluster("p", "10.9.0.0/24", "br", "10.9.0.1", None, 1, nodes, node_cpus=[[cpu], [cpu]])
    seen = []

    def as_the_node_starts():  # in a thread of its own: Linux holds the calling thread, not this process
        mc._node_affinity(cluster, nodes[1])()
        seen.append(sorted(os.sched_getaffinity(0)))

    thread = threading.Thread(target=as_the_node_starts)
    thread.start()
    thread.join()
    assert seen == [[cpu]]
    assert mc._node_affinity(dataclasses.replace(cluster, node_cpus=[]), nodes[1]) is None  # unpinned


def test_a_head_that_runs_no_workers_is_left_unpinned_and_offers_no_cpus(monkeypatch):
    """`head_cpus=0`: the head's Ray offers no CPUs (no worker runs there) and, with `pin_cpus`, is not held to
    a core: its work spreads over all of them, while the worker nodes take the CPUs from the first on."""
    from scaling.testbed import minicluster as mc

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert mc.node_cpu_sets(3, 1, pin_head=False) == [[], [0], [1]]
    nodes = [mc.Node(index=i, namespace=f"n{i}", ip=f"10.9.0.{10 + i}", host_iface=f"h{i}") for i in range(3)]
    cluster = mc.MiniCluster("p", "10.9.0.0/24", "br", "10.9.0.1", None, 1, nodes, [[], [0], [1]], head_cpus=0)
    assert mc._node_affinity(cluster, nodes[0]) is None and mc._node_affinity(cluster, nodes[2]) is not None
    assert [mc._ray_start_options(cluster, n)[0] for n in nodes] == ["--num-cpus=0", "--num-cpus=1", "--num-cpus=1"]
    monkeypatch.setattr(mc, "_require_root", lambda: None)  # the refusal comes before anything is built
    with pytest.raises(UsageError, match="head-cpus"):
        mc.up(1, head_cpus=0, name="p")
