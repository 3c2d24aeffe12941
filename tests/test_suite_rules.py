"""The suite's own rules (tests/conftest.py), checked: a declared capability that is missing fails
the run in one line; the unit tier refuses to start a process or a process group, in every way
this process has to start one, and a test fails on a refusal even where the code under test
caught it or where a module-scoped fixture made the attempt."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, missing_capabilities, tier_violation_expected

PROBES = {"netns": lambda: None, "horovod": lambda: "No module named 'horovod'"}


def test_a_declared_capability_that_is_missing_is_one_line_naming_it():
    assert missing_capabilities("", PROBES) is None  # a developer's machine: nothing declared
    assert missing_capabilities("netns", PROBES) is None
    why = missing_capabilities("netns,horovod", PROBES)
    assert why is not None and "\n" not in why
    assert "'horovod' is missing: No module named 'horovod'" in why and "netns" not in why
    assert "unknown capability gpu" in missing_capabilities("netns gpu", PROBES)


def test_the_unit_tier_starts_no_process(request):
    assert request.node.get_closest_marker("unit") is not None  # this test is in the unit tier
    with tier_violation_expected("subprocess"):
        subprocess.run([sys.executable, "-c", "pass"])
    for start in (
        os.fork,
        lambda: os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], os.environ),
        lambda: os.system("true"),
    ):
        with tier_violation_expected("start a process"):
            start()
    import torch.distributed as dist

    with tier_violation_expected("process group"):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    with tier_violation_expected("process group"):  # the device mesh's own path to a default group
        init_device_mesh("cpu", (1,))


def test_except_exception_in_the_code_under_test_cannot_hide_a_refusal():
    def run_like_the_lab():  # a failed run's summary, a CLI's usage error: `except Exception`
        try:
            subprocess.run([sys.executable, "-c", "pass"])
        except Exception as exc:  # noqa: BLE001
            return f"failed: {exc}"
        return "ran"

    with tier_violation_expected("subprocess"):
        run_like_the_lab()


INNER = """
import subprocess, sys
import pytest

@pytest.fixture(scope="module")
def run_started_by_a_module_fixture():
    subprocess.run([sys.executable, "-c", "pass"])

def test_module_fixture(run_started_by_a_module_fixture):
    pass

def test_swallowed():
    try:
        subprocess.run([sys.executable, "-c", "pass"])
    except BaseException:
        pass

def test_in_process():
    assert sum([1, 2]) == 3
"""


@pytest.mark.slow  # a pytest session of its own, in a subprocess
def test_the_rule_holds_where_a_fixture_or_a_handler_would_slip_it(tmp_path):
    """A module-scoped fixture that starts a process (set up before any function-scoped fixture) and a
    test that swallows even a BaseException both fail, under this suite's own hooks; an in-process test passes."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403  (the suite's hooks)\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "SCALING_TEST_REQUIRE": "",
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "ERROR test_inner.py::test_module_fixture - tests.conftest.TierViolation" in out, out[-3000:]
    assert "FAILED test_inner.py::test_swallowed - tests.conftest.TierViolation" in out, out[-3000:]
    assert "caught the TierViolation" in out and "1 passed" in out, out[-3000:]
