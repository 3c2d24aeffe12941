"""This machine as a cluster, for the plain launcher, the tests and the benchmarks: a free
loopback port and a private Ray head.

    port = free_port()                                # a TCP port on 127.0.0.1 nobody holds now
    with private_ray_head(num_cpus=2) as head:        # `ray start --head --block`, loopback only
        subprocess.run([...], env={**head.env, "RAY_ADDRESS": head.address})

The private head never attaches to (or is attached by) any other Ray on the machine: its own
session (process group), a private temp dir, free ports, 127.0.0.1, RAY_AUTH_MODE=disabled
(nothing off the machine reaches it). It is stopped by its process id (the process group of
`ray start --block`), never with `ray stop`, which would stop every Ray of the user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent  # the venv's `ray` and `scaling`


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no process holds now (the kernel's pick; free until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def alive_nodes_at(dashboard: str, timeout_s: float = 30.0) -> int:
    """How many Ray nodes the head whose dashboard is at `dashboard` reports alive (0 when it cannot
    be asked): one request to its state API (`ray list nodes` asks the same), which reads the GCS's
    node table, so an answer means the GCS is up and that many raylets registered with it."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{dashboard}/api/v0/nodes?limit=1000&detail=false", timeout=timeout_s) as response:
            nodes = json.load(response)["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return sum(node.get("state") == "ALIVE" for node in nodes)


def ray_env() -> dict:
    """The environment of the head and of the processes that use it: no auth on loopback, no usage
    stats, and this venv first on PATH (`ray job submit` entrypoints such as `scaling ...` run in the
    head's environment)."""
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


class PrivateRayHead:
    """`ray start --head --block` in its own session, private temp dir and ports; stopped by pid.

    `start()` returns once the dashboard (the job server) answers and its state API counts the
    head's node alive (the GCS up, the raylet registered), then waits `settle_s` for the head's
    own start-up work to settle (a benchmark's first run should not share the CPU with it).
    `start_s`: seconds from the command to an answering head. The probes are HTTP requests, not
    `ray status` (a Python process importing Ray every half second, beside the starting head).
    """

    def __init__(
        self,
        num_cpus: int = 2,
        taskset: list[str] | None = None,
        settle_s: float = 0.0,
        timeout_s: float = 120.0,
        prefix: str = "lray-",
    ):
        # short, under /tmp: Ray's socket paths have a length limit
        self.temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        self.port, self.dashboard_port, self.agent_port = free_port(), free_port(), free_port()
        # On SIGTERM `ray start --block` first asks the GCS to drain its node (for Ray Serve's
        # proxies) and waits up to RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (30 s), while the GCS,
        # signalled with the rest of the group, waits on that very call to shut its server down:
        # every stop took the whole 30 s here (the drain's budget, then SIGKILL). Nothing of the
        # lab's runs Serve: 0 turns the drain off, and the group is gone in about 4 s.
        self.env = {**ray_env(), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        self.num_cpus = num_cpus
        self.taskset = list(
            taskset or []
        )  # e.g. ["taskset", "-c", "1"]: the head and every Ray process it starts on CPU 1
        self.settle_s = settle_s
        self.timeout_s = timeout_s
        self.process: subprocess.Popen | None = None
        self.start_s: float | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> "PrivateRayHead":
        command = [
            *self.taskset,
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--dashboard-agent-listen-port={self.agent_port}",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        t0 = time.time()
        self.process = subprocess.Popen(
            command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = t0 + self.timeout_s
        while True:
            # the job server (dashboard) comes up a few seconds after the GCS; its state API answers from the GCS
            if http_ok(f"{self.dashboard}/api/version") and alive_nodes_at(self.dashboard) >= 1:
                break
            if time.time() > deadline or self.process.poll() is not None:
                exited = self.process.poll()
                self.stop()
                why = (
                    f"its `ray start` exited with status {exited}"
                    if exited is not None
                    else f"no answer from {self.dashboard} within {self.timeout_s:g} s"
                )
                raise RuntimeError(f"private Ray head did not start: {why}")
            time.sleep(0.2)
        self.start_s = time.time() - t0
        time.sleep(self.settle_s)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the head's process group, SIGKILL to what is left of it after `timeout_s`;
        then its temp dir. Returns once every process of the group is gone."""
        if self.process is not None:
            group = self.process.pid  # start_new_session: the group id is the head's pid
            _signal_group(group, signal.SIGTERM)
            deadline = time.time() + timeout_s
            # `ray start --block` exits before its GCS and raylet do: wait for the whole group
            while _group_alive(group) and time.time() < deadline:
                self.process.poll()  # reap the head itself
                time.sleep(0.2)
            if _group_alive(group):
                _signal_group(group, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _group_alive(group: int) -> bool:
    """Whether a process of the group still runs (zombies waiting for a reaper do not count)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == group and state != "Z":
            return True
    return False


@contextlib.contextmanager
def private_ray_head(**options):
    """A started `PrivateRayHead(**options)`, stopped on the way out whatever happened."""
    head = PrivateRayHead(**options)
    try:
        yield head.start()
    finally:
        head.stop()
