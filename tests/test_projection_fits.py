"""A projected configuration whose memory per GPU exceeds the device's says so (scaling project).

Llama 3.1 8B under FSDP on H100 hosts: on one GPU the fp32 states alone (16 bytes per parameter,
128 GB) exceed an H100's 79.11 GiB, so that row must not fit; at 8 GPUs neither (84.5 GiB with the
allocator's reserve, the CUDA context and NCCL's buffers: torchtitan measured 82.4 GiB reserved there,
on 96 GB parts), at 128 GPUs it does (68.0 GiB). The
capacity is the device table's (scaling/devices.yaml `memory_GiB`), and a device without one
gives `fits` None, never a guess.
"""

from __future__ import annotations

import pytest

from scaling import cli
from scaling.projection.cluster import load_cluster
from scaling.projection.project import run_projection


def test_a_configuration_that_cannot_fit_is_flagged_and_one_that_can_is_not():
    df = run_projection("llama3-8b", load_cluster("h100x8_400g_per_gpu"), [1, 16], backend="fsdp")
    by_gpus = df.set_index("num_workers")
    assert by_gpus.loc[1, "memory_gib"] > by_gpus.loc[1, "memory_capacity_gib"] == pytest.approx(79.11)
    assert by_gpus.loc[1, "fits"] is not None and not by_gpus.loc[1, "fits"]
    assert not by_gpus.loc[8, "fits"] and bool(by_gpus.loc[128, "fits"])


def test_the_cli_says_what_does_not_fit_and_what_would_make_it_fit(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    assert (
        cli.main(
            [
                "project",
                "--model",
                "llama3-8b",
                "--cluster",
                "h100x8_400g_per_gpu",
                "--backend",
                "fsdp",
                "--nodes",
                "1,16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "207.4 > cap." in out
    line = next(line for line in out.splitlines() if line.startswith("does not fit"))
    assert "at 1, 8 GPU(s)" in line and "79.11 GiB" in line and "--activation-checkpointing" in line


def test_a_device_without_a_capacity_gives_no_verdict(monkeypatch):
    import scaling.projection.memory as memory

    monkeypatch.setattr(memory, "load_devices", lambda: {})
    df = run_projection("llama3-8b", load_cluster("h100x8_400g_per_gpu"), [1], backend="fsdp")
    assert df["fits"].isna().all() and df["memory_capacity_gib"].isna().all()
