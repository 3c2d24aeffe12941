"""Shared fixtures: one real Ray cluster per test session, on loopback, private to the tests.

The head runs `ray start --head --block` in its own process group with a private temp dir
and non-default ports, so it never attaches to (or is attached by) any other Ray on the
machine; it is stopped by its process id, never with `ray stop`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def ray_cluster():
    """Yields {'address': 'IP:PORT', 'dashboard': 'http://IP:PORT', 'env': env for subprocesses}."""
    temp_dir = tempfile.mkdtemp(prefix="slray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dashboard, agent = _free_port(), _free_port(), _free_port()
    # PATH leads with this venv: `ray job submit` entrypoints (`scaling ...`) run in the head's environment.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={agent}",
         "--num-cpus=2", "--num-gpus=0", f"--temp-dir={temp_dir}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        probe = subprocess.run([str(BIN / "ray"), "status", f"--address={address}"], env=env, capture_output=True)
        if probe.returncode == 0 and _http_ok(f"http://127.0.0.1:{dashboard}/api/version"):
            break  # the job server (dashboard) comes up a few seconds after the GCS
        if time.time() > deadline or head.poll() is not None:
            os.killpg(head.pid, signal.SIGKILL)
            raise RuntimeError(f"test Ray head did not start: {probe.stderr.decode()[-500:]}")
        time.sleep(1)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        yield {"address": address, "dashboard": f"http://127.0.0.1:{dashboard}", "env": {**env, "RAY_ADDRESS": address}}
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_connected(ray_cluster):
    """This test process attached to the session cluster as a driver."""
    import ray

    if not ray.is_initialized():
        os.environ["RAY_ADDRESS"] = ray_cluster["address"]
        from scaling.launch.ray_train import connect

        connect()
    return ray_cluster


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "scaling"), *args], cwd=REPO, env=env or os.environ.copy(),
        capture_output=True, text=True, timeout=timeout,
    )
