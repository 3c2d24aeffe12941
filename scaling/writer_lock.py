"""One writer per run or sweep directory: a lock file that names its holder and keeps a heartbeat.

    with WriterLock(sweep_dir, "scaling sweep", wait=False):   # UsageError (one line) if held
        ...                                                   # run the sweep

The lock is `DIR/.writer.lock`, created with `O_CREAT | O_EXCL` (atomic on a local filesystem and
on NFS, the storage every node of a cluster sees), holding JSON: the holder's host, process id,
the process's start (so a recycled pid is not mistaken for it), the command, when it took the
lock, and a token. While held, a thread touches the file every `HEARTBEAT_S`: its modification
time is the heartbeat. A lock is **stale**, and taken over with one line saying so, when

- its holder was on this host and that process is gone (killed outright, SIGKILL included), or
- its holder was on another host and its heartbeat is older than `STALE_AFTER_S` (a lost node).

A takeover is itself serialised by `DIR/.writer.lock.takeover` (O_EXCL too), so two processes that
both find a stale lock cannot both take it. The writer's worker processes (Ray Train's workers,
torchrun's ranks) write their own files under the holder's directory as before: the lock is the
driver's, and `HELD_ENV` tells a process started under it (`held_here`) not to lock again.

Readers take no lock: every file is written atomically (scaling/results.py), a run's summary is its
last file, and `SweepDir` reads only runs that have one; `holder()` tells a reader who is writing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from scaling.errors import UsageError

LOCK_NAME = ".writer.lock"
TAKEOVER_NAME = ".writer.lock.takeover"
FILES = (LOCK_NAME, TAKEOVER_NAME)  # what the lock puts in a directory
HEARTBEAT_S = 5.0
# a holder on another host is presumed gone after this long without a heartbeat: 12 missed beats,
# far beyond a busy host's scheduling delays, short beside a sweep's runs
STALE_AFTER_S = 60.0
WAIT_POLL_S = 1.0
# set, for the processes a holder starts, to the directory it holds (os.pathsep-separated if several)
HELD_ENV = "SCALING_WRITER_LOCK_HELD"


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    now = _process_start(pid)
    if now is None:
        try:  # not Linux's /proc: ask the kernel
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return started is None or now == started


def describe(holder: dict) -> str:
    """'host H, process P, since T (command)': who holds a lock, for one line."""
    since = holder.get("since", "?")
    return (
        f"{holder.get('command', 'a writer')} on host {holder.get('host')}, process {holder.get('pid')}, since {since}"
    )


def holder(directory: Path) -> dict | None:
    """The live holder of `directory`'s lock (its JSON, with `heartbeat_age_s`), or None when the
    directory has no lock or its lock is stale."""
    path = Path(directory) / LOCK_NAME
    try:
        info = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError):
        return None
    info["heartbeat_age_s"] = age
    return None if _stale(info, age) else info


def _stale(info: dict, heartbeat_age_s: float) -> bool:
    if info.get("host") == socket.gethostname():
        return not _alive(int(info.get("pid", -1)), info.get("process_start"))
    return heartbeat_age_s > STALE_AFTER_S


def held_here(directory: Path) -> bool:
    """Whether this process runs under the holder of `directory` or of a directory above it
    (`HELD_ENV`, which a holder sets for the processes it starts)."""
    target = Path(directory).resolve()
    for held in filter(None, os.environ.get(HELD_ENV, "").split(os.pathsep)):
        held = Path(held)
        if target == held or held in target.parents:
            return True
    return False


class WriterLock:
    """Hold `directory`'s writer lock for a `with` block (module docstring).

    `wait=False`: a live holder ends it in a `UsageError` naming the holder (the CLI's one line,
    exit 2). `wait=True`: it waits for the holder to finish (or die), saying so once through `say`.
    Entering creates the directory if needed; leaving removes the lock (and the folders it made, if
    nothing else was written there). Inside the block `HELD_ENV` names the
    directory, so processes started from it (the workers) write without locking again.
    """

    def __init__(self, directory: Path, command: str, wait: bool = False, say=print):
        self.directory = Path(directory).absolute()
        self.path = self.directory / LOCK_NAME
        self.command, self.wait, self.say = command, wait, say
        self.info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "process_start": _process_start(os.getpid()),
            "command": command,
            "token": uuid.uuid4().hex,
        }
        self._made: list[Path] = []
        self._reentrant = False  # this very process holds it already (a second meter in one job)
        self._announced = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._previous_env: str | None = None

    # --- taking it ---------------------------------------------------------------------------------
    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        self.info["since"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        with os.fdopen(fd, "w") as f:
            json.dump(self.info, f)
        return True

    def _take_over(self) -> dict | None:
        """Remove a stale lock, once, under the takeover file; returns the stale holder, or None if
        the lock was live, gone, or another process is taking it over."""
        takeover = self.directory / TAKEOVER_NAME
        try:
            fd = os.open(takeover, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:  # a taker that died while taking over: its file is old
                if time.time() - takeover.stat().st_mtime > STALE_AFTER_S:
                    takeover.unlink(missing_ok=True)
            except OSError:
                pass
            return None
        os.close(fd)
        try:
            try:
                stale = json.loads(self.path.read_text())
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            except ValueError:  # a lock file being written this instant, or torn: judge by its age
                stale, age = {}, time.time() - self.path.stat().st_mtime
                if age < STALE_AFTER_S:
                    return None
            if stale and not _stale(stale, age):
                return None
            self.path.unlink(missing_ok=True)
            return stale
        finally:
            takeover.unlink(missing_ok=True)

    def acquire(self) -> None:
        self._wait_for_holders_above()
        if not self.directory.exists():
            # the folders this makes, deepest first: a refusal removes them again
            self._made = [self.directory, *(d for d in self.directory.parents if not d.exists())]
            self.directory.mkdir(parents=True)
        try:
            if self._wait_and_create():
                self._beat = threading.Thread(target=self._heartbeat, name="writer-lock-heartbeat", daemon=True)
                self._beat.start()
        except BaseException:  # refused, or interrupted while waiting: leave nothing behind
            self._remove_made_directory()
            raise
        self._previous_env = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = os.pathsep.join(filter(None, [self._previous_env, str(self.directory)]))

    def _busy(self, current: dict, where: Path) -> None:
        """Refuse (UsageError) or, waiting, say once who holds `where`."""
        if not self.wait:
            held = "" if where == self.directory else f" (it is inside {where})"
            raise UsageError(
                f"{self.directory} is being written by {describe(current)}{held}: wait for it "
                f"(--wait), or choose another --out"
            )
        if not self._announced:
            self.say(f"waiting for {describe(current)} to finish writing {where}")
            self._announced = True
        time.sleep(WAIT_POLL_S)

    def _wait_for_holders_above(self) -> None:
        """A run directory inside a sweep another process writes is that process's to write."""
        for above in self.directory.parents:
            if held_here(above):
                return
            while (current := holder(above)) is not None and current.get("pid") != os.getpid():
                self._busy(current, above)

    def _wait_and_create(self) -> bool:
        """Take the lock (True), or find this process holding it already (False)."""
        while not self._create():
            current = holder(self.directory)
            if current is None:
                stale = self._take_over()
                if stale is not None:
                    self.say(f"taking over {self.directory}: its writer is gone ({describe(stale)})")
                else:
                    time.sleep(0.05)  # another process is taking it over, or it was just released
                continue
            if current.get("host") == self.info["host"] and current.get("pid") == self.info["pid"]:
                self._reentrant = True
                return False
            self._busy(current, self.directory)
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:  # removed under us (a takeover judged us gone): nothing to beat
                return

    # --- giving it back ----------------------------------------------------------------------------
    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._previous_env is None:
            os.environ.pop(HELD_ENV, None)
        else:
            os.environ[HELD_ENV] = self._previous_env
        if self._reentrant:
            return
        try:
            if json.loads(self.path.read_text()).get("token") == self.info["token"]:
                self.path.unlink()
        except (OSError, ValueError):
            pass
        self._remove_made_directory()

    def _remove_made_directory(self) -> None:
        for made in self._made:
            try:
                made.rmdir()  # only if empty: a refused command leaves nothing behind
            except OSError:
                return

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
