"""The scaling projection (scaling/projection/): alpha-beta arithmetic on hand-computed cases, DDP's
bucketing against what DDP itself reported, presets and their validation, the alpha-beta fit,
run_projection's table (step time, speedup and efficiency at N > 1 worked out by hand), the
command line, and that the package imports neither torch nor ray."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scaling.cli import main
from scaling.errors import UsageError
from scaling.projection import (
    Cluster,
    cluster_from_alpha_beta,
    Link,
    allreduce_s,
    fit_alpha_beta,
    load_cluster,
    preset_names,
    project_cluster_from_alpha_beta,
    ring_allreduce_s,
    run_projection,
    schedule_buckets,
)
from scaling.projection.buckets import assign_buckets, model_buckets, tensor_schedule
from scaling.projection.cluster import parse_cluster, parse_int_list
from scaling.projection.compute import device_throughput
from scaling.projection.cost import reduce_scatter_s
from scaling.projection.layers import MIB, available_models, load_layer_table
from scaling.projection.rows import COLUMNS
from scaling.projection.tta import TTA_CAVEAT, epochs_at
from scaling.results import RunDir

# ---------------------------------------------------------------------------- alpha-beta arithmetic


def test_ring_formula_by_hand():
    # 2(n-1) alpha + 2(n-1)/n S/B with S = 100 MB, n = 4, alpha = 10 us, B = 10 GB/s
    assert ring_allreduce_s(1e8, 4, 1e-5, 1e10) == pytest.approx(6e-5 + 1.5 * 1e8 / 1e10)
    assert ring_allreduce_s(1e8, 1, 1e-5, 1e10) == 0.0
    assert reduce_scatter_s(1e8, 4, 1e-5, 1e10) == pytest.approx(3e-5 + 0.75 * 1e8 / 1e10)


def test_single_bucket():
    # one bucket, ready when backward ends (0.1 s), costing 0.05 s: all of it is exposed
    sched = schedule_buckets([0.1], [0.05], backward_s=0.1)
    assert sched.start_s == (0.1,) and sched.finish_s == pytest.approx((0.15,))
    assert sched.exposed_s == pytest.approx(0.05) and sched.busy_s == pytest.approx(0.05)


def test_perfect_overlap_exposes_nothing():
    # buckets ready at 0 and 20 ms, 10 ms each: done at 30 ms, long before backward ends at 100 ms
    sched = schedule_buckets([0.0, 0.02], [0.01, 0.01], backward_s=0.1)
    assert sched.finish_s == pytest.approx((0.01, 0.03))
    assert sched.exposed_s == 0.0


def test_no_overlap_exposes_the_sum():
    # every bucket ready at the end of backward: they queue, and the step waits for all of them
    costs = [0.01, 0.02, 0.03]
    sched = schedule_buckets([0.1, 0.1, 0.1], costs, backward_s=0.1)
    assert sched.exposed_s == pytest.approx(sum(costs))


def test_a_bucket_waits_for_the_previous_one():
    # bucket 1 is ready at 10 ms but starts when bucket 0 finishes at 50 ms: 50 -> 60 ms, 20 ms exposed
    sched = schedule_buckets([0.0, 0.01], [0.05, 0.01], backward_s=0.04)
    assert sched.start_s == pytest.approx((0.0, 0.05))
    assert sched.exposed_s == pytest.approx(0.02)


def test_hierarchical_vs_flat_two_nodes_by_hand():
    # 2 nodes x 2 GPUs, S = 1 MB; NVLink-ish 1 us / 10 GB/s inside, 10 us / 1 GB/s between nodes
    intra, inter, S = Link(1e10, 1e-6), Link(1e9, 1e-5), 1e6
    # flat ring over n = 4, bandwidth paced by the inter-node link; latency as NCCL's tuning.cc
    # splits it: of the 2*3 steps, 2*(2-1) cross the network (10 us), 2*(4-2) stay inside (1 us)
    flat = 2 * 1e-5 + 4 * 1e-6 + 1.5e-3
    # hierarchical: reduce-scatter + all-gather inside (each (2-1)*1us + 1/2 * 1MB / 10GB/s),
    # then an all-reduce across the 2 nodes: 2*1*10us + 2*1/2 * 1MB / 1GB/s
    hier = 2 * (1e-6 + 0.5 * 1e6 / 1e10) + (2e-5 + 1e-3)
    assert allreduce_s(S, 2, 2, intra, inter, "ring") == pytest.approx(flat)
    assert allreduce_s(S, 2, 2, intra, inter, "hierarchical") == pytest.approx(hier)
    assert hier == pytest.approx(1.122e-3) and flat == pytest.approx(1.524e-3)
    # a fixed collective latency is paid once per all-reduce, whatever the algorithm
    assert allreduce_s(S, 2, 2, intra, inter, "ring", 8.4e-6) == pytest.approx(flat + 8.4e-6)
    assert allreduce_s(S, 2, 2, intra, inter, "hierarchical", 8.4e-6) == pytest.approx(hier + 8.4e-6)
    # one node: the intra-node ring, whatever the algorithm; one GPU: nothing
    assert allreduce_s(S, 1, 4, intra, inter, "hierarchical") == pytest.approx(ring_allreduce_s(S, 4, 1e-6, 1e10))
    assert allreduce_s(S, 1, 1, intra, inter) == 0.0


# ---------------------------------------------------------------------------- DDP buckets


def test_resnet50_table():
    table = load_layer_table("resnet50")
    assert table["parameters"] == 25_557_032
    assert sum(n for layer in table["layers"] for _, n in layer["params"]) == 25_557_032
    buckets = model_buckets(table)
    assert sum(b.bytes for b in buckets) == 102_228_128  # 102 MB of fp32 gradients
    assert table["forward_flops_per_sample"] == pytest.approx(8.18e9, rel=1e-3)  # README: 8.18 GFLOP
    assert table["layers"][0]["name"] == "fc" and table["layers"][-1]["name"] == "conv1"  # backward order
    # backward ~ 2x forward per layer, 1x for the stem (its input needs no gradient)
    assert table["backward_flops_per_sample"] == pytest.approx(
        2 * table["forward_flops_per_sample"] - table["layers"][-1]["forward_flops"]
    )


@pytest.mark.parametrize("model", [m for m in available_models() if "ddp_bucket_bytes" in load_layer_table(m)])
def test_bucketing_matches_what_ddp_reported(model):
    """Sizes recorded from DDP itself (make_layer_tables.py): default and explicit bucket_cap_mb=25."""
    table = load_layer_table(model)
    elements = [n for n, _ in tensor_schedule(table)]
    default = assign_buckets(elements)
    assert [4 * sum(elements[i] for i in b) for b in default] == table["ddp_bucket_bytes"]
    explicit = assign_buckets(elements, 25 * MIB, first_bucket_bytes=None)
    assert [4 * sum(elements[i] for i in b) for b in explicit] == table["ddp_bucket_bytes_cap_25"]


def test_bucket_ready_fractions():
    buckets = model_buckets(load_layer_table("resnet50"))
    fractions = [b.ready_fraction for b in buckets]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0  # the last bucket holds the stem
    assert fractions[0] < 0.01  # fc's gradient comes first and costs little


# ---------------------------------------------------------------------------- presets


def test_presets_load_and_validate():
    assert set(preset_names()) >= {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge", "dgx1", "h100x8"}
    for name in preset_names():
        cluster = load_cluster(name)
        assert cluster.name == name and cluster.gpus_per_node >= 1 and cluster.inter_node is not None
    p3 = load_cluster("p3.16xlarge")
    assert p3.gpus_per_node == 8 and p3.device == "V100 SXM2 16GB"
    assert p3.inter_node.bandwidth_bytes_per_s == pytest.approx(25e9 / 8 * 0.58)  # 25 Gbps at TCP's 58%
    assert p3.inter_node.latency_s == pytest.approx(37e-6)
    assert p3.collective_latency_s == pytest.approx(8.4e-6) and p3.step_jitter_cv == 0.02
    assert p3.intra_node.bandwidth_bytes_per_s == pytest.approx(130e9)
    assert load_cluster("p3.2xlarge").intra_node is None
    assert device_throughput("V100 SXM2 16GB", "resnet50", "amp")["samples_per_s"] == 1200
    assert device_throughput("V100 SXM2 16GB", "resnet50", "fp32")["samples_per_s"] == 367
    assert device_throughput("H100 SXM", "resnet50", "fp16") is None  # not published: unknown, not guessed


GOOD = {
    "gpus_per_node": 2,
    "device": None,
    "intra_node": {"bandwidth_GBps": 10, "latency_us": 1},
    "inter_node": {"bandwidth_Gbps": 8, "efficiency": 0.5, "latency_us": 10},
}


@pytest.mark.parametrize(
    "change, says",
    [
        ({"gpus_per_nod": 2}, "unknown key 'gpus_per_nod'"),
        ({"inter_node": {"bandwidth_Gbps": 8, "latency_us": 10, "jitter_us": 1}}, "unknown key 'jitter_us'"),
        ({"inter_node": {"bandwidth_Gbps": 8, "bandwidth_GBps": 1, "latency_us": 10}}, "exactly one of"),
        ({"inter_node": {"bandwidth_Gbps": -8, "latency_us": 10}}, "bandwidth_Gbps must be a positive number"),
        ({"inter_node": {"bandwidth_Gbps": 8, "efficiency": 1.5, "latency_us": 10}}, "efficiency must be in (0, 1]"),
        ({"intra_node": None}, "intra_node is required"),
        ({"allreduce": "tree"}, "allreduce must be one of ring, hierarchical"),
        ({"device": "TPU v9"}, "unknown device 'TPU v9'"),
        ({"gpus_per_node": 0}, "gpus_per_node must be a positive integer"),
    ],
)
def test_a_bad_preset_is_refused_in_one_line(change, says):
    data = {**GOOD, **change}
    if "gpus_per_nod" in change:
        del data["gpus_per_node"]
    with pytest.raises(UsageError) as info:
        parse_cluster(data, "mine.yaml")
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_cluster_file_by_path(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text(
        textwrap.dedent("""\
        gpus_per_node: 4
        device: V100 SXM2 16GB
        allreduce: hierarchical
        intra_node: {bandwidth_GBps: 100, latency_us: 2}
        inter_node: {bandwidth_Gbps: 100, latency_us: 5}
        """)
    )
    cluster = load_cluster(str(path))
    assert cluster.name == "my" and cluster.allreduce == "hierarchical"
    assert cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(12.5e9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus_per_node: 4\nnics: 2\n")
    with pytest.raises(UsageError, match="unknown key 'nics'"):
        load_cluster(str(bad))
    with pytest.raises(UsageError, match="unknown cluster 'p4d'"):
        load_cluster("p4d")
    with pytest.raises(UsageError, match="not found"):
        load_cluster(str(tmp_path / "missing.yaml"))


# ---------------------------------------------------------------------------- the alpha-beta fit


def test_fit_alpha_beta_recovers_alpha_and_beta():
    alpha, bandwidth, n = 25e-6, 2.5e9, 8
    sizes = [2**k for k in range(10, 29)]  # 1 KiB .. 256 MiB
    wobble = [1 + 0.01 * math.sin(3 * k) for k in range(len(sizes))]  # +-1%, deterministic
    times = [ring_allreduce_s(s, n, alpha, bandwidth) * w for s, w in zip(sizes, wobble)]
    fit = fit_alpha_beta(sizes, times, n)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.03)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=0.03)
    assert fit.rms_relative_error < 0.02
    exact = fit_alpha_beta(sizes, [ring_allreduce_s(s, n, alpha, bandwidth) for s in sizes], n)
    assert exact.alpha_s == pytest.approx(alpha, rel=1e-6) and exact.bandwidth_bytes_per_s == pytest.approx(
        bandwidth, rel=1e-6
    )
    with pytest.raises(UsageError):
        fit_alpha_beta([1e6, 2e6], [1e-3, 1e-3], 1)
    with pytest.raises(UsageError, match="do not grow"):
        fit_alpha_beta([1e6, 2e6, 4e6], [3e-3, 2e-3, 1e-3], 4)
    # an all-gather: half a ring all-reduce's steps and bytes, (n-1) alpha + (n-1)/n S / bandwidth
    gathers = [reduce_scatter_s(s, n, alpha, bandwidth) for s in sizes]
    gather = fit_alpha_beta(sizes, gathers, n, collective="all_gather")
    assert gather.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert gather.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=1e-6)
    assert gather.predict_s(sizes[5]) == pytest.approx(gathers[5])
    with pytest.raises(UsageError, match="collective"):
        fit_alpha_beta(sizes, gathers, n, collective="broadcast")


def test_projection_from_fitted_alpha_beta():
    alpha, beta = 20e-6, 3e9
    df = project_cluster_from_alpha_beta(
        alpha, beta, nodes=[1, 2, 4], gpus_per_node=1, model="resnet50", per_gpu_batch=64, samples_per_s=400.0
    )
    assert list(df["num_workers"]) == [1, 2, 4]
    assert df["comm_overhead_pct"].iloc[0] == 0 and (df["comm_overhead_pct"].iloc[1:] > 0).all()
    # by hand: the step at 1 worker is the given rate's (64 samples at 400/s); at n workers each of the
    # K gradient buckets is a flat ring over n links of the fitted alpha and beta, 2(n-1) alpha +
    # 2(n-1)/n x bytes / beta, over all of ResNet-50's fp32 gradients (25,557,032 parameters)
    assert df["step_s"].iloc[0] == pytest.approx(64 / 400.0)
    for _, row in df.iloc[1:].iterrows():
        n, buckets = int(row["num_workers"]), int(row["num_buckets"])
        assert row["grad_bytes"] == 4 * 25_557_032 and buckets >= 1
        by_hand = buckets * 2 * (n - 1) * alpha + 2 * (n - 1) / n * 4 * 25_557_032 / beta
        assert row["allreduce_s"] == pytest.approx(by_hand, rel=1e-9)
        assert 0 < row["exposed_comm_s"] <= row["allreduce_s"]
        assert row["step_s"] == pytest.approx(64 / 400.0 + row["exposed_comm_s"])
        assert row["throughput_samples_per_s"] == pytest.approx(n * 64 / row["step_s"])


# ---------------------------------------------------------------------------- run_projection


def test_run_projection_table():
    df = run_projection("resnet50", "p3.16xlarge", [1, 2, 4, 8, 16], per_gpu_batch=64, precision="fp32")
    assert list(df.columns) == list(COLUMNS)
    assert list(df["num_workers"]) == [1, 8, 16, 32, 64, 128]
    assert list(df["num_nodes"]) == [1, 1, 2, 4, 8, 16]
    base = df.iloc[0]
    assert base["speedup_throughput"] == 1.0 and base["comm_overhead_pct"] == 0.0 and base["exposed_comm_s"] == 0.0
    assert base["throughput_samples_per_s"] == pytest.approx(367.0)  # the published V100 fp32 number
    assert df["step_s"].iloc[0] == pytest.approx(64 / 367)
    # the phases add up, as in the lab's records
    assert (df["data_s"] + df["forward_s"] + df["backward_s"] + df["optimizer_s"]).to_numpy() == pytest.approx(
        df["step_s"].to_numpy()
    )
    assert (df["backward_s"] - df["backward_compute_s"]).to_numpy() == pytest.approx(
        (df["exposed_comm_s"] + df["interference_s"]).to_numpy()
    )
    # sanity: credible efficiency at 16 nodes, overhead rising with the nodes
    assert 0.5 < df["efficiency_throughput"].iloc[-1] < 1.0
    assert df["comm_overhead_pct"].iloc[1:].is_monotonic_increasing
    assert (df["efficiency_throughput"] <= 1.0 + 1e-12).all()
    # by hand: at 2 nodes the buckets before the last are done before backward ends, so the
    # exposed time is the last bucket's ring all-reduce over 16 GPUs at the inter-node link,
    # 8.4 us + 2*(2-1) network steps * 37 us + 2*(16-2) NVLink steps * 3.4 us
    # + 2*15/16 * 7,885,056 B / (25 Gbps * 0.58), plus the slowest-of-16 wait of a 2% jitter
    # on the compute before the all-reduce (E[max of 16 standard normals] = 1.7660)
    last = model_buckets(load_layer_table("resnet50"))[-1].bytes
    assert last == 7_885_056
    before = df["data_s"].iloc[2] + df["forward_s"].iloc[2] + df["backward_compute_s"].iloc[2]
    wait = 0.02 * before * 1.7660
    assert df["straggler_s"].iloc[2] == pytest.approx(wait, rel=1e-4)
    ring = 8.4e-6 + 2 * 37e-6 + 28 * 3.4e-6 + 2 * 15 / 16 * last / (25e9 / 8 * 0.58)
    assert df["exposed_comm_s"].iloc[2] == pytest.approx(ring + wait, rel=1e-4)
    # the three communication figures: time communicating >= exposed; no interference here
    assert (df["interference_s"] == 0).all()
    assert (df["comm_overhead_pct"] == df["exposed_comm_pct"]).all()
    assert (df["allreduce_pct"].iloc[1:] >= df["exposed_comm_pct"].iloc[1:]).all()
    # time per epoch: floor(ImageNet / global batch) steps
    assert df["steps_per_epoch"].iloc[0] == 1_281_167 // 64
    assert df["time_per_epoch_s"].iloc[0] == pytest.approx(df["steps_per_epoch"].iloc[0] * df["step_s"].iloc[0])


def test_hierarchical_beats_flat_ring_across_nodes():
    ring = run_projection("resnet50", "p3.16xlarge", [2, 16], 64, "amp", allreduce="ring")
    hier = run_projection("resnet50", "p3.16xlarge", [2, 16], 64, "amp", allreduce="hierarchical")
    assert (hier["exposed_comm_s"].iloc[1:].to_numpy() < ring["exposed_comm_s"].iloc[1:].to_numpy()).all()


def test_compressed_gradients_halve_the_bytes():
    full = run_projection("resnet50", "p3.16xlarge", [2], 64, "fp32")
    half = run_projection("resnet50", "p3.16xlarge", [2], 64, "fp32", grad_compression="fp16")
    assert half["grad_bytes"].iloc[-1] * 2 == full["grad_bytes"].iloc[-1]
    assert half["exposed_comm_s"].iloc[-1] < full["exposed_comm_s"].iloc[-1]


def test_workers_within_a_node():
    df = run_projection("resnet50", "p3.16xlarge", workers=[1, 2, 4, 8, 16], per_gpu_batch=64)
    assert list(zip(df["num_nodes"], df["workers_per_node"])) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]
    with pytest.raises(UsageError, match="whole nodes"):
        run_projection("resnet50", "p3.16xlarge", workers=[12])


def test_tta_projection_and_its_caveat():
    table = {512: 30.0, 1024: 32.0}
    assert epochs_at(table, 512) == (30.0, False)
    assert epochs_at(table, 724) == (pytest.approx(31.0, rel=1e-3), False)  # halfway in log2
    assert epochs_at(table, 2048) == (pytest.approx(34.0), True)  # the last slope, extrapolated
    assert epochs_at(table, 64) == (30.0, True)  # never below the fewest measured
    df = run_projection("resnet50", "p3.16xlarge", [1, 2], 64, "fp32", epochs_to_target="512:30,1024:32")
    assert list(df["epochs_extrapolated"]) == [True, False, False]  # global batch 64, 512, 1024
    assert df["tta_s"].iloc[1] == pytest.approx(30 * df["time_per_epoch_s"].iloc[1])
    assert df["speedup_tta"].iloc[0] == 1.0
    assert TTA_CAVEAT in df.attrs["caveats"]


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(model="vgg19", cluster="p3.16xlarge", nodes=[1]), "no layer table for model 'vgg19'"),
        (dict(model="resnet50", cluster="p9.big", nodes=[1]), "unknown cluster 'p9.big'"),
        (dict(model="resnet50", cluster="p3.16xlarge", nodes="1,two"), "comma-separated positive integers"),
        (dict(model="resnet50", cluster="p3.16xlarge", nodes=[0, 1]), "positive integers"),
        (dict(model="resnet50", cluster="p3.16xlarge", nodes=[2, 2]), "repeats"),
        (dict(model="resnet50", cluster="h100x8", nodes=[1]), "no published resnet50"),
        (dict(model="resnet50", cluster="p3.16xlarge", nodes=[1], precision="int4"), "unknown precision"),
    ],
)
def test_errors_are_one_line(kwargs, says):
    with pytest.raises(UsageError) as info:
        run_projection(**kwargs)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_parse_int_list():
    assert parse_int_list("16, 1,2", "nodes") == [1, 2, 16]


# ---------------------------------------------------------------------------- from a run directory


def _fake_run(path, workers=1, buckets=None):
    path.mkdir()
    summary = {
        "model": "resnet50",
        "num_workers": workers,
        "per_worker_batch": 32,
        "global_batch": 32 * workers,
        "precision": "fp16",
        "data_s": 0.002,
        "forward_s": 0.010,
        "backward_s": 0.020 + (0.004 if workers > 1 else 0),
        "optimizer_s": 0.001,
        "exposed_comm_s": 0.004 if workers > 1 else 0.0,
        "epochs_to_target": 5,
        "hardware": {"gpu_name": "NVIDIA H100 80GB HBM3"},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"epoch": [1, 2], "samples": [12_800, 12_800], "train_s": [1.0, 1.0]}).to_parquet(
        path / "epochs.parquet"
    )
    (path / "config.yaml").write_text("instrument:\n  ddp_bucket_cap_mb: 25.0\n  grad_compression: none\n")
    if buckets is not None:
        buckets.to_parquet(path / "buckets.parquet")
    return RunDir(path)


def test_from_run(tmp_path):
    run = _fake_run(tmp_path / "r50-w1")
    df = run_projection("resnet50", "h100x8", [1, 2], from_run=run)  # H100 has no published number: the run's
    base = df.iloc[0]
    assert base["step_s"] == pytest.approx(0.033) and base["per_worker_batch"] == 32
    assert base["throughput_samples_per_s"] == pytest.approx(32 / 0.033)
    assert df.attrs["precision"] == "fp16"
    assert df["steps_per_epoch"].iloc[0] == 12_800 // 32  # the run's epoch
    assert df["num_buckets"].iloc[-1] == 4  # the run's explicit bucket_cap_mb: no 1 MiB first bucket
    assert "estimated from layer FLOPs" in df.attrs["schedule"] and "no per-bucket records" in df.attrs["schedule"]
    # another batch scales data, forward and backward, not the optimizer
    doubled = run_projection("resnet50", "h100x8", [1], per_gpu_batch=64, from_run=run)
    assert doubled["step_s"].iloc[0] == pytest.approx(2 * 0.032 + 0.001)
    with pytest.raises(UsageError, match="trained resnet50, not resnet18"):
        run_projection("resnet18", "h100x8", [1], from_run=run)
    with pytest.raises(UsageError, match="ran at fp16"):
        run_projection("resnet50", "h100x8", [1], precision="fp32", from_run=run)


def test_from_a_multi_worker_run_and_a_measured_schedule(tmp_path):
    buckets = pd.DataFrame(
        {
            "rank": [0] * 4,
            "step": [5] * 4,
            "bucket": [0, 1, 2, 3],
            "bytes": [30_257_056, 27_291_648, 27_330_560, 17_348_864],
            "ready_s": [0.0, 0.005, 0.010, 0.020],
        }
    )
    run = _fake_run(tmp_path / "r50-w2", workers=2, buckets=buckets)
    df = run_projection("resnet50", "h100x8", [1, 2], from_run=run)
    assert df["backward_compute_s"].iloc[0] == pytest.approx(0.020)  # backward_s - exposed_comm_s
    assert df.attrs["schedule"].startswith("measured")


def test_straggler_wait_by_hand():
    from scaling.projection.compute import straggler_wait_s

    # a persistent difference: rank b always 20 ms slower; the mean rank waits half of it
    assert straggler_wait_s([[0.10, 0.10], [0.12, 0.12]]) == pytest.approx(0.01)
    # equal ranks with jitter: E[max] over the 4 pairs of {0.1, 0.2} = (0.1 + 0.2 + 0.2 + 0.2) / 4 = 0.175
    assert straggler_wait_s([[0.1, 0.2], [0.1, 0.2]]) == pytest.approx(0.025)
    assert straggler_wait_s([[0.1, 0.2]]) == 0.0
    # more runs: sampled, same expectation for identical constant runs
    assert straggler_wait_s([[0.1]] * 3 + [[0.13]]) == pytest.approx(0.13 - (0.3 + 0.13) / 4)


def _fake_concurrent_run(path, compute_s, start_unix, epochs=3, steps=10):
    """A 1-worker small_cnn run whose steady-state steps take `compute_s` (data + forward + backward) + 5 ms
    optimizer."""
    path.mkdir()
    summary = {
        "model": "small_cnn",
        "num_workers": 1,
        "per_worker_batch": 64,
        "global_batch": 64,
        "precision": "fp32",
        "data_s": 0.001,
        "forward_s": compute_s / 2,
        "backward_s": compute_s / 2 - 0.001,
        "optimizer_s": 0.005,
        "hardware": {"cpu_model": "test CPU"},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "config.yaml").write_text("instrument:\n  ddp_bucket_cap_mb: 25.0\n  grad_compression: none\n")
    rows = [
        {
            "epoch": e,
            "step": (e - 1) * steps + i,
            "kind": "train",
            "warmup": e == 1 and i < 2,
            "data_s": 0.001,
            "forward_s": compute_s / 2,
            "backward_s": compute_s / 2 - 0.001,
            "optimizer_s": 0.005,
        }
        for e in range(1, epochs + 1)
        for i in range(steps)
    ]
    pd.DataFrame(rows).to_parquet(path / "steps.parquet")
    train_s = steps * (compute_s + 0.005)
    pd.DataFrame(
        {
            "epoch": list(range(1, epochs + 1)),
            "samples": [640] * epochs,
            "train_s": [train_s] * epochs,
            "eval_s": [0.0] * epochs,
            "calibration_s": [0.0] * epochs,
            "elapsed_wall_s": [train_s * e for e in range(1, epochs + 1)],
            "first_step_unix": [start_unix] * epochs,
        }
    ).to_parquet(path / "epochs.parquet")
    return RunDir(path)


def test_from_concurrent_runs_adds_the_straggler_wait(tmp_path):
    # two runs at once, 80 and 100 ms of compute before the all-reduce: the 2-worker step waits for the slower
    a = _fake_concurrent_run(tmp_path / "a", 0.080, start_unix=1000.0)
    b = _fake_concurrent_run(tmp_path / "b", 0.100, start_unix=1000.0)
    df = run_projection("small_cnn", cluster_from_alpha_beta(0.0, 1e7), [1, 2], from_run=[a, b])
    base, two = df.iloc[0], df.iloc[1]
    assert base["step_s"] == pytest.approx(0.090 + 0.005) and base["straggler_s"] == 0.0
    assert two["straggler_s"] == pytest.approx(0.010)  # max 100 ms - mean 90 ms
    assert two["exposed_comm_s"] == pytest.approx(0.010 + 1_154_664 / 1e7)  # one bucket, ready at the end of backward
    assert two["step_s"] == pytest.approx(0.095 + two["exposed_comm_s"])
    assert any("straggler" in note for note in df.attrs["notes"])
    # given explicitly, it replaces the measured one
    none = run_projection("small_cnn", cluster_from_alpha_beta(0.0, 1e7), [1, 2], from_run=[a, b], straggler_s=0.0)
    assert none["exposed_comm_s"].iloc[1] == pytest.approx(1_154_664 / 1e7)


def test_concurrent_runs_must_overlap(tmp_path):
    from scaling.projection.compute import compute_from_concurrent_runs

    a = _fake_concurrent_run(tmp_path / "a", 0.080, start_unix=1000.0)  # 3 epochs of 0.85 s
    late = _fake_concurrent_run(tmp_path / "late", 0.080, start_unix=1000.9)  # starts during a's epoch 2
    compute = compute_from_concurrent_runs([a, late])
    assert "epochs 2,3; 1,2" in compute.source  # only epochs that ran while both trained
    never = _fake_concurrent_run(tmp_path / "never", 0.080, start_unix=2000.0)
    with pytest.raises(UsageError, match="did not train at the same time"):
        compute_from_concurrent_runs([a, never])
    with pytest.raises(UsageError, match="at least two"):
        compute_from_concurrent_runs([a])


# ---------------------------------------------------------------------------- command line


def test_main_prints_json_rows(capsys):
    assert main(["project", "--model", "resnet50", "--cluster", "p3.16xlarge", "--nodes", "1,2,4,8,16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["num_workers"] for r in rows] == [1, 8, 16, 32, 64, 128]
    assert rows[0]["speedup_throughput"] == 1.0 and rows[0]["comm_overhead_pct"] == 0.0
    assert set(COLUMNS) <= set(rows[0])
    assert all(r["allreduce_pct"] >= r["exposed_comm_pct"] for r in rows)


def test_main_table_and_figure(tmp_path, capsys):
    out = tmp_path / "fig"  # a directory, as --out is for every command
    assert (
        main(
            [
                "project",
                "--cluster",
                "p3.16xlarge",
                "--nodes",
                "1,2",
                "--precision",
                "amp",
                "--out",
                str(out),
                "--epochs-to-target",
                "256:30",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "p3.16xlarge" in text and "caveat" in text
    # each table says which communication figure it shows
    assert "communicating %" in text and "exposed %" in text and "A/B overhead %" in text
    assert (out / "projection.png").stat().st_size > 0 and (out / "projection.svg").stat().st_size > 0
    record = json.loads((out / "projection.json").read_text())
    assert [r["num_nodes"] for r in record["rows"]] == [1, 1, 2] and record["caveats"]


def test_main_horovod_backend(capsys):
    assert (
        main(
            [
                "project",
                "--cluster",
                "p3.16xlarge",
                "--nodes",
                "1,2",
                "--backend",
                "horovod",
                "--horovod-cycle-time-ms",
                "5",
                "--horovod-fusion-threshold-mb",
                "64",
                "--json",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert {r["backend"] for r in rows} == {"horovod"}
    assert "cycle 5 ms, fusion buffer 64 MiB" in captured.err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--cluster", "nope"], "unknown cluster 'nope'"),
        (["--cluster", "p3.16xlarge", "--nodes", "1,,2"], "comma-separated positive integers"),
        (["--cluster", "p3.16xlarge", "--model", "vgg"], "invalid choice: 'vgg'"),
        (["--cluster", "p3.16xlarge", "--precision", "fp8"], "invalid choice: 'fp8'"),
        (["--cluster", "p3.16xlarge", "--out", "proj.png"], "--out is a directory"),
        (["--nodes", "1"], "--cluster"),
    ],
)
def test_main_usage_errors(argv, says, capsys):
    assert main(["project", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


@pytest.mark.slow  # a fresh interpreter (a subprocess): this process has imported torch already
def test_no_torch_or_ray_on_import():
    code = (
        "import sys, scaling.projection, scaling.projection.compute, scaling.projection.overlay; "
        "import scaling.projection.project; "
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cluster_object_directly():
    cluster = Cluster(name="two", gpus_per_node=1, intra_node=None, inter_node=Link(1e9, 1e-5))
    df = run_projection("small_cnn", cluster, [1, 2], per_gpu_batch=64, samples_per_s=1000.0)
    # By hand. Compute: 64 samples at 1000/s = 64 ms a step; no device, so no optimizer split out;
    # backward takes its FLOPs' share: 64 ms x 11,380,736 / (6,132,736 + 11,380,736) = 41.58896 ms.
    assert df["optimizer_s"].iloc[0] == 0.0 and df["step_s"].iloc[0] == pytest.approx(0.064)
    assert df["backward_compute_s"].iloc[0] == pytest.approx(0.04158896, rel=1e-6)
    # small_cnn with DDP's defaults: 2 buckets, 1,059,880 B (fc layers: 1 MiB first-bucket cap overshot)
    # ready after 1,058,816 / 11,380,736 = 9.30% of backward (3.8693 ms), and 94,784 B ready at its end.
    # 2 hosts, a ring of 2: T(S) = 2 x 1 x 10 us + 2 x 1/2 x S / 1e9 B/s:
    #   bucket 0: 20 us + 1.05988 ms = 1.07988 ms, done at 4.9491 ms, long before backward ends;
    #   bucket 1: 20 us + 0.094784 ms = 0.114784 ms after backward: all of it exposed.
    assert df["exposed_comm_s"].iloc[1] == pytest.approx(0.000114784, rel=1e-9)
    assert df["num_buckets"].iloc[1] == 2 and df["grad_bytes"].iloc[1] == 1_059_880 + 94_784
    # step 64 + 0.114784 = 64.114784 ms; speedup 2 x 64 / 64.114784 = 1.99642, efficiency 0.998210
    assert df["step_s"].iloc[1] == pytest.approx(0.064114784, rel=1e-9)
    assert df["speedup_throughput"].iloc[1] == pytest.approx(1.9964194, rel=1e-6)
    assert df["efficiency_throughput"].iloc[1] == pytest.approx(0.9982097, rel=1e-6)
    assert df["comm_overhead_pct"].iloc[1] == pytest.approx(0.1790289, rel=1e-6)  # 100 x 0.114784 / 64.114784


def test_speedup_and_efficiency_at_n_workers_by_hand():
    # One bucket of all 1,154,664 gradient bytes (small_cnn, bucket_cap_mb=25 given: no 1 MiB first
    # bucket), ready when backward ends, so every all-reduce is exposed whole. One GPU per host,
    # links of 50 us and 1e8 B/s; 1000 samples/s at 50 a step: 50 ms of compute; 10,000-sample epochs.
    cluster = Cluster(name="hosts", gpus_per_node=1, intra_node=None, inter_node=Link(1e8, 50e-6))
    df = run_projection(
        "small_cnn",
        cluster,
        workers=[1, 2, 4],
        per_gpu_batch=50,
        samples_per_s=1000.0,
        bucket_cap_mb=25,
        dataset_size=10_000,
    ).set_index("num_workers")
    assert df.loc[4, "num_buckets"] == 1 and df.loc[4, "grad_bytes"] == 1_154_664
    # ring over n: 2(n-1) alpha + 2(n-1)/n S / B
    #   n = 2: 2 x 50 us + 1 x 1,154,664 / 1e8 = 0.1 + 11.54664 = 11.64664 ms
    #   n = 4: 6 x 50 us + 1.5 x 11.54664 = 0.3 + 17.31996 = 17.61996 ms
    assert df["exposed_comm_s"].tolist() == pytest.approx([0.0, 0.01164664, 0.01761996], rel=1e-9)
    assert df["step_s"].tolist() == pytest.approx([0.050, 0.06164664, 0.06761996], rel=1e-9)
    # throughput = n x 50 / step: 1000, 100 / 0.06164664 = 1622.148, 200 / 0.06761996 = 2957.707
    assert df["throughput_samples_per_s"].tolist() == pytest.approx([1000.0, 1622.1484, 2957.7066], rel=1e-6)
    # speedup = throughput(n) / 1000; efficiency = speedup / n
    assert df["speedup_throughput"].tolist() == pytest.approx([1.0, 1.6221484, 2.9577066], rel=1e-6)
    assert df["efficiency_throughput"].tolist() == pytest.approx([1.0, 0.8110742, 0.7394266], rel=1e-6)
    # overhead = exposed / step: 11.64664 / 61.64664 = 18.89%, 17.61996 / 67.61996 = 26.06%
    assert df["comm_overhead_pct"].tolist() == pytest.approx([0.0, 18.892579, 26.057336], rel=1e-6)
    # epoch: 10,000 // 50 = 200 steps x 50 ms = 10 s at 1; 10,000 // 200 = 50 steps x 67.61996 ms = 3.380998 s at 4
    assert df["steps_per_epoch"].tolist() == [200, 100, 50]
    assert df.loc[1, "time_per_epoch_s"] == pytest.approx(10.0)
    assert df.loc[4, "time_per_epoch_s"] == pytest.approx(3.380998, rel=1e-9)
    assert df.loc[4, "speedup_time_per_epoch"] == pytest.approx(2.9577066, rel=1e-6)  # 10 / 3.380998


# ---------------------------------------------------------------------------- real-cluster terms


def test_interference_stretches_backward_by_hand():
    from scaling.projection.cost import overlap_schedule

    # backward of 100 ms; bucket 0 ready at 20% of its compute, costs 30 ms; bucket 1 at 100%, 10 ms.
    # slowdown 0.5: compute runs at 2/3 speed while bucket 0 is in flight (20..50 ms), so by 50 ms
    # it has done 20 + 20 = 40 ms of work; the remaining 60 ms end at 110 ms. Bucket 1 then
    # runs 110..120: exposed 10 ms, interference 10 ms, A/B overhead 20 ms.
    sched = overlap_schedule([0.2, 1.0], [0.03, 0.01], backward_s=0.1, slowdown=0.5)
    assert sched.ready_s == pytest.approx((0.02, 0.11))
    assert sched.backward_s == pytest.approx(0.11)
    assert sched.exposed_s == pytest.approx(0.01)
    assert sched.interference_s == pytest.approx(0.01)
    assert sched.exposed_s + sched.interference_s == pytest.approx(0.02)  # t_sync - t_no_sync of the lab's A/B
    assert sched.busy_s == pytest.approx(0.04)
    # no slowdown: exactly the plain bucket schedule
    plain = schedule_buckets([0.02, 0.1], [0.03, 0.01], backward_s=0.1)
    same = overlap_schedule([0.2, 1.0], [0.03, 0.01], backward_s=0.1)
    assert same.finish_s == pytest.approx(plain.finish_s) and same.interference_s == 0.0


def test_time_communicating_counts_queueing_once():
    # bucket 1 is handed over at 10 ms but waits behind bucket 0 (0..50 ms): in flight from its
    # hand-over, as the lab's comm hook measures; the union counts 0..60 ms once
    sched = schedule_buckets([0.0, 0.01], [0.05, 0.01], backward_s=0.04)
    assert sched.busy_s == pytest.approx(0.06)


def test_horovod_cycles_and_fusion_by_hand():
    from scaling.projection.cost import fuse, horovod_schedule

    assert fuse([30, 30, 50, 20], 64) == [60, 50, 20]
    assert fuse([30, 30, 50, 10], 64) == [60, 60]
    assert fuse([100, 10], 64) == [100, 10]  # a tensor over the buffer goes alone
    assert fuse([10, 10], 0) == [10, 10]  # threshold 0: no fusion
    # backward 10 ms; tensors ready at 2, 4 and 10 ms; 5 ms cycles; negotiation 1 ms; an
    # all-reduce costs 1 ms per 100 bytes; the rest of the step (optimizer, data, forward) 4 ms.
    # First step, a cycle at backward's start: cycles at 0 (nothing ready), 5 (tensors 0 and 1,
    # fused: 5..6..8), 10 (tensor 2: 10..11..12); the next cycle is at 15 and the next backward
    # at 12 + 4 = 16, so the idle cycle at 20 is 4 ms into it. Steady state, cycles at 4, 9, 14:
    # at 4 tensors 0 and 1 (ready at 2 and 4, fused, 200 B): negotiate 4..5, all-reduce 5..7; at
    # 9 nothing; at 14 tensor 2: 14..15, 15..16. Then the next cycle is at 19, the next backward
    # at 20, the cycle at 24 again 4 ms into it: the phase repeats. Exposed = 16 - 10 = 6 ms;
    # time communicating counts each cycle from its start: 4..7 and 14..16 = 5 ms; the step
    # (backward start to the next) is 16 + 4 = 20 ms, 4 whole cycles.
    sched = horovod_schedule(
        [0.2, 0.4, 1.0],
        [100, 100, 100],
        0.010,
        lambda b: b / 100 * 1e-3,
        cycle_time_s=0.005,
        fusion_bytes=1000,
        negotiation_s=0.001,
        rest_of_step_s=0.004,
    )
    assert sched.ready_s == pytest.approx((0.004, 0.014))
    assert sched.start_s == pytest.approx((0.005, 0.015))
    assert sched.finish_s == pytest.approx((0.007, 0.016))
    assert sched.exposed_s == pytest.approx(0.006)
    assert sched.busy_s == pytest.approx(0.005)


def test_horovod_step_locks_onto_the_cycle():
    """The lab's measured case (bench/horovod_cycle_ground_truth.py): a 50 ms cycle and about 50
    ms of compute per step. By hand: backward 20 ms, its one tensor ready at its end, a 2 ms
    all-reduce, no negotiation, 30 ms of the step outside backward. The first step (a cycle at
    backward's start) sends at 50 ms, finishes at 52; the next backward starts at 82 and the
    next cycle is at 100, 18 ms into it. Steady state: cycles at 18 (nothing ready) and 68:
    68..70, exposed 50 ms, the step 70 + 30 = 100 ms = 2 cycles (and the phase repeats: the
    next cycle at 118 is 18 ms into the next backward at 100). The first step alone would give
    exposed 32 ms and a step of 82 ms, which the 2-worker runs contradict (they step every 100 ms)."""
    from scaling.projection.cost import horovod_schedule

    sched = horovod_schedule(
        [1.0], [1.0], 0.020, lambda b: 0.002, cycle_time_s=0.050, fusion_bytes=1e9, rest_of_step_s=0.030
    )
    assert sched.start_s == pytest.approx((0.068,))
    assert sched.exposed_s == pytest.approx(0.050)
    assert sched.finish_s[-1] + 0.030 == pytest.approx(0.100)


def test_jitter_straggler_wait_by_hand():
    from scaling.projection.compute import expected_max_standard_normal, jitter_straggler_s

    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-5)
    assert expected_max_standard_normal(8) == pytest.approx(1.4236, rel=1e-4)  # tables of normal order statistics
    assert jitter_straggler_s(0.2, 0.02, 8) == pytest.approx(0.2 * 0.02 * 1.4236, rel=1e-4)
    # the lab's own estimator of the wait, on normal samples, agrees with the formula
    from scaling.projection.compute import straggler_wait_s

    rng = np.random.default_rng(0)
    samples = [0.2 + 0.004 * rng.standard_normal(2000) for _ in range(2)]
    assert straggler_wait_s(samples) == pytest.approx(jitter_straggler_s(0.2, 0.02, 2), rel=0.1)


def test_horovod_backend_in_the_projection():
    """Horovod all-reduces fused buffers, not DDP's buckets: how many, by hand from the fusion
    threshold and ResNet-50's gradients (161 tensors: 53 convolutions, 53 batch norms' weight
    and bias, the classifier's weight and bias; 25,557,032 fp32 values = 102,228,128 bytes;
    the largest, a 3x3 512-channel convolution, 9,437,184 bytes):
    - fusion off (threshold 0): one buffer per tensor, 161, whatever the cycle;
    - a cycle longer than the step (10 s), so every tensor is ready when its cycle comes (after
      the first step the cycle falls after backward: the steady state), all fused in order into
      buffers of at most the threshold: at 128 MiB (134,217,728 bytes > 102,228,128) one; at
      64 MiB (67,108,864 bytes) two, as a buffer closes only when the next tensor does not fit,
      so the first holds more than 67,108,864 - 9,437,184 bytes and leaves at most 44,556,448;
    - DDP: 5 buckets (25 MiB, the first 1 MiB, as DDP made them:
      test_bucketing_matches_what_ddp_reported)."""
    ddp = run_projection("resnet50", "p3.16xlarge", [1, 2], 64, "fp32")
    hvd = run_projection(
        "resnet50",
        "p3.16xlarge",
        [1, 2],
        64,
        "fp32",
        backend="horovod",
        horovod_cycle_time_ms=5,
        horovod_fusion_threshold_mb=0,
    )
    assert (hvd["backend"] == "horovod").all() and hvd.attrs["backend"] == "horovod"
    assert ddp["num_buckets"].iloc[-1] == 5 and hvd["num_buckets"].iloc[-1] == 161
    assert (hvd["grad_bytes"].iloc[1:] == 102_228_128).all()
    for fusion_mb, buffers in ((128, 1), (64, 2)):
        fused = run_projection(
            "resnet50",
            "p3.16xlarge",
            [1, 2],
            64,
            "fp32",
            backend="horovod",
            horovod_cycle_time_ms=10_000,
            horovod_fusion_threshold_mb=fusion_mb,
        )
        assert (fused["num_buckets"].iloc[1:] == buffers).all(), fusion_mb
    assert hvd["step_s"].iloc[0] == ddp["step_s"].iloc[0]
    with pytest.raises(UsageError, match="backend must be one of"):
        run_projection("resnet50", "p3.16xlarge", [1], backend="mpi")
    with pytest.raises(UsageError, match="cycle time"):
        run_projection("resnet50", "p3.16xlarge", [1], backend="horovod", horovod_cycle_time_ms=0)


def test_fitted_cluster_has_no_extra_terms():
    """The minicluster's proof projects on a fitted alpha-beta cluster: no collective latency,
    interference or jitter beyond what the fit and the concurrent runs measured."""
    cluster = cluster_from_alpha_beta(1e-4, 1e7, gpus_per_node=1)
    assert (cluster.collective_latency_s, cluster.overlap_slowdown, cluster.step_jitter_cv) == (0.0, 0.0, 0.0)
    df = project_cluster_from_alpha_beta(
        1e-4, 1e7, [1, 2], 1, model="small_cnn", samples_per_s=1000.0, per_gpu_batch=64
    )
    assert df["straggler_s"].iloc[-1] == 0.0 and df["interference_s"].iloc[-1] == 0.0


def _projection_anchors_module():
    """bench/projection_anchors.py, imported by path (bench/ is no package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "projection_anchors.py"
    spec = importlib.util.spec_from_file_location("projection_anchors", path)
    anchors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchors)
    return anchors


def test_committed_anchor_results_are_what_the_model_gives():
    """bench/results/projection_anchors.json (the README's anchor table) is the current model's output:
    a change to a preset or a term that moves an anchor must come with a re-run of the benchmark."""
    anchors = _projection_anchors_module()
    path = Path(anchors.__file__)
    committed = json.loads((path.parent / "results" / "projection_anchors.json").read_text())["anchors"]
    assert [a["name"] for a in committed] == [a["name"] for a in anchors.ANCHORS + anchors.DEFAULT_COMMANDS]
    for anchor, before in zip(anchors.ANCHORS + anchors.DEFAULT_COMMANDS, committed):
        now = anchors.evaluate(anchor)
        assert now["projected"]["allreduce_pct"] == pytest.approx(before["projected"]["allreduce_pct"], rel=1e-6)
        assert now["projected_share_pct"] == pytest.approx(before["projected_share_pct"], rel=1e-6)
        if "projected_efficiency" in before:
            assert now["projected_efficiency"] == pytest.approx(before["projected_efficiency"], rel=1e-6)
        assert now["meets_goal"] == before["meets_goal"]
        assert (now["role"], now["sets"], now["independent"]) == (before["role"], before["sets"], before["independent"])


def test_anchor_count_excludes_calibration_anchors():
    """An anchor that sets a parameter meets its goal by construction: the count of anchors that
    meet the goal is over the checks only, in the results, the printed count and the table."""
    anchors = _projection_anchors_module()
    made_up = [
        {"name": "sets a parameter", "role": "calibration", "meets_goal": True},
        {"name": "a check that meets", "role": "check", "meets_goal": True},
        {"name": "a check that misses", "role": "check", "meets_goal": False},
    ]
    assert anchors.tally(made_up) == {"met": 1, "of": 2, "calibration": ["sets a parameter"]}
    assert anchors.count_line(made_up).startswith("1 of 2 checks meet the goal; 1 calibration anchor ")
    committed = json.loads((Path(anchors.__file__).parent / "results" / "projection_anchors.json").read_text())
    points = committed["anchors"]
    # the DGX-1 fp32 speedup sets the V100 presets' step jitter (p3.16xlarge.yaml): the one calibration anchor
    assert [p["name"] for p in points if p["role"] == "calibration"] == ["NVIDIA DGX-1, ResNet-50 fp32, 8 GPUs"]
    checks = [p for p in points if p["role"] == "check"]
    assert points[1 : len(checks) + 1] == checks and all(p["sets"] is None for p in checks)
    # every anchor says whether it is independent: only the calibration anchor is not
    assert [p["independent"].startswith("yes") for p in points[: len(checks) + 1]] == [False] + [True] * len(checks)
    # the default commands are shown beside the anchors and never counted
    assert [p["role"] for p in points[len(checks) + 1 :]] == ["default", "default"]
    assert (committed["met"], committed["of"]) == (5, 7) == (sum(p["meets_goal"] for p in checks), len(checks))
    assert committed["calibration"] == [points[0]["name"]]
    table = anchors.markdown(points)
    assert table.splitlines()[-1].startswith("5 of 7 checks meet the goal")
    assert table.count("**calibration**") == 1 and table.count("| check |") == 7
    assert table.count("| default command, not counted |") == 2


def test_default_dawnbench_command_names_what_to_change(capsys):
    """The DAWNBench case as a user types it (16 x p3.16xlarge, fp16 ResNet-50), in process: its defaults
    (DDP, AMP's fp32 gradients on the wire, the preset's 2% jitter) miss the published 61.1% and 17.82%
    communicating inside a server, and the command prints the two assumptions to change; with them changed
    it lands within 10 pp and 1.5x (bench/projection_anchors.py, DEFAULT_COMMANDS)."""
    anchors = _projection_anchors_module()
    argv = anchors.DAWNBENCH_COMMAND.split()[1:]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    rows = {r["num_workers"]: r for r in json.loads(captured.out)}
    # time-per-epoch efficiency over 1 GPU, as the DAWNBench analysis' Figure 3c
    assert rows[128]["speedup_time_per_epoch"] / 128 == pytest.approx(0.375, abs=0.005)
    assert rows[8]["allreduce_pct"] == pytest.approx(5.7, abs=0.1)
    caveats = [line for line in captured.err.splitlines() if line.startswith("caveat: ")]
    assert len(caveats) == 2
    assert "--grad-compression fp16 (at 128 GPUs 61.7% efficiency, not 37.5%)" in caveats[0]
    assert "--straggler-ms" in caveats[1] and "2% step jitter" in caveats[1]
    # the assumptions changed: fp16 gradients, and the wait NVIDIA's DGX-1 AMP speedup implies (8.2 ms at batch 64)
    assert round(1e3 * anchors.dgx1_amp_wait_s(64), 1) == 8.2
    assert main([*argv, "--grad-compression", "fp16", "--straggler-ms", "8.2", "--json"]) == 0
    captured = capsys.readouterr()
    rows = {r["num_workers"]: r for r in json.loads(captured.out)}
    efficiency = rows[128]["speedup_time_per_epoch"] / 128
    assert abs(efficiency - (1 - 0.389)) <= 0.10 and efficiency == pytest.approx(0.582, abs=0.005)
    assert 1 / 1.5 <= rows[8]["allreduce_pct"] / 17.82 <= 1.5
    assert 13.4 <= rows[8]["allreduce_pct"] <= 17.82
    assert "caveat" not in captured.err  # nothing left to change


def test_half_precision_caveats_only_where_the_default_decides():
    """The two caveats appear only where the projection rests on the default: not for fp32, not when the
    gradients' dtype or the wait is given, not inside one node for the gradients' line."""

    def caveats(**kwargs):
        kwargs = {"nodes": "1,2", "precision": "fp16", **kwargs}
        return run_projection("resnet50", "p3.16xlarge", **kwargs).attrs["caveats"]

    assert caveats(precision="fp32") == []
    assert len(caveats()) == 2
    assert [c[:9] for c in caveats(grad_compression="fp16")] == ["the wait "]
    assert [c[:9] for c in caveats(straggler_s=0.005)] == ["gradients"]
    # the efficiency the line quotes is that of the same projection with the gradients in fp16, the wait included
    given = run_projection(
        "resnet50", "p3.16xlarge", "1,2", precision="fp16", straggler_s=0.005, grad_compression="fp16"
    )
    assert (
        f"at 16 GPUs {100 * given['efficiency_throughput'].iloc[-1]:.1f}% efficiency" in caveats(straggler_s=0.005)[0]
    )
    assert [c[:9] for c in caveats(nodes=None, workers="1,8")] == ["the wait "]
    assert caveats(grad_compression="fp16", straggler_s=0.005) == []


def test_the_minicluster_predictions_are_unchanged():
    """The minicluster proof (bench/projection_vs_minicluster.py, results committed) still holds:
    today's model, on the fitted alpha-beta cluster and the compute the benchmark recorded,
    gives the predictions it committed (one 1.15 MB bucket, ready at the end of backward)."""
    from scaling.projection.cost import overlap_schedule

    path = Path(__file__).resolve().parent.parent / "bench" / "results" / "projection_vs_minicluster.json"
    record = json.loads(path.read_text())
    compute = record["baseline"]["concurrent"]
    for cap, fit in record["fits"].items():
        predicted = record["predictions"][cap]["concurrent+straggler"]
        cluster = cluster_from_alpha_beta(fit["alpha_s"], fit["bandwidth_bytes_per_s"], gpus_per_node=1)
        cost = allreduce_s(
            predicted["grad_bytes"],
            2,
            1,
            cluster.intra_node,
            cluster.inter_node,
            cluster.allreduce,
            cluster.collective_latency_s,
        )
        sched = overlap_schedule([1.0], [cost], compute["backward_s"], cluster.overlap_slowdown)
        exposed = sched.exposed_s + compute["straggler_s"]
        step = compute["data_s"] + compute["forward_s"] + compute["backward_s"] + compute["optimizer_s"] + exposed
        assert exposed == pytest.approx(predicted["exposed_comm_s"], rel=1e-9)
        assert step == pytest.approx(predicted["step_s"], rel=1e-9)
        assert 100 * exposed / step == pytest.approx(predicted["comm_overhead_pct"], rel=1e-9)


def test_overlap_slowdown_measured_from_a_run(tmp_path):
    from scaling.projection.compute import measured_overlap_slowdown

    run = tmp_path / "w2"
    run.mkdir()
    # 12 ms with an all-reduce in flight, 6 of them after backward compute: 6 ms of overlap;
    # the A/B beyond the exposed time (interference) 1.5 ms: slowdown 1.5 / 6 = 0.25
    summary = {"num_workers": 2, "interference_s": 0.0015, "allreduce_s": 0.012, "exposed_comm_s": 0.006}
    (run / "summary.json").write_text(json.dumps(summary))
    assert measured_overlap_slowdown(RunDir(run)) == pytest.approx(0.25)
    (run / "summary.json").write_text(json.dumps({**summary, "allreduce_s": 0.006}))
    with pytest.raises(UsageError, match="did not overlap"):
        measured_overlap_slowdown(RunDir(run))
    (run / "summary.json").write_text(json.dumps({**summary, "num_workers": 1}))
    with pytest.raises(UsageError, match="multi-worker run"):
        measured_overlap_slowdown(RunDir(run))
    # given to the projection, it stretches backward and shows as interference, in the A/B figure only
    plain = run_projection("resnet50", "p3.16xlarge", [1], 64, "fp32")
    slowed = run_projection("resnet50", "p3.16xlarge", [1], 64, "fp32", overlap_slowdown=0.25)
    assert (plain["interference_s"] == 0).all() and slowed["interference_s"].iloc[-1] > 0
    assert (slowed["comm_overhead_pct"] > slowed["exposed_comm_pct"]).iloc[-1]
    with pytest.raises(UsageError, match="overlap_slowdown"):
        run_projection("resnet50", "p3.16xlarge", [1], overlap_slowdown=-1)


# ---------------------------------------------------------------------------- FSDP, transformers, memory

# the counted FLOPs may fall under the formula by the norms' and biases' share (GPT-2 tiny's 64-wide layers: 1.3%)
TRANSFORMERS = {"gpt2-tiny": 0.015, "gpt2-small": 0.001, "gpt2-medium": 0.001, "llama3-8b": 0.001}


@pytest.mark.parametrize("model", TRANSFORMERS)
def test_transformer_tables_hold_torchtitans_flops_formula(model):
    """The counted training FLOPs per token (FlopCounterMode on the meta device) against
    torchtitan's get_nparams_and_flops: 6 (N - embedding) + 12 L H Q T, recomputed here by hand
    from the table's shape (make_layer_tables.py). The counter leaves out the elementwise work the
    formula gives 6 FLOPs per parameter of norms and biases: at most 0.1% under it, but for
    gpt2-tiny, whose biases and norms weigh more beside 64-wide matrices."""
    table = load_layer_table(model)
    shape, seq = table["shape"], table["seq_len"]
    formula = (
        6 * (table["parameters"] - shape["lookup_embedding_params"])
        + 12 * shape["layers"] * shape["heads"] * shape["head_dim"] * seq
    )
    assert table["formula_flops_per_token"] == formula
    counted = table["train_flops_per_token"]
    assert formula * (1 - TRANSFORMERS[model]) <= counted <= formula
    # FSDP units: the root and one per block, every parameter in one unit, FLOPs adding up
    units = table["units"]
    assert units[0]["name"] == "root" and len(units) == shape["layers"] + 1
    assert sum(u["params"] for u in units) == table["parameters"]
    assert sum(u["forward_flops"] + u["backward_flops"] for u in units) == pytest.approx(counted, rel=1e-9)
    for u in units[1:]:
        act = u["activation_bytes_per_token"]
        assert act["full"] == 2 * shape["width"]  # the block's bf16 input only
        assert act["full"] < act["selective"] < act["none"]
        assert 0 < u["recompute_flops"]["selective"] < u["recompute_flops"]["full"] == u["forward_flops"]


def test_llama3_8b_table_is_llama_3_1_8b():
    table = load_layer_table("llama3-8b")
    assert table["parameters"] == 8_030_261_248  # Llama 3.1 8B
    assert table["shape"].items() >= {"layers": 32, "heads": 32, "head_dim": 128, "width": 4096, "kv_heads": 8}.items()
    assert table["seq_len"] == 8192 and table["num_classes"] == 128_256 and not table["shape"]["tied_head"]
    # 6 x 7.505e9 non-embedding parameters + 12 x 32 x 32 x 128 x 8192 = 45.03 + 12.88 GFLOP per token
    assert table["formula_flops_per_token"] == 6 * (8_030_261_248 - 128_256 * 4096) + 12 * 32 * 32 * 128 * 8192
    # a block keeps, per token, without checkpointing about 30 widths of bf16 (SwiGLU's 3.5x-wide
    # intermediates, flash attention's q, k, v and output): 246,920 bytes
    assert table["units"][1]["activation_bytes_per_token"]["none"] == pytest.approx(30.1 * 2 * 4096, rel=0.01)


def test_gather_and_scatter_costs_by_hand():
    from scaling.projection.cost import gather_s, hsdp_gather_s, hsdp_scatter_s, scatter_s

    nvlink, net = Link(100e9, 2e-6), Link(10e9, 10e-6)
    # one node of 8: (n-1)/n S / B + (n-1) alpha + base: 7/8 x 1e9 / 1e11 + 7 x 2 us + 5 us
    assert gather_s(1e9, 1, 8, nvlink, net, 5e-6) == pytest.approx(8.75e-3 + 14e-6 + 5e-6)
    assert scatter_s(1e9, 1, 8, nvlink, net) == pytest.approx(8.75e-3 + 14e-6)
    # 4 nodes of 8 (n = 32): 31/32 S / B_inter + 3 network steps + 28 NVLink steps
    assert gather_s(1e9, 4, 8, nvlink, net) == pytest.approx(31 / 32 * 0.1 + 3 * 10e-6 + 28 * 2e-6)
    # HSDP: the gather stays in the node; the reduction adds an all-reduce of the shards across 4 nodes
    assert hsdp_gather_s(1e9, 4, 8, nvlink, net) == pytest.approx(8.75e-3 + 14e-6)
    assert hsdp_scatter_s(1e9, 4, 8, nvlink, net) == pytest.approx(8.75e-3 + 14e-6 + 6 * 10e-6 + 1.5 * 0.1)
    assert gather_s(1e9, 1, 1, nvlink, net) == 0.0


def test_fsdp_schedule_by_hand():
    """Root (unit 0) and two blocks: forward 1 / 2 / 2, backward 2 / 4 / 4, each gather 1, each
    reduce-scatter 2; block 1 resharded after forward, block 2 (the last) not.
    Link: gather root 0-1, block 1 1-2 (both issued at 0), block 2 2-3 (prefetched at block 1's
    start, 2). Forward: block 1 waits for its gather until 2 (2 s exposed), computes 2-4, block 2
    4-6, the root's head 6-7. Backward: root 7-9; block 2 9-13, issuing block 1's re-gather at 9
    (9-10); reduce-scatter of block 2 13-15; block 1 13-17; its reduce-scatter 17-19; the root's
    17 -> 19-21: 4 s after backward compute. Exposed 2 + 4 = 6; communicating: the union of
    [0, 3], [9, 10], [13, 15], [17, 21] = 10."""
    from scaling.projection.cost import fsdp_schedule

    sched = fsdp_schedule([1, 2, 2], [2, 4, 4], [1, 1, 1], [2, 2, 2], [False, True, False])
    kinds = [(c.kind, c.unit, c.issue_s, c.start_s, c.finish_s) for c in sched.collectives]
    assert kinds == [
        ("allgather", 0, 0, 0, 1),
        ("allgather", 1, 0, 1, 2),
        ("allgather", 2, 2, 2, 3),
        ("regather", 1, 9, 9, 10),
        ("reducescatter", 2, 13, 13, 15),
        ("reducescatter", 1, 17, 17, 19),
        ("reducescatter", 0, 17, 19, 21),
    ]
    assert (sched.end_s, sched.exposed_s, sched.forward_waited_s, sched.busy_s, sched.compute_s) == (21, 6, 2, 10, 15)
    assert (sched.seconds("allgather"), sched.seconds("regather"), sched.seconds("reducescatter")) == (3, 1, 6)


def test_fsdp_schedule_with_the_root_resharded_and_synchronous_collectives_by_hand():
    """The same three units, the root and the first block resharded, the last block not.
    Beside compute (NCCL): forward as above (2 s waited, done at 7); the root's re-gather 7-8
    before its backward (1 s waited), which runs 8-10 and issues nothing (block 2 kept); block 2
    10-14, issuing block 1's re-gather (10-11); reduce-scatters 14-16, 18-20, the root's 20-22:
    waited 2 + 1 + 4 = 7.
    Synchronous (gloo on CPU): every collective holds compute. Forward: root 0-1, block 1's gather
    1-2, compute 2-4, block 2's 4-5, compute 5-7, the root's 7-8 (3 s waited); backward: the root's
    re-gather 8-9, its compute 9-11; block 2 11-15, its reduce-scatter 15-17; block 1's re-gather
    17-18, compute 18-22, reduce-scatter 22-24; the root's 24-26. Step 26 = compute 15 + 11, all
    of the communication exposed."""
    from scaling.projection.cost import fsdp_schedule

    flags = [True, True, False]
    beside = fsdp_schedule([1, 2, 2], [2, 4, 4], [1, 1, 1], [2, 2, 2], flags)
    assert [(c.kind, c.unit, c.start_s, c.finish_s) for c in beside.collectives][3:] == [
        ("regather", 0, 7, 8),
        ("regather", 1, 10, 11),
        ("reducescatter", 2, 14, 16),
        ("reducescatter", 1, 18, 20),
        ("reducescatter", 0, 20, 22),
    ]
    assert (beside.end_s, beside.exposed_s, beside.forward_waited_s) == (22, 7, 2)
    held = fsdp_schedule([1, 2, 2], [2, 4, 4], [1, 1, 1], [2, 2, 2], flags, synchronous=True)
    assert [(c.kind, c.unit, c.issue_s, c.finish_s) for c in held.collectives] == [
        ("allgather", 0, 0, 1),
        ("allgather", 1, 1, 2),
        ("allgather", 2, 4, 5),
        ("regather", 0, 8, 9),
        ("reducescatter", 2, 15, 17),
        ("regather", 1, 17, 18),
        ("reducescatter", 1, 22, 24),
        ("reducescatter", 0, 24, 26),
    ]
    assert (held.end_s, held.exposed_s, held.forward_waited_s, held.busy_s, held.compute_s) == (26, 11, 3, 11, 15)
    assert (held.seconds("allgather"), held.seconds("regather"), held.seconds("reducescatter")) == (3, 2, 6)


def test_fsdp_on_gloo_adds_every_collective_to_the_step():
    """gpt2-tiny on two one-CPU nodes of a fitted link (FSDP2 on gloo, every unit resharded
    after forward, the root too, fp32 both ways): the step is the compute plus, per unit, its all-gather
    and re-gather ((n-1)/n S / B + alpha each) and its reduce-scatter, which gloo runs as an
    all-reduce (2(n-1)/n S / B + 2 alpha); all of it exposed; the A/B sees the reduce-scatters."""
    from scaling.projection import project_cluster_from_alpha_beta

    alpha, bandwidth = 0.5e-3, 12.5e6
    kwargs = dict(
        model="gpt2-tiny",
        per_gpu_batch=32,
        precision="fp32",
        samples_per_s=320.0,
        backend="fsdp",
        activation_checkpointing="none",
        reshard_after_forward="all-and-root",
        fsdp_param_dtype="fp32",
        fsdp_reduce_dtype="fp32",
    )
    df = project_cluster_from_alpha_beta(alpha, bandwidth, [1, 2], gpus_per_node=1, fsdp_process_group="gloo", **kwargs)
    one, two = df.iloc[0], df.iloc[1]
    units = [u["params"] * 4 for u in load_layer_table("gpt2-tiny")["units"]]  # root, two blocks
    gathers = sum(alpha + b / 2 / bandwidth for b in units)
    scatters = sum(2 * alpha + b / bandwidth for b in units)
    compute = 32 / 320.0
    assert one["step_s"] == pytest.approx(compute) and one["exposed_comm_s"] == 0
    assert two["allgather_s"] == pytest.approx(gathers) and two["regather_s"] == pytest.approx(gathers)
    assert two["reducescatter_s"] == pytest.approx(scatters)
    assert two["exposed_comm_s"] == pytest.approx(2 * gathers + scatters)
    assert two["step_s"] == pytest.approx(compute + 2 * gathers + scatters)
    assert two["comm_overhead_pct"] == pytest.approx(100 * scatters / two["step_s"])
    # a wait for the slower rank is exposed, and not in the A/B: the no-sync half waits at its all-gathers too
    waited = project_cluster_from_alpha_beta(
        alpha, bandwidth, [1, 2], gpus_per_node=1, fsdp_process_group="gloo", straggler_s=0.01, **kwargs
    ).iloc[1]
    assert waited["exposed_comm_s"] == pytest.approx(2 * gathers + scatters + 0.01)
    assert waited["comm_overhead_pct"] == pytest.approx(100 * scatters / (compute + 2 * gathers + scatters + 0.01))
    # beside compute (NCCL's way) the same link hides part of it, and a reduce-scatter is half an all-reduce
    nccl = project_cluster_from_alpha_beta(alpha, bandwidth, [1, 2], gpus_per_node=1, **kwargs).iloc[1]
    assert nccl["reducescatter_s"] == pytest.approx(sum(alpha + b / 2 / bandwidth for b in units))
    assert nccl["step_s"] < two["step_s"]
    with pytest.raises(UsageError, match="fsdp_process_group must be one of"):
        project_cluster_from_alpha_beta(alpha, bandwidth, [1, 2], gpus_per_node=1, fsdp_process_group="mpi", **kwargs)


def test_fsdp_projection_of_llama3_8b():
    df = run_projection("llama3-8b", "h100x8_400g_per_gpu", [1, 16], backend="fsdp")
    assert df["num_workers"].tolist() == [1, 8, 128]
    for column in ("allgather_s", "regather_s", "reducescatter_s", "tokens_per_s_per_gpu", "memory_gib"):
        assert column in df.columns
    r8, r128 = df.iloc[1], df.iloc[2]
    # bf16 all-gathers of 8.03e9 parameters, fp32 reduce-scatters: 16.06 GB and 32.12 GB per step
    assert r128["grad_bytes"] == 4 * 8_030_261_248
    # the sharded state, 16 bytes per parameter over the GPUs, by hand; memory falls with the shards
    assert r8["memory_states_bytes"] == pytest.approx(16 * 8_030_261_248 / 8)
    assert r128["memory_states_bytes"] == pytest.approx(16 * 8_030_261_248 / 128)
    assert r8["memory_allocated_bytes"] - r128["memory_allocated_bytes"] == pytest.approx(
        16 * 8_030_261_248 * (1 / 8 - 1 / 128)
    )
    # on the GPU: the allocator's reserve (GMLake's 15% of reserved memory), the CUDA context and NCCL's buffers
    for r in (r8, r128):
        assert r["memory_reserved_gib"] * 2**30 == pytest.approx(r["memory_allocated_bytes"] / 0.85)
        assert r["memory_gib"] * 2**30 == pytest.approx(r["memory_reserved_gib"] * 2**30 + 666_632_192 + 2**28)
    # within 10% of torchtitan's logged max_reserved: 82.4 GiB at 8 GPUs, 67.0 at 128 (bench/projection_torchtitan.py)
    assert r8["memory_reserved_gib"] == pytest.approx(82.4, rel=0.10)
    assert r128["memory_reserved_gib"] == pytest.approx(67.0, rel=0.10)
    # tokens/s per GPU = batch x sequence / step; the three figures ordered as defined
    assert r8["tokens_per_s_per_gpu"] == pytest.approx(2 * 8192 / r8["step_s"])
    for r in (r8, r128):
        assert 0 < r["exposed_comm_pct"] < r["allreduce_pct"] and 0 < r["comm_overhead_pct"] <= r["exposed_comm_pct"]
        assert r["step_s"] == pytest.approx(r["data_s"] + r["forward_s"] + r["backward_s"] + r["optimizer_s"])
    # no re-gather without resharding; HSDP keeps a node's shard (more memory) and reduces across nodes
    kept = run_projection("llama3-8b", "h100x8_400g_per_gpu", [1, 16], backend="fsdp", reshard_after_forward=False)
    assert (kept["regather_s"] == 0).all() and (kept["memory_gib"] > df["memory_gib"]).iloc[1:].all()
    every = run_projection("llama3-8b", "h100x8_400g_per_gpu", [1, 16], backend="fsdp", reshard_after_forward="all")
    # FSDP2's default re-gathers the last block too: 32 blocks' bf16 parameters, against torchtitan's 31
    assert every["regather_s"].iloc[1] == pytest.approx(df["regather_s"].iloc[1] * 32 / 31, rel=1e-6)
    hsdp = run_projection("llama3-8b", "h100x8_400g_per_gpu", [1, 16], backend="hsdp")
    assert hsdp["memory_gib"].iloc[2] == pytest.approx(r8["memory_gib"])
    assert hsdp["allreduce_algorithm"].iloc[2] == "hsdp"
    # full checkpointing holds less and recomputes more
    full = run_projection("llama3-8b", "h100x8_400g_per_gpu", [1], backend="fsdp", activation_checkpointing="full")
    assert full["memory_gib"].iloc[1] < r8["memory_gib"] and full["backward_s"].iloc[1] > r8["backward_s"]


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(model="resnet50", backend="fsdp"), "needs a transformer"),
        (dict(model="llama3-8b", backend="fsdp", mfu=1.5), "--mfu must be in"),
        (dict(model="llama3-8b", backend="fsdp", activation_checkpointing="some"), "activation checkpointing"),
        (dict(model="llama3-8b", backend="fsdp", cluster="p4d.24xlarge"), "no published bf16 MFU"),
        (dict(model="llama3-8b", backend="fsdp", reshard_after_forward="some"), "reshard_after_forward must be"),
    ],
)
def test_fsdp_errors_are_one_line(kwargs, says):
    kwargs = {"cluster": "h100x8_400g_per_gpu", **kwargs}
    with pytest.raises(UsageError, match=says) as info:
        run_projection(kwargs.pop("model"), kwargs.pop("cluster"), [1], **kwargs)
    assert "\n" not in str(info.value)


def test_new_presets_and_their_figures():
    p4d, p5, tt = load_cluster("p4d.24xlarge"), load_cluster("p5.48xlarge"), load_cluster("h100x8_400g_per_gpu")
    assert (p4d.device, p5.device, tt.device) == ("A100 SXM4 40GB", "H100 SXM", "H100 SXM")
    assert p4d.inter_node.bandwidth_bytes_per_s == pytest.approx(400e9 / 8 * 0.8)
    assert p5.inter_node.bandwidth_bytes_per_s == tt.inter_node.bandwidth_bytes_per_s == pytest.approx(3200e9 / 8 * 0.8)
    for name in ("p4d.24xlarge", "p5.48xlarge", "h100x8_400g_per_gpu"):
        text = (
            Path(__file__).resolve().parent.parent / "scaling" / "projection" / "presets" / f"{name}.yaml"
        ).read_text()
        assert "https://" in text  # every preset names its source


def test_main_projects_llama_with_fsdp(capsys):
    """The issue's command: step time, tokens/s per GPU, memory per GPU, the three communication
    figures, and where every parameter comes from."""
    assert (
        main(
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
    out = " ".join(capsys.readouterr().out.split())
    for words in (
        "step ms",
        "tokens/s/GPU",
        "memory GiB/GPU",
        "communicating %",
        "exposed %",
        "A/B overhead %",
        "MFU 33% (torchtitan",
        "each value's source beside it in h100x8_400g_per_gpu",
        "all-gather in bf16",
        "reduce-scatter in fp32",
        "16 bytes per parameter",
    ):
        assert words in out, words


def test_the_overlay_projects_fsdp_sweeps(tmp_path):
    """An FSDP sweep (synthetic: the report's fake sweep, its runs a gpt2-small under backend fsdp)
    is projected with FSDP's collectives, as `scaling project --backend fsdp` would."""
    from scaling.analysis.scaling_tables import prepare_runs
    from scaling.projection.overlay import project_sweep
    from scaling.results import SweepDir
    from tests.fake_sweep import make_fake_sweep

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: two-hosts-1gbit\ngpus_per_node: 1\n"
        "inter_node: {name: 1 Gbit/s, bandwidth_Gbps: 1, efficiency: 1.0, latency_us: 100}\n"
    )
    sweep = make_fake_sweep(tmp_path, backend="fsdp", cluster=str(cluster))
    for config_path in Path(sweep).glob("runs/*/config.yaml"):  # the lab's FSDP settings (its defaults)
        config_path.write_text(
            config_path.read_text() + "fsdp: {reshard_after_forward: true, param_dtype: float32, "
            "reduce_dtype: bfloat16}\n"
        )
    for summary_path in Path(sweep).glob("runs/*/summary.json"):
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps({**summary, "model": "gpt2-small"}))
    runs = SweepDir(sweep).runs.assign(model="gpt2-small")
    assert set(runs["backend"]) == {"fsdp"}
    projected, notes, warnings = project_sweep(
        prepare_runs(runs), ("num_workers",), lambda run: SweepDir(sweep).run(run["run_key"])
    )
    assert not warnings and "backend fsdp" in notes[0]
    assert "reduce-scatter in bf16" in notes[0] and "32 blocks" not in notes[0] and "12 blocks resharded" in notes[0]
    direct = run_projection(
        "gpt2-small",
        str(cluster),
        workers=[1, 2, 4],
        from_run=SweepDir(sweep).run("w1-r2"),
        backend="fsdp",
        reshard_after_forward="all",
        fsdp_reduce_dtype="bf16",
        fsdp_param_dtype="fp32",
        activation_checkpointing="none",
    )
    by_n = projected.set_index("num_workers")
    assert by_n["projected_step_s"].tolist() == pytest.approx(direct["step_s"].tolist())
    assert by_n["projected_exposed_comm_pct"].tolist() == pytest.approx(direct["exposed_comm_pct"].tolist())
    assert (by_n.loc[[2, 4], "projected_comm_overhead_pct"] > 0).all()
    # a DDP model on the same sweep is refused in a warning, not an exception
    projected, _, warnings = project_sweep(
        prepare_runs(runs.assign(model="small_cnn")), ("num_workers",), lambda run: SweepDir(sweep).run(run["run_key"])
    )
    assert projected.empty and "needs a transformer" in warnings[0]


def test_committed_torchtitan_results_are_what_the_model_gives():
    """bench/results/projection_torchtitan.json (docs/projection.md's and the README's table) is the
    current model's output, and its count leaves the calibration row and the rows without a goal out."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "projection_torchtitan.py"
    spec = importlib.util.spec_from_file_location("projection_torchtitan", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    committed = json.loads((path.parent / "results" / "projection_torchtitan.json").read_text())
    now = bench.evaluate()
    assert [r["name"] for r in now["rows"]] == [r["name"] for r in committed["rows"]]
    for before, row in zip(committed["rows"], now["rows"]):
        assert row["projected"] == pytest.approx(before["projected"], rel=1e-9)
        assert (row["role"], row["meets_goal"]) == (before["role"], before["meets_goal"])
    assert [r["role"] for r in now["rows"]] == ["calibration", "check", "check", "check", "check"]
    assert (
        bench.tally(now["rows"])
        == {"met": committed["met"], "of": committed["of"], "calibration": ["tokens/s per GPU at 8 GPUs"]}
        and committed["of"] == 3
    )
