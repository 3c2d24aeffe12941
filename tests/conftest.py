"""Shared fixtures: one real Ray cluster and one minicluster per test session, the capabilities a
runner must have, and the test tiers.

The head is scaling.testbed.local_cluster's `private_ray_head` (the benchmarks' too): `ray start
--head --block` in its own process group with a private temp dir and free ports, so it never
attaches to (or is attached by) any other Ray on the machine; it is stopped by its process id,
never with `ray stop`.

`minicluster`: one 2-node minicluster (network namespaces, one Ray node each) for every test that
needs one. Run in one process, its tests run last (`pytest_collection_modifyitems`) so that its nodes
idle beside no other test; in two (`make test`), its tier is one group, handed out first
(`FileGroupScheduling`). A test that preempts a node gives it back (`whole_minicluster`). It is taken
down after its tier's last test (`_take_the_minicluster_down_after_its_tier`).

Capabilities (`CAPABILITIES`): where this process cannot build the minicluster's network, or
Horovod does not import, or no Prometheus server is installed, the tests that need them skip
with the reason — on a developer's machine. A runner that declares them required
(`SCALING_TEST_REQUIRE=netns,horovod,prometheus`, as `.ci/run`
does) fails at once, in one line naming what is missing: a CI machine that lost a capability
must not lose its proofs in silence.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from scaling.testbed.local_cluster import private_ray_head

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# Every Ray node the suite starts (the session heads, the minicluster's nodes) inherits these.
# - Ray's raylet starts its workers at nice 15 (`worker_niceness`), so that its own daemons win the
#   CPU. Beside the other pytest process, whose local runs train at nice 0, a Ray Train worker then
#   got about 3% of a contested core (the scheduler's weights for nice 15 and 0: 36 and 1024), and
#   the Ray tier, the suite's longest path, waited on the rest: the same processes at the same
#   priority share the 2 cores evenly.
# - Ray Train's preemption watcher, an actor per run (a process importing Ray Train: 3 s of CPU
#   here) that relays a node's drain notice; no test drains a node (the minicluster's preemption
#   kills it), and nothing of the lab reads the notice.
os.environ.setdefault("RAY_worker_niceness", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    """Yields {'address': 'IP:PORT', 'dashboard': 'http://IP:PORT', 'env': env for subprocesses}."""
    # env: this venv first on PATH, so `ray job submit` entrypoints (`scaling ...`) run in the head's environment
    with private_ray_head(num_cpus=2, timeout_s=90, prefix="slray-") as head:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        try:
            yield {
                "address": head.address,
                "dashboard": head.dashboard,
                "env": {**head.env, "RAY_ADDRESS": head.address},
            }
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
        [
            "ip",
            "netns",
            "exec",
            namespace,
            "tc",
            "qdisc",
            "replace",
            "dev",
            "lab0",
            "root",
            "tbf",
            "rate",
            "100mbit",
            "burst",
            "65536",
            "latency",
            "200ms",
        ],
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


def horovod_capability() -> str | None:
    """None if Horovod imports with its torch extension (`make horovod`); otherwise why not."""
    from scaling.train import horovod_backend

    ok, why = horovod_backend.available()
    return None if ok else (why or "horovod does not import")


@functools.lru_cache(maxsize=None)
def prometheus_capability() -> str | None:
    """None if a Prometheus server runs here (`prometheus --version`: Debian's package, apt-get install
    prometheus); otherwise why not. The dashboard's queries are checked against it (tests/test_dashboard.py)."""
    if shutil.which("prometheus") is None:
        return "no `prometheus` on PATH (apt-get install prometheus)"
    try:
        probe = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`prometheus --version` did not run: {exc}"
    if probe.returncode != 0:
        return f"`prometheus --version` failed: {(probe.stderr.strip() or f'exit {probe.returncode}').splitlines()[-1]}"
    return None


def _package_capability(name: str, extra: str):
    def probe() -> str | None:
        import importlib.util

        return (
            None
            if importlib.util.find_spec(name)
            else f"{name} is not installed (the {extra} extra: make install-test)"
        )

    return probe


# The other CPython minor versions the wheel is installed into (tests/test_packaging.py)
OTHER_PYTHONS = ("3.10", "3.12", "3.13")


def other_python(minor: str) -> Path | None:
    """An interpreter of CPython `minor` (e.g. "3.12") on this machine, or None: pyenv's, then PATH's."""
    found = sorted(Path.home().glob(f".pyenv/versions/{minor}.*/bin/python{minor}"))
    if found:
        return found[-1]
    on_path = shutil.which(f"python{minor}")
    return Path(on_path) if on_path else None


def pythons_capability() -> str | None:
    """None if CPython 3.12 and 3.13 are here (pyenv's, or on PATH); otherwise which are not."""
    missing = [minor for minor in OTHER_PYTHONS if other_python(minor) is None]
    return f"no Python {' or '.join(missing)} here (pyenv install, or on PATH)" if missing else None


# What a runner may lack, each with its probe (None: present). `.ci/run` requires them all.
CAPABILITIES = {
    "netns": netns_capability,
    "horovod": horovod_capability,
    "prometheus": prometheus_capability,
    "transformers": _package_capability("transformers", "hf"),
    "lightning": _package_capability("lightning", "lightning"),
    "pythons": pythons_capability,
}
REQUIRE_ENV = "SCALING_TEST_REQUIRE"


def missing_capabilities(declared: str, probes: dict = CAPABILITIES) -> str | None:
    """One line naming each declared capability (comma- or space-separated names) that `probes`
    finds missing, or None when all are present."""
    required = [name for name in declared.replace(",", " ").split() if name]
    unknown = sorted(set(required) - set(probes))
    if unknown:
        return f"{REQUIRE_ENV}: unknown capability {', '.join(unknown)} (known: {', '.join(probes)})"
    missing = [(name, why) for name in required if (why := probes[name]()) is not None]
    if not missing:
        return None
    return f"{REQUIRE_ENV}: " + "; ".join(f"required capability '{name}' is missing: {why}" for name, why in missing)


def pytest_configure(config):
    why = missing_capabilities(os.environ.get(REQUIRE_ENV, ""))
    if why is not None:
        raise pytest.UsageError(why)
    if config.getvalue("dist") == "loadgroup" and not os.environ.get("PYTEST_XDIST_WORKER"):
        # the controller, before it starts its workers (which inherit the variable): `_share_groups`
        os.environ[GROUPS_ENV] = str(Path(tempfile.mkdtemp(prefix="scaling-test-groups-")) / "groups.json")
    # matplotlib builds its font cache on first import by running fc-list: once, here, rather than
    # inside whichever unit-tier test first draws a figure (where starting a process is refused)
    import matplotlib.font_manager  # noqa: F401


# --- the session's minicluster ---------------------------------------------------------------------

MINICLUSTER_NAME = "tests"  # not the default ("lab"): a user's own minicluster is left alone
MINICLUSTER_SUBNET = "10.214.0.0/24"


def minicluster_leftovers(name: str) -> list[str]:
    """Namespaces and links of minicluster `name` that the kernel still has."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (namespaces + links).splitlines() if f"scaling-{name}-" in line or f"sm{name}" in line]


@pytest.fixture(scope="session")
def minicluster(netns_capable):
    """The name of a 2-node minicluster (uncapped, Ray up on both nodes), built once per session
    through the CLI as a user builds one; `down` must remove exactly what `up` made."""
    from scaling.cli import main

    if minicluster_leftovers(MINICLUSTER_NAME):
        # a session killed outright (SIGKILL: no teardown ran) leaves its nodes up; the name is the suite's own
        print(f"\nminicluster {MINICLUSTER_NAME!r} left up by a killed pytest run: taking it down", file=sys.stderr)
        stale = run_cli("minicluster", "down", "--name", MINICLUSTER_NAME)
        assert stale.returncode == 0, stale.stderr
    result = run_cli("minicluster", "up", "--nodes", "2", "--name", MINICLUSTER_NAME, "--subnet", MINICLUSTER_SUBNET)
    assert result.returncode == 0, result.stderr

    def take_down():
        down = run_cli("minicluster", "down", "--name", MINICLUSTER_NAME)
        assert down.returncode == 0, down.stderr
        assert not minicluster_leftovers(MINICLUSTER_NAME)
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            status = main(["minicluster", "status", "--name", MINICLUSTER_NAME])
        assert status == 2 and "no minicluster named" in said.getvalue(), said.getvalue()  # gone for the CLI too

    _MINICLUSTER_DOWN.append(take_down)
    try:
        assert minicluster_leftovers(MINICLUSTER_NAME), (
            "the minicluster's namespaces and links should exist while it is up"
        )
        yield MINICLUSTER_NAME
    finally:
        if _MINICLUSTER_DOWN:  # not yet taken down after its tier's last test
            _MINICLUSTER_DOWN.pop()()


# The session minicluster's teardown while it is up. Its two Ray nodes, idle, cost about 6% of a core each
# (a Ray node's daemons); its tier's tests run together (`pytest_collection_modifyitems`), so it is taken
# down after the last of them rather than at the session's end, minutes later in `make test`.
_MINICLUSTER_DOWN: list = []


def _take_the_minicluster_down_after_its_tier(item, nextitem) -> None:
    """After a test's teardown (whole_minicluster has put the nodes back): down if its tier is done here."""
    if (
        _MINICLUSTER_DOWN
        and item.get_closest_marker("minicluster") is not None
        and (nextitem is None or nextitem.get_closest_marker("minicluster") is None)
    ):
        _MINICLUSTER_DOWN.pop()()


def make_whole(name: str) -> None:
    """Every node of minicluster `name` up and its links uncapped, whatever a test did to it."""
    from scaling.testbed import minicluster as mc

    cluster = mc.load(name)
    for node in cluster.nodes[1:]:
        if not mc.node_running(cluster, node.index):
            mc.rejoin(name, node.index)
    if cluster.bandwidth is not None:
        mc.set_bandwidth(None, name)


@pytest.fixture
def whole_minicluster(minicluster):
    """The session's minicluster with both nodes up and uncapped, before and after the test."""
    make_whole(minicluster)
    yield minicluster
    make_whole(minicluster)


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "scaling"), *args],
        cwd=REPO,
        env=env or os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=timeout,
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
    "test_ground_truth",
    "test_precision",
    "test_attribution",
    "test_instrument_api",
    "test_sweep",
    "test_failures",
    "test_interrupts",
    "test_own_job",
    "test_amoebanet",
    "test_models",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        fixtures = set(getattr(item, "fixturenames", ()))
        tiers = set()
        if fixtures & {"ray_cluster", "ray_connected"}:
            tiers.add("ray")
        if fixtures & {"netns_capable", "minicluster", "whole_minicluster"}:
            tiers.add("minicluster")
        if module.startswith("test_horovod"):
            tiers.add("horovod")
        if module in SLOW_MODULES or item.get_closest_marker("slow"):
            tiers.add("slow")
        for tier in tiers or {"unit"}:
            item.add_marker(getattr(pytest.mark, tier))
        if tiers:  # a unit test is a group of its own (the scheduler's default)
            item.add_marker(pytest.mark.xdist_group("minicluster" if "minicluster" in tiers else module))
    _share_groups(items)

    # In one process: the unit tier first, then the others, the minicluster's tests last, together (its
    # Ray nodes then idle beside no other test). Unit tests thus run before any test attaches this process
    # to Ray as a driver: under `make test` as under `make test-fast` (`_unit_guard` checks it).
    # In parallel, the minicluster's group first (the scheduler's queue keeps the collection's order and
    # hands out its first unit first), then the unit tests, then the others.
    def order(item):
        unit_last = item.get_closest_marker("unit") is None
        minicluster = item.get_closest_marker("minicluster") is not None
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return (not minicluster, unit_last)
        return (minicluster, unit_last)

    items.sort(key=order)


# --- `make test` in two processes (pytest-xdist, `-n 2 --dist loadgroup`) ---------------------------
# Much of the suite's time is spent waiting (Ray starting actors and reporting, a lost node declared
# dead, a restart waiting for room, a node rejoining), so two worker processes share the two cores'
# work. The minicluster is a session fixture: its tier is one group, handed out first, so one worker
# builds it and runs its tests while the other runs the unit tests and then the rest; once done with
# the tier, that worker takes the minicluster down and groups from the rest.
# Each module's other tests that are not unit tests form a group (its module-scoped runs are made once);
# each worker that reaches a Ray-tier test starts its own session head. A unit test may not run in a
# Ray driver (`_unit_guard`): the unit tests are queued right after the minicluster's group, and the
# other worker has taken them all long before the minicluster's tests are done.


# pytest-xdist's loadgroup finds a test's group in a suffix of its node id, which pytest 9 no longer lets
# a plugin set: the workers write {node id: group} to a file the controller names (GROUPS_ENV), read by
# the scheduler instead.
GROUPS_ENV = "SCALING_TEST_GROUPS"


def _share_groups(items) -> None:
    path = os.environ.get(GROUPS_ENV)
    if not path or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    groups = {}
    for item in items:
        group = item.get_closest_marker("xdist_group")
        if group is not None:
            groups[item.nodeid] = group.args[0]
    partial = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
    Path(partial).write_text(json.dumps(groups))
    os.replace(partial, path)  # every worker collects the same tests: whichever lands last is whole


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        """loadgroup (run with --no-loadscope-reorder: the queue keeps the collection's order), each test's
        group read from the file the workers wrote (`_share_groups`)."""

        _groups: dict | None = None

        def _split_scope(self, nodeid):
            if self._groups is None:  # read once the workers have collected (the scheduler asks only then)
                self._groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text())
            return self._groups.get(nodeid, nodeid)

    return FileGroupScheduling(config, log)


class TierViolation(BaseException):
    """A unit-tier test started a process or a process group, or ran in a Ray driver. A BaseException,
    as KeyboardInterrupt is: `except Exception` in the code under test (a failed run's summary, a CLI's
    usage error) does not turn it into an outcome the test may accept."""


UNIT_RULE = "mark it slow (tests/conftest.py)"


@contextlib.contextmanager
def _unit_guard():
    """While active, every way this process has to start a process or a process group raises
    TierViolation, and each attempt is recorded in the yielded list (a test fails on a recorded one even
    where the code under test caught the exception: `except BaseException`, a thread's handler).

    Patched: subprocess (Popen and all built on it), multiprocessing, os.fork / forkpty / posix_spawn /
    posix_spawnp / system (os.spawn* fork through os.fork), and torch.distributed's process groups:
    init_process_group by every name it is imported under (torch.distributed, distributed_c10d,
    device_mesh: init_device_mesh's path) and _new_process_group_helper, which every group passes."""
    import multiprocessing.process

    violations: list[str] = []
    _ACTIVE.append(violations)

    def refuse(what):
        def refused(*args, **kwargs):
            message = f"a unit-tier test may not {what}: {UNIT_RULE}"
            violations.append(message)
            raise TierViolation(message)

        return refused

    targets = [
        (subprocess.Popen, "_execute_child", "start a subprocess"),
        (multiprocessing.process.BaseProcess, "start", "start a process"),
    ]
    targets += [
        (os, name, f"start a process (os.{name})")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
        if hasattr(os, name)
    ]
    try:
        import torch.distributed as dist
        import torch.distributed.device_mesh as device_mesh
        from torch.distributed import distributed_c10d
    except ImportError:
        pass
    else:
        what = "start a process group (train)"
        targets += [
            (module, "init_process_group", what)
            for module in (dist, distributed_c10d, device_mesh)
            if hasattr(module, "init_process_group")
        ]
        targets += [(distributed_c10d, "_new_process_group_helper", what)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    for owner, name, what in targets:
        setattr(owner, name, refuse(what))
    try:
        yield violations
    finally:
        _ACTIVE.remove(violations)
        for owner, name, original in originals:
            setattr(owner, name, original)


_ACTIVE: list[list[str]] = []  # the recorded violations of the guard in force (tier_violation_expected)


@contextlib.contextmanager
def tier_violation_expected(match: str):
    """For the suite's own checks of the rule (tests/test_suite_rules.py): the TierViolation raised
    inside is expected (pytest.raises), and not held against the test."""
    with pytest.raises(TierViolation, match=match) as caught:
        yield caught
    _ACTIVE[-1].remove(str(caught.value))


def _ray_driver() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized()


def _guarded_phase(item, phase: str):
    """A hook wrapper's body: the unit tier's rule over one phase of a unit test (its fixtures'
    setup and teardown included: a module-scoped fixture that starts a run is set up in the first
    test's setup phase, and refused there)."""
    if item.get_closest_marker("unit") is None:
        return (yield)
    if phase == "setup" and _ray_driver():
        raise TierViolation(
            "a unit-tier test ran in a Ray driver (this process attached to Ray): the unit tier runs "
            "first (pytest_collection_modifyitems), as under `make test-fast`"
        )
    with _unit_guard() as violations:
        try:
            result = yield
        except BaseException:
            if violations and not isinstance(sys.exc_info()[1], TierViolation):
                raise TierViolation(violations[0] + " (and the code under test went on to fail otherwise)")
            raise
    if violations:  # caught on the way out, and the phase passed anyway
        raise TierViolation(violations[0] + " (the code under test caught the TierViolation)")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded_phase(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded_phase(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield from _guarded_phase(item, "teardown")
    _take_the_minicluster_down_after_its_tier(item, nextitem)
    return result
