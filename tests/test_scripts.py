"""The scripts in bench/ and scripts/ as a user meets them: `--help` answers without starting a
process, opening a connection or sleeping (a Python audit hook watches) and does nothing else, and a script that builds
a minicluster takes it down on SIGTERM and SIGINT as on a normal exit (scaling.testbed.minicluster.running).

The --help checks run each script as a user runs it (slow tier: a subprocess each); the
teardown checks drive `running` in this process with `up` and `down` stood in for, and signal
this process itself (unit tier: a real minicluster needs root and tens of seconds, and the
session's own minicluster must not have a second one beside it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaling.testbed import minicluster as mc

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*REPO.glob("bench/*.py"), *(p for p in (REPO / "scripts").iterdir() if p.is_file())])
HELP_TIMEOUT_S = 120  # a hang's bound, not a check: how long --help takes on a loaded machine is no proof
# A Python script runs as `python script --help` would (the script's folder first on sys.path, run as
# __main__), with an audit hook (PEP 578) that records each attempt to start a process or open a
# connection, and time.sleep wrapped to record each sleep (Python 3.11 audits no sleep): --help answers
# without any (an order, not a duration: docs/testing.md, timing checks).
AUDITED = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec", "socket.connect")
AUDIT_RUNNER = f"""
import os, runpy, sys, time
script = sys.argv[1]
seen = []
def hook(event, args):
    if event in {AUDITED!r}:
        seen.append(event + ' ' + repr(args)[:200])
sys.addaudithook(hook)
sleep = time.sleep
def recorded_sleep(seconds):
    seen.append('time.sleep ' + repr(seconds))
    sleep(seconds)
time.sleep = recorded_sleep
sys.argv = [script, *sys.argv[2:]]
sys.path[0] = os.path.dirname(os.path.abspath(script))
try:
    runpy.run_path(script, run_name='__main__')
finally:
    print('AUDIT ' + repr(seen), file=sys.stderr)
"""


def _namespaces() -> set[str]:
    try:
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    except OSError:  # no iproute2: nothing can make a namespace either
        return set()
    # Another test session's probe or minicluster (tests/conftest.py) may come and go meanwhile.
    return {
        line.split()[0]
        for line in listing.splitlines()
        if line.strip() and not line.startswith(("scaling-probe-", "scaling-tests-"))
    }


def _files(*roots: Path) -> dict[str, int]:
    """Every file under the roots (bytecode caches aside) with its modification time."""
    found = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found[str(path)] = path.stat().st_mtime_ns
    return found


def test_every_script_is_checked():
    names = {p.relative_to(REPO).as_posix() for p in SCRIPTS}
    assert {
        "bench/minicluster_bandwidth.py",
        "bench/projection_vs_minicluster.py",
        "scripts/gpu_first_contact.py",
        "scripts/build_horovod.sh",
    } <= names


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_help_starts_nothing_and_does_nothing_else(script, tmp_path):
    command = ["bash", str(script)] if script.suffix == ".sh" else [sys.executable, "-c", AUDIT_RUNNER, str(script)]
    cwd, tmp, state = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "minicluster-state"
    for folder in (cwd, tmp):
        folder.mkdir()
    # A script that wrongly went on would leave its traces here (a minicluster's state file,
    # Ray's session folder, a relative output) or in the repository, or make a namespace.
    env = {**os.environ, "TMPDIR": str(tmp), "SCALING_MINICLUSTER_STATE": str(state), "PYTHONDONTWRITEBYTECODE": "1"}
    repo_before, namespaces_before = _files(REPO / "bench", REPO / "scripts"), _namespaces()
    result = subprocess.run(
        [*command, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=HELP_TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:"), result.stdout[:300]
    assert script.name in result.stdout.splitlines()[0]
    if script.suffix == ".py":
        audit = [line for line in result.stderr.splitlines() if line.startswith("AUDIT ")]
        assert audit == ["AUDIT []"], audit or result.stderr[-2000:]  # no process, connection or sleep
    assert not any(cwd.iterdir()) and not any(tmp.iterdir()) and not state.exists()
    assert _files(REPO / "bench", REPO / "scripts") == repo_before
    assert _namespaces() <= namespaces_before


@pytest.mark.parametrize(
    "script", ["bench/minicluster_bandwidth.py", "bench/projection_vs_minicluster.py", "bench/projection_own_jobs.py"]
)
def test_minicluster_scripts_refuse_an_unknown_argument(script, tmp_path, monkeypatch, capsys):
    """Run as __main__ in this process (unit tier: the guard refuses any process start, so the refusal
    comes before anything is built), with the minicluster state kept under tmp_path."""
    import runpy

    monkeypatch.setattr(mc, "STATE_ROOT", tmp_path / "state")
    monkeypatch.setenv("SCALING_MINICLUSTER_STATE", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / script), "--no-such-flag"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first on it
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(REPO / script), run_name="__main__")
    assert exited.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


# --------------------------------------------------------------------------- teardown on signals


@pytest.fixture
def stand_in_cluster(monkeypatch):
    """`up` and `down` recorded instead of run; `calls` lists them in order."""
    calls = []
    monkeypatch.setattr(mc, "up", lambda *args, **kwargs: calls.append("up") or "cluster")
    monkeypatch.setattr(mc, "down", lambda name, log=print: calls.append(f"down {name}"))
    return calls


def _handlers():
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def _wait_for_the_signal():
    time.sleep(30)  # a handler that raises ends the sleep at once
    raise AssertionError("the signal did not end the block")


def test_running_takes_the_cluster_down_on_a_normal_exit(stand_in_cluster):
    before = _handlers()
    with mc.running(2, name="unit") as cluster:
        assert cluster == "cluster" and stand_in_cluster == ["up"]
    assert stand_in_cluster == ["up", "down unit"]
    assert _handlers() == before


@pytest.mark.parametrize(
    "signum, raised, status", [(signal.SIGTERM, SystemExit, 143), (signal.SIGINT, KeyboardInterrupt, None)]
)
def test_running_takes_the_cluster_down_when_signalled(stand_in_cluster, signum, raised, status):
    before = _handlers()
    with pytest.raises(raised) as ended:
        with mc.running(2, name="unit"):
            os.kill(os.getpid(), signum)
            _wait_for_the_signal()
    assert stand_in_cluster == ["up", "down unit"]
    if status is not None:
        assert ended.value.code == status
    assert _handlers() == before


def test_a_signal_during_the_teardown_waits_for_it(monkeypatch):
    finished = []

    def slow_down(name, log=print):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the signal arrives here; it must not cut the teardown short
        finished.append(name)

    monkeypatch.setattr(mc, "up", lambda *args, **kwargs: "cluster")
    monkeypatch.setattr(mc, "down", slow_down)
    with pytest.raises(SystemExit) as ended:
        with mc.running(2, name="unit"):
            pass
    assert finished == ["unit"] and ended.value.code == 143
