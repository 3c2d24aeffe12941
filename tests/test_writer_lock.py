"""One writer per run and sweep directory (scaling/writer_lock.py).

The unit tests hold the lock's rules against made-up holders: a live process on this host (pid 1,
whose start time is read from /proc), a recycled pid (pid 1 with another start time), a holder on
another host with a fresh or a stale heartbeat. The slow test is the user's mistake itself: one
sweep submitted twice into one directory, a report while it runs, its driver killed outright, and
a second submission that waits (tests/gated_job.py lets each run finish only when the test says).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from scaling import writer_lock
from scaling.errors import UsageError
from scaling.writer_lock import LOCK_NAME, WriterLock
from tests.conftest import BIN, REPO
from tests.gated_job import GATES_ENV


def _plant(directory: Path, host: str, pid: int, process_start, heartbeat_age_s: float = 0.0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    info = {"host": host, "pid": pid, "process_start": process_start, "command": "scaling sweep"}
    path.write_text(json.dumps({**info, "since": "2026-12-02T08:00:00+00:00", "token": "planted"}))
    when = time.time() - heartbeat_age_s
    os.utime(path, (when, when))
    return path


def test_a_live_holder_is_refused_in_one_line_naming_it(tmp_path):
    _plant(tmp_path, socket.gethostname(), 1, writer_lock._process_start(1))
    with pytest.raises(UsageError) as refused:
        WriterLock(tmp_path, "scaling sweep").acquire()
    message = str(refused.value)
    assert "\n" not in message and f"host {socket.gethostname()}, process 1, since 2026-12-02" in message
    assert "--wait" in message
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == "planted"  # the holder's lock untouched


def test_a_holder_on_another_host_is_live_while_its_heartbeat_is(tmp_path):
    _plant(tmp_path, "another-node", 4242, "123", heartbeat_age_s=writer_lock.STALE_AFTER_S / 2)
    with pytest.raises(UsageError, match="host another-node, process 4242"):
        WriterLock(tmp_path, "scaling sweep").acquire()


@pytest.mark.parametrize(
    "host, pid, start, age",
    [
        ("here", 1, "0", 0.0),  # pid 1 is alive, but not the process that took the lock (pid reused)
        ("another-node", 4242, "123", writer_lock.STALE_AFTER_S * 2),  # a lost node: no heartbeat
    ],
)
def test_a_gone_holder_is_taken_over_with_one_line(tmp_path, host, pid, start, age):
    _plant(tmp_path, socket.gethostname() if host == "here" else host, pid, start, heartbeat_age_s=age)
    said = []
    with WriterLock(tmp_path, "scaling sweep", say=said.append) as lock:
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["token"] == lock.info["token"] and held["pid"] == os.getpid()
        assert writer_lock.held_here(tmp_path / "runs" / "w1-r0")  # the workers it starts write freely
    assert len(said) == 1 and said[0].startswith(f"taking over {tmp_path}: its writer is gone")
    assert f"process {pid}" in said[0]
    assert not (tmp_path / LOCK_NAME).exists() and not writer_lock.held_here(tmp_path)


def test_waiting_takes_the_lock_once_the_holder_lets_go(tmp_path):
    first = WriterLock(tmp_path, "scaling sweep")
    first.info["pid"] = 1  # as if another process: this one's second lock would be its own
    first.info["process_start"] = writer_lock._process_start(1)
    first.acquire()
    said = []
    releaser = threading.Timer(3 * writer_lock.WAIT_POLL_S, first.release)
    releaser.start()
    waited = time.monotonic()
    with WriterLock(tmp_path, "scaling sweep", wait=True, say=said.append):
        waited = time.monotonic() - waited
    releaser.join()
    assert waited >= 3 * writer_lock.WAIT_POLL_S
    assert len(said) == 1 and said[0].startswith("waiting for scaling sweep on host")


def test_the_heartbeat_moves_and_a_refusal_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_lock, "HEARTBEAT_S", 0.05)
    with WriterLock(tmp_path / "sweep", "scaling sweep"):
        path = tmp_path / "sweep" / LOCK_NAME
        old = time.time() - 100
        os.utime(path, (old, old))
        time.sleep(0.5)
        assert time.time() - path.stat().st_mtime < 50
    assert not (tmp_path / "sweep").exists()  # made by the lock, empty, removed

    # a run directory inside a sweep that another process writes is refused, and not made
    _plant(tmp_path / "held", socket.gethostname(), 1, writer_lock._process_start(1))
    with pytest.raises(UsageError, match=r"process 1, since .*\(it is inside .*held\)"):
        WriterLock(tmp_path / "held" / "runs" / "w1-r0", "scaling run").acquire()
    assert not (tmp_path / "held" / "runs").exists()


def test_one_process_holding_it_already_is_not_refused(tmp_path):
    with WriterLock(tmp_path, "scaling.instrument.attach"):
        with WriterLock(tmp_path, "scaling.instrument.attach"):  # a second meter of the same job
            pass
        assert (tmp_path / LOCK_NAME).exists()  # still the outer one's
    assert not (tmp_path / LOCK_NAME).exists()


# --- the user's mistake: one sweep submitted twice --------------------------------------------------

TINY = ["data.train_samples=256", "data.val_samples=64", "train.max_epochs=1", "instrument.calibration_pairs=0"]


def _sweep_config(tmp_path: Path) -> Path:
    """The quickstart with a gated model (tests/gated_job.py), 2 repeats at 1 worker."""
    config = (REPO / "experiments" / "quickstart.yaml").read_text()
    config += "sweep:\n  workers: [1]\n  repeats: 2\n"
    path = tmp_path / "gated.yaml"
    path.write_text(config)
    return path


def _sweep(config: Path, out: Path, gates: Path, *flags: str) -> subprocess.Popen:
    sets = [arg for value in ["model.name=tests.gated_job:gated_model", *TINY] for arg in ("--set", value)]
    return subprocess.Popen(
        [str(BIN / "scaling"), "sweep", str(config), "--launcher", "local", "--out", str(out), *sets, *flags],
        cwd=REPO,
        env={**os.environ, GATES_ENV: str(gates)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killed outright with its workers below
    )


def _wait_for(condition, what: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the sweep ended ({process.returncode}) before {what}:\n{out[-2000:]}\n{err[-2000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _fingerprint(run: Path) -> dict:
    return {
        p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()
    }


@pytest.mark.slow
def test_a_sweep_submitted_twice_refuses_reports_and_resumes_after_a_kill(tmp_path):
    gates, out = tmp_path / "gates", tmp_path / "sweep"
    gates.mkdir()
    config = _sweep_config(tmp_path)
    (gates / "w1-r0").touch()  # the first run may train; the second waits at its gate
    first = _sweep(config, out, gates)
    first_run, second_run = out / "runs" / "w1-r0", out / "runs" / "w1-r1"
    _wait_for(lambda: (first_run / "summary.json").exists() and second_run.exists(), "the first run's end", first)
    finished = _fingerprint(first_run)

    # the same sweep again, while the first runs: refused in one line naming the first's driver, exit 2
    second = _sweep(config, out, gates)
    second_out, second_err = second.communicate(timeout=300)
    assert second.returncode == 2 and second_out == "", second_out
    assert second_err.count("\n") == 1 and f"process {first.pid}" in second_err, second_err
    assert "being written by scaling sweep" in second_err

    # a report meanwhile reads the finished run and says the other is still being written
    report = subprocess.run(
        [str(BIN / "scaling"), "report", str(out), "--no-figures", "--out", str(tmp_path / "report")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    said = report.stdout + report.stderr
    assert "the sweep is being written" in said and "1 finished runs read, 1 without a summary yet" in said, said
    assert first.poll() is None and _fingerprint(first_run) == finished

    # the driver and its workers killed outright: the next submission takes over with one line
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert (out / LOCK_NAME).exists()  # the dead holder's lock is left behind
    resumed = _sweep(config, out, gates)
    _wait_for(lambda: (writer_lock.holder(out) or {}).get("pid") == resumed.pid, "the resumed sweep's lock", resumed)

    # a third submission with --wait waits for the resumed one, then runs nothing twice
    waiting = _sweep(config, out, gates, "--wait")
    time.sleep(3)  # long enough for it to start and find the lock held
    assert waiting.poll() is None
    (gates / "w1-r1").touch()
    resumed_out, resumed_err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, resumed_err
    assert f"taking over {out}: its writer is gone (scaling sweep on host" in resumed_out + resumed_err
    assert f"process {first.pid}" in resumed_out + resumed_err
    assert "resuming: 1 of 2 runs already finished, 1 to run" in resumed_out
    assert _fingerprint(first_run) == finished
    after_resume = _fingerprint(second_run)
    waiting_out, waiting_err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, waiting_err
    assert f"waiting for scaling sweep on host {socket.gethostname()}, process {resumed.pid}" in waiting_out
    assert "resuming: 2 of 2 runs already finished, 0 to run" in waiting_out
    assert _fingerprint(first_run) == finished and _fingerprint(second_run) == after_resume
    assert not (out / LOCK_NAME).exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "attach"])
def test_run_and_attach_refuse_a_directory_another_process_writes(tmp_path, command, capsys):
    from scaling.cli import main

    out = tmp_path / "run"
    _plant(out, socket.gethostname(), 1, writer_lock._process_start(1))
    if command == "run":
        argv = ["run", str(REPO / "experiments" / "quickstart.yaml"), "--launcher", "local", "--out", str(out)]
    else:
        argv = ["attach", "--out", str(out), "--", "true"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "is being written by scaling sweep on host" in captured.err
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing of a run written


@pytest.mark.slow
def test_a_job_on_its_own_holds_its_run_directory_from_rank_0(tmp_path):
    import torch
    from torch import nn

    from scaling import instrument

    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with instrument.attach(model, optimizer, run_dir=tmp_path / "job") as meter:
        assert writer_lock.holder(tmp_path / "job")["command"] == "scaling.instrument.attach"
        for x in meter.batches([torch.randn(8, 4) for _ in range(3)]):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        meter.end_epoch(val_accuracy=0.5)
    assert not (tmp_path / "job" / LOCK_NAME).exists() and (tmp_path / "job" / "summary.json").exists()
    _plant(tmp_path / "other", socket.gethostname(), 1, writer_lock._process_start(1))
    with pytest.raises(UsageError, match="being written by scaling sweep"):
        instrument.attach(model, optimizer, run_dir=tmp_path / "other")
