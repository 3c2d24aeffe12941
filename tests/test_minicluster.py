"""A real 2-node Ray cluster on this machine (network namespaces, veth, bridge, tc caps).

On the session's minicluster (tests/conftest.py: `up` and `down` through the CLI, `down` checked
to leave nothing behind), with every link capped, runs a 2-worker sweep across it (node ranks 0
and 1 in the records) and checks the cap against a gloo all-reduce between the nodes (a ring
all-reduce of S bytes between 2 nodes sends S bytes each way over each capped link, so it takes
about S x 8 / R seconds). Needs root with network-admin rights; skips with the reason where a
probe (tests/conftest.py) finds none, fails where `.ci/run` requires it.
"""

import os

import pandas as pd
import pytest

from scaling.cli import main
from tests.conftest import run_cli

CAP = "200mbit"
CAP_BITS_PER_S = 200e6


def test_sweep_across_two_capped_nodes(whole_minicluster, tmp_path):
    from scaling.testbed import minicluster as mc

    name = whole_minicluster
    mc.set_bandwidth(CAP, name)  # whole_minicluster uncaps it again afterwards
    status = mc.status(name)
    assert status["ray_nodes_alive"] == 2
    assert [n["egress_cap"] for n in status["nodes"]] == ["200Mbit", "200Mbit"]

    out = tmp_path / "sweep"
    result = run_cli("minicluster", "exec", "--name", name, "--", "scaling", "sweep", "experiments/quickstart.yaml",
                     "--workers", "2", "--repeats", "1", "--out", str(out), "--set", "data.train_samples=1024",
                     "--set", "data.val_samples=256", "--set", "train.max_epochs=2", "--set", "instrument.calibration_pairs=4")
    assert result.returncode == 0, result.stderr[-2000:]
    runs = pd.read_parquet(out / "runs.parquet")
    assert list(runs["status"]) == ["max_epochs"] and int(runs["num_nodes"].iloc[0]) == 2
    steps = pd.read_parquet(next((out / "runs").iterdir()) / "steps.parquet")
    assert sorted(steps.groupby("rank")["node_rank"].first()) == [0, 1]
    assert set(steps["local_rank"]) == {0}

    nbytes = 10_000_000
    measured = mc.allreduce_seconds(nbytes, name, iters=3)["median_s"]
    expected = nbytes * 8 / CAP_BITS_PER_S
    assert measured == pytest.approx(expected, rel=0.20), f"{measured:.3f} s for a {expected:.3f} s bound"

    # Why communication costs what it does, on capped links: the exposed transfer of each step
    # (after every rank handed its gradients over) follows the same bandwidth bound for the
    # model's gradients (one bucket: small_cnn's fp32 gradients, all-reduced as the probe's
    # bytes are), and the waiting is no part of it.
    from scaling.models import build_model

    gradient_bytes = 4 * sum(p.numel() for p in build_model("small_cnn", 10).parameters())
    bound = gradient_bytes * 8 / CAP_BITS_PER_S
    steady = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    transfer = float(steady["transfer_s"].median())
    print(f"transfer per step {transfer * 1e3:.1f} ms for a {bound * 1e3:.1f} ms bound ({gradient_bytes:,} bytes)")
    assert transfer == pytest.approx(bound, rel=0.20)
    assert float(steady["waiting_s"].median()) < 0.2 * bound


def test_without_root_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["minicluster", "up", "--nodes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs root" in err
