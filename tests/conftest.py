"""Shared fixtures: one real Ray cluster per test session, on loopback, private to the tests.

The head is scaling.launch.local_cluster's `private_ray_head` (the benchmarks' too): `ray start
--head --block` in its own process group with a private temp dir and free ports, so it never
attaches to (or is attached by) any other Ray on the machine; it is stopped by its process id,
never with `ray stop`.

`netns_capable`: skips a test, with the kernel's own error as the reason, where this process
cannot build what the minicluster builds (network namespace, veth pair, bridge, tc cap).
Being root is not enough: a container's root often lacks CAP_NET_ADMIN / CAP_SYS_ADMIN.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaling.launch.local_cluster import private_ray_head

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def ray_cluster():
    """Yields {'address': 'IP:PORT', 'dashboard': 'http://IP:PORT', 'env': env for subprocesses}."""
    # env: this venv first on PATH, so `ray job submit` entrypoints (`scaling ...`) run in the head's environment
    with private_ray_head(num_cpus=2, timeout_s=90, prefix="slray-") as head:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        try:
            yield {"address": head.address, "dashboard": head.dashboard, "env": {**head.env, "RAY_ADDRESS": head.address}}
        finally:
            import ray

            if ray.is_initialized():
                ray.shutdown()


@pytest.fixture(scope="session")
def ray_connected(ray_cluster):
    """This test process attached to the session cluster as a driver."""
    import ray

    if not ray.is_initialized():
        os.environ["RAY_ADDRESS"] = ray_cluster["address"]
        from scaling.launch.ray_train import connect

        connect()
    return ray_cluster


@functools.lru_cache(maxsize=None)
def netns_capability() -> str | None:
    """None if this process can build the minicluster's network pieces; otherwise why not.

    Probed, not assumed, by making and removing one of each thing `minicluster up` makes: a
    bridge, a network namespace, a veth pair with one end moved into (and renamed inside) the
    namespace, and a tc token-bucket qdisc on that end. Cached: the answer holds for the session.
    """
    if os.geteuid() != 0:
        return "the minicluster needs root (network namespaces, veth links and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the minicluster needs {' and '.join(missing)} (iproute2)"
    tag = f"p{os.getpid() % 100000}"  # interface names are limited to 15 characters
    namespace, bridge, veth = f"scaling-probe-{tag}", f"smpr{tag}b", f"smpr{tag}h"
    steps = [
        ["ip", "link", "add", "name", bridge, "type", "bridge"],
        ["ip", "netns", "add", namespace],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"],
        ["ip", "link", "set", f"{veth}p", "netns", namespace],
        ["ip", "link", "set", veth, "master", bridge],
        ["ip", "netns", "exec", namespace, "ip", "link", "set", f"{veth}p", "name", "lab0"],
        ["ip", "netns", "exec", namespace, "ip", "link", "set", "lab0", "up"],
        ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", "lab0", "root", "tbf",
         "rate", "100mbit", "burst", "65536", "latency", "200ms"],
    ]
    try:
        for step in steps:
            try:
                result = subprocess.run(step, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"cannot build a minicluster here: `{' '.join(step)}`: {exc}"
            if result.returncode != 0:
                why = (result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}").splitlines()[-1]
                return f"cannot build a minicluster here: `{' '.join(step)}` failed: {why}"
        return None
    finally:
        # Only what this probe made, by its own names: deleting the namespace deletes the veth pair.
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def netns_capable():
    """Skips the test, giving the probe's error, where the minicluster cannot be built."""
    why = netns_capability()
    if why is not None:
        pytest.skip(why)


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "scaling"), *args], cwd=REPO, env=env or os.environ.copy(),
        capture_output=True, text=True, timeout=timeout,
    )


# --- waiting on a run in another process (tests/test_failures.py, tests/test_node_loss.py)

POLL_S = 0.02  # epochs here last seconds; a fast machine's still last far longer than this


def wait_for(predicate, timeout_s: float, what: str, process: subprocess.Popen):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"the run ended (exit {process.returncode}) before {what}")
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


def registered_checkpoint_epoch(run_dir) -> int | None:
    """The epoch of the latest checkpoint Ray Train's controller has registered (`RunDir.checkpoint_epoch`):
    a kill before registration would restart from scratch."""
    from scaling.results import RunDir

    return RunDir(run_dir).checkpoint_epoch()


# --- test tiers ----------------------------------------------------------------------------------
# `make test-fast` runs the unit tier (`-m unit`): no Ray, no Horovod, no minicluster, no training
# runs. `make test` runs every tier. A test's tier follows from what it uses: the Ray fixtures, the
# minicluster probe, Horovod's test files, or one of the modules below that launch training runs
# or worker processes.
SLOW_MODULES = {
    "test_ground_truth", "test_precision", "test_attribution", "test_instrument_api", "test_sweep", "test_failures",
    "test_interrupts", "test_own_job", "test_live_metrics", "test_amoebanet", "test_models",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        fixtures = set(getattr(item, "fixturenames", ()))
        tiers = set()
        if fixtures & {"ray_cluster", "ray_connected"}:
            tiers.add("ray")
        if fixtures & {"netns_capable", "minicluster"}:
            tiers.add("minicluster")
        if module.startswith("test_horovod"):
            tiers.add("horovod")
        if module in SLOW_MODULES or item.get_closest_marker("slow"):
            tiers.add("slow")
        for tier in tiers or {"unit"}:
            item.add_marker(getattr(pytest.mark, tier))
