"""The projection held against what real clusters measured: every published anchor, run through
`scaling.projection.run_projection` with the configuration the publication used (model,
precision, batch per GPU, cluster preset, all-reduce software), and the error per point.

    .venv/bin/python bench/projection_anchors.py            # writes bench/results/projection_anchors.json
    .venv/bin/python bench/projection_anchors.py --markdown # also prints docs/projection.md's table

No training and no network: the projection is pure arithmetic, so the whole benchmark takes a few
seconds and gives the same numbers on every machine. Each anchor names its source, the
configuration taken from it (and what was assumed where the source is silent), the published
figure, the projected one and the error:

- efficiency: projected minus published scaling efficiency, in percentage points (goal: within
  10). Time-per-epoch efficiency where the source gives time per epoch (DAWNBench), throughput
  efficiency otherwise; over the baseline the source scaled from (1 GPU, or 8 GPUs for Goyal
  et al.).
- communicating share: the share of the step with an all-reduce in flight (the DAWNBench
  analysis' "communication overhead", the projection's `allreduce_pct`), as the ratio projected /
  published (goal: within 1.5x either way). A published lower bound ("more than half") passes
  when the projection is above it.

Calibration and checks: one set of hardware parameters per cluster preset
(scaling/projection/presets/*.yaml, each value with its source). An anchor that sets a
parameter (`sets`: its role is "calibration") meets its goal by construction, so it is shown
but not counted: the count of anchors meeting the goal (`met` of `of` in the results, the
table's last line) is over the checks only. One anchor sets a parameter: NVIDIA's DGX-1 fp32
8-GPU speedup sets the V100 presets' `step_jitter_cv` (see p3.16xlarge.yaml; the P100 presets
borrow it). Every other anchor only checks; nothing is tuned per anchor.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import load_average, write_result  # noqa: E402

from scaling.projection import run_projection  # noqa: E402

EFFICIENCY_GOAL_PP = 10.0
SHARE_GOAL_RATIO = 1.5
# Horovod's defaults before 0.21 (its changelog): what the 2017-2018 anchors ran
HOROVOD_2018 = dict(backend="horovod", horovod_cycle_time_ms=5.0, horovod_fusion_threshold_mb=64.0)

ANCHORS = [
    dict(
        name="NVIDIA DGX-1, ResNet-50 fp32, 8 GPUs",
        source="NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, training performance, DGX-1 16GB: "
               "367 img/s on 1 GPU, 7.76x on 8 (fp32)",
        config="dgx1, 1 node x 8 V100, fp32, batch 112 per GPU, PyTorch DDP (NCCL over NVLink)",
        sets="step_jitter_cv (2%) of the V100 presets, borrowed by the P100 presets",
        kwargs=dict(model="resnet50", cluster="dgx1", workers=[8], per_gpu_batch=112, precision="fp32"),
        workers=8, base_workers=1, efficiency_metric="throughput", published_efficiency=7.76 / 8,
    ),
    dict(
        name="NVIDIA DGX-1, ResNet-50 mixed precision, 8 GPUs",
        source="NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, DGX-1 16GB: 1,200 img/s on 1 GPU (AMP), "
               "6.93x on 8",
        config="dgx1, 1 node x 8 V100, fp16 (AMP), batch 256 per GPU, PyTorch DDP, fp32 gradients",
        kwargs=dict(model="resnet50", cluster="dgx1", workers=[8], per_gpu_batch=256, precision="fp16"),
        workers=8, base_workers=1, efficiency_metric="throughput", published_efficiency=6.93 / 8,
    ),
    dict(
        name="DAWNBench: 16 x p3.16xlarge, ResNet-50 mixed precision",
        source="Coleman et al. 2019, \"Analysis of DAWNBench\", Figure 3c (time per epoch, a 38.9% gap from linear "
               "at 16 p3.16xlarge) and its finding that distributed entries spend more than half of their time "
               "communicating",
        config="p3.16xlarge, 16 nodes x 8 V100 (128 GPUs), fp16, batch 64 per GPU (assumed: the "
               "entries' own batch is not in the sources at hand), Horovod (cycle 5 ms, fusion 64 MiB, fp16 "
               "gradients), NCCL over TCP",
        kwargs=dict(model="resnet50", cluster="p3.16xlarge", nodes=[1, 16], per_gpu_batch=64, precision="fp16",
                    grad_compression="fp16", **HOROVOD_2018),
        workers=128, base_workers=1, efficiency_metric="time_per_epoch", published_efficiency=1 - 0.389,
        published_share_min_pct=50.0,
    ),
    dict(
        name="DAWNBench: inside one 8-V100 server",
        source="Coleman et al. 2019, \"Analysis of DAWNBench\", Figure 5: 17.82% of the time communicating inside a "
               "DGX-1",
        config="one 8-V100 NVLink server (dgx1), the configuration of the entry above: fp16, batch 64 per GPU, "
               "Horovod (cycle 5 ms, fusion 64 MiB, fp16 gradients)",
        kwargs=dict(model="resnet50", cluster="dgx1", workers=[8], per_gpu_batch=64, precision="fp16",
                    grad_compression="fp16", **HOROVOD_2018),
        workers=8, base_workers=1, published_share_pct=17.82,
    ),
    dict(
        name="DAWNBench: 16 x p3.16xlarge, ResNet-50 fp32, batch 64",
        source="Coleman et al. 2019: distributed entries across p3.16xlarge servers spend more than half of their "
               "time communicating",
        config="p3.16xlarge, 16 nodes x 8 V100, fp32, batch 64 per GPU, PyTorch DDP (default buckets), NCCL over TCP",
        kwargs=dict(model="resnet50", cluster="p3.16xlarge", nodes=[1, 16], per_gpu_batch=64, precision="fp32"),
        workers=128, base_workers=1, published_share_min_pct=50.0,
    ),
    dict(
        name="Goyal et al.: ResNet-50 from 8 to 256 GPUs",
        source="Goyal et al. 2017, \"Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour\": ~90% scaling "
               "efficiency from 8 to 256 GPUs",
        config="big_basin, 32 nodes x 8 P100 (NVLink), 50 Gbit Ethernet, fp32, batch 32 per GPU, Caffe2 + Gloo "
               "(two-level all-reduce: `hierarchical`)",
        kwargs=dict(model="resnet50", cluster="big_basin", nodes=[1, 32], per_gpu_batch=32, precision="fp32"),
        workers=256, base_workers=8, efficiency_metric="throughput", published_efficiency=0.90,
    ),
    dict(
        name="Horovod: ResNet-101, 512 GPUs",
        source="Sergeev & Del Balso 2018 (Horovod) and Horovod's README: 90% scaling efficiency at 512 GPUs "
               "(128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE)",
        config="horovod_p100x4, 128 nodes x 4 P100, fp32, batch 64 per GPU (tf_cnn_benchmarks), Horovod (cycle 5 "
               "ms, fusion 64 MiB), NCCL 2 over RDMA",
        kwargs=dict(model="resnet101", cluster="horovod_p100x4", nodes=[128], per_gpu_batch=64, precision="fp32",
                    **HOROVOD_2018),
        workers=512, base_workers=1, efficiency_metric="throughput", published_efficiency=0.90,
    ),
    dict(
        name="Horovod: VGG-16, 512 GPUs",
        source="Sergeev & Del Balso 2018 (Horovod) and Horovod's README: 68% scaling efficiency at 512 GPUs",
        config="horovod_p100x4, 128 nodes x 4 P100, fp32, batch 64 per GPU, Horovod (cycle 5 ms, fusion 64 MiB)",
        kwargs=dict(model="vgg16", cluster="horovod_p100x4", nodes=[128], per_gpu_batch=64, precision="fp32",
                    **HOROVOD_2018),
        workers=512, base_workers=1, efficiency_metric="throughput", published_efficiency=0.68,
    ),
]


def role(anchor: dict) -> str:
    """"calibration" for an anchor that sets a parameter (it meets its goal by construction), else "check"."""
    return "calibration" if anchor.get("sets") else "check"


def tally(points: list[dict]) -> dict:
    """How many checks meet the goal, of how many; calibration anchors are not counted (module docstring)."""
    checks = [p for p in points if p["role"] == "check"]
    return {"met": sum(bool(p["meets_goal"]) for p in checks), "of": len(checks),
            "calibration": [p["name"] for p in points if p["role"] == "calibration"]}


def count_line(points: list[dict]) -> str:
    """The count as docs/projection.md and the projection README quote it."""
    counted = tally(points)
    calibration = len(counted["calibration"])
    return (f"{counted['met']} of {counted['of']} checks meet the goal; {calibration} calibration "
            f"anchor{'s' if calibration != 1 else ''} (setting a parameter, so meeting the goal by construction) "
            f"not counted")


def evaluate(anchor: dict) -> dict:
    """Project one anchor and compare: the point's figures, errors and whether it meets the goal."""
    kwargs = dict(anchor["kwargs"])
    df = run_projection(kwargs.pop("model"), kwargs.pop("cluster"), **kwargs).set_index("num_workers")
    row, base = df.loc[anchor["workers"]], df.loc[anchor["base_workers"]]
    scale = anchor["workers"] / anchor["base_workers"]
    out = {k: anchor[k] for k in ("name", "source", "config")}
    out.update(role=role(anchor), sets=anchor.get("sets"))
    out.update(workers=anchor["workers"], base_workers=anchor["base_workers"],
               projected={k: float(row[k]) for k in ("step_s", "allreduce_pct", "exposed_comm_pct",
                                                      "comm_overhead_pct", "interference_s", "straggler_s")},
               projected_base_step_s=float(base["step_s"]), notes=df.attrs.get("notes", []))
    checks = []
    if "published_efficiency" in anchor:
        metric = anchor["efficiency_metric"]
        if metric == "time_per_epoch":
            speedup = float(base["time_per_epoch_s"] / row["time_per_epoch_s"])
        else:
            speedup = float(row["throughput_samples_per_s"] / base["throughput_samples_per_s"])
        projected, published = speedup / scale, anchor["published_efficiency"]
        error_pp = 100 * (projected - published)
        out.update(efficiency_metric=metric, published_efficiency=published, projected_efficiency=projected,
                   efficiency_error_pp=error_pp)
        checks.append(abs(error_pp) <= EFFICIENCY_GOAL_PP)
    if "published_share_pct" in anchor:
        ratio = float(row["allreduce_pct"]) / anchor["published_share_pct"]
        out.update(published_share_pct=anchor["published_share_pct"], share_ratio=ratio)
        checks.append(1 / SHARE_GOAL_RATIO <= ratio <= SHARE_GOAL_RATIO)
    if "published_share_min_pct" in anchor:
        out.update(published_share_min_pct=anchor["published_share_min_pct"])
        checks.append(float(row["allreduce_pct"]) > anchor["published_share_min_pct"])
    out["meets_goal"] = all(checks)
    return out


def markdown(points: list[dict]) -> str:
    """docs/projection.md's table, from the results."""
    lines = ["| anchor | configuration | efficiency published / projected (error) | communicating published / "
             "projected | goal | role |", "|---|---|---|---|---|---|"]
    for p in points:
        eff = "-"
        if "published_efficiency" in p:
            base = f", over {p['base_workers']} GPU{'s' if p['base_workers'] > 1 else ''}"
            eff = (f"{100 * p['published_efficiency']:.1f}% / {100 * p['projected_efficiency']:.1f}% "
                   f"({p['efficiency_error_pp']:+.1f} pp; {p['efficiency_metric'].replace('_', ' ')}{base})")
        share = "-"
        projected_share = p["projected"]["allreduce_pct"]
        if "published_share_pct" in p:
            share = f"{p['published_share_pct']:.2f}% / {projected_share:.1f}% (×{p['share_ratio']:.2f})"
        elif "published_share_min_pct" in p:
            share = f"> {p['published_share_min_pct']:.0f}% / {projected_share:.1f}%"
        role_text = f"**calibration**: sets {p['sets']}" if p["role"] == "calibration" else "check"
        lines.append(f"| {p['name']} | {p['config']} | {eff} | {share} | "
                     f"{'meets' if p['meets_goal'] else '**misses**'} | {role_text} |")
    return "\n".join(lines + ["", count_line(points) + "."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print docs/projection.md's table")
    parser.add_argument("--quick", action="store_true",
                        help="the same benchmark (it takes seconds), written to bench/results/quick/ as `make bench QUICK=1` expects")
    args = parser.parse_args(argv)
    started, load_start = time.time(), load_average()
    points = [evaluate(anchor) for anchor in ANCHORS]
    path = write_result("projection_anchors", __doc__, args.quick, started, load_start, [], anchors=points,
                        goal={"efficiency_pp": EFFICIENCY_GOAL_PP, "share_ratio": SHARE_GOAL_RATIO},
                        **tally(points))
    for p in points:
        eff = (f"efficiency {100 * p['published_efficiency']:.1f}% published, {100 * p['projected_efficiency']:.1f}% "
               f"projected ({p['efficiency_error_pp']:+.1f} pp)" if "published_efficiency" in p else "")
        share = f"communicating {p['projected']['allreduce_pct']:.1f}%"
        calibration = f" (calibration: sets {p['sets']})" if p["role"] == "calibration" else ""
        print(f"{'meets ' if p['meets_goal'] else 'MISSES'}  {p['name']}{calibration}: {eff}{'; ' if eff else ''}{share}")
    print(f"{count_line(points)}; wrote {path}")
    if args.markdown:
        print(markdown(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
