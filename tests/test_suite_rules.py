"""The suite's own rules (tests/conftest.py), checked: a declared capability that is missing fails
the run in one line; the unit tier refuses to start a process or a process group."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import TierViolation, missing_capabilities

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
    with pytest.raises(TierViolation, match="subprocess"):
        subprocess.run([sys.executable, "-c", "pass"])
    import torch.distributed as dist

    with pytest.raises(TierViolation, match="process group"):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
