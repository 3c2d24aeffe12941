"""The gradient noise scale (scaling/noise_scale.py): its estimator, and the instrument's two ways to feed it.

- The estimator's arithmetic: a step's two squared norms at their expected values give tr(Σ) and |G|²
  exactly; the interval covers the blocks' spread and has no upper bound where |G|² is not told from zero.
- Brute force (one worker, the calibration window): per-sample gradients of a small model over a fixed
  dataset give tr(Σ) and |G|² directly (Σ: the covariance of one sample's gradient, batches drawn with
  replacement); the instrument's estimate from pairs of batches of 16 at the same parameters must be within
  10% of tr(Σ)/|G|². Its spread over seeds of the batches, measured (2026-12-06, on a loaded 2-core machine):
  one standard deviation 4.7% of the truth over 5 seeds at 2,000 pairs (6.3% over 10 seeds at 1,000), so 10%
  is about two of them: the seed here is fixed and the result deterministic (28.1 to 31.3 over the 5 seeds
  against 29.3), the margin stated rather than wide.
- The all-reduce's norms (two gloo ranks, DDP, several buckets): each step's recorded |G_small|² is the rank's
  own gradient's squared norm (computed apart on a copy of the model), |G_big|² the all-reduced one's, by
  DDP's own path (the timing process group, which hands the rank's gradient divided by the world size) and
  through a user's comm hook (its bucket undivided); the epoch's figure takes each step's small-batch norm as
  the mean of the ranks'.
- The reduce-scatters' norms (two gloo ranks, FSDP2, a unit per layer and the root): the inputs' squared norms
  sum to the rank's own gradient's, the outputs' (each rank's shard of the average) summed over the ranks to
  the averaged gradient's, both computed apart on an unsharded copy.
"""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.func import functional_call, grad, vmap
from torch.nn.parallel import DistributedDataParallel

from scaling import noise_scale

PAIRS = 2000  # calibration pairs for the brute-force check (5 to 25 s on one core of a shared machine)
BATCH = 16


@pytest.mark.unit
def test_expected_norms_give_the_trace_and_the_gradient_exactly():
    grad_sq, trace = 2.0, 30.0
    small, big = 8, 64
    expected = (grad_sq + trace / small, grad_sq + trace / big)
    got_trace, got_grad_sq = noise_scale.step_terms(*expected, small, big)
    assert got_trace == pytest.approx(trace) and got_grad_sq == pytest.approx(grad_sq)
    figures = noise_scale.estimate([(*expected, small, big)] * 8)
    assert figures["noise_scale"] == pytest.approx(trace / grad_sq) and figures["noise_steps"] == 8
    # identical blocks: no spread, a zero-width interval
    assert figures["noise_scale_low"] == pytest.approx(15.0) and figures["noise_scale_high"] == pytest.approx(15.0)
    with pytest.raises(ValueError, match="batch_small < batch_big"):
        noise_scale.step_terms(1.0, 1.0, 8, 8)


@pytest.mark.unit
def test_the_interval_widens_with_the_spread_and_is_unbounded_where_the_gradient_is_noise():
    narrow = noise_scale.ratio_interval([(10, 30.0, 2.0), (10, 31.0, 2.1), (10, 29.0, 1.9)])
    wide = noise_scale.ratio_interval([(10, 20.0, 1.0), (10, 40.0, 3.0), (10, 30.0, 2.0)])
    assert narrow["noise_scale_low"] < narrow["noise_scale"] < narrow["noise_scale_high"]
    assert wide["noise_scale_high"] - wide["noise_scale_low"] > narrow["noise_scale_high"] - narrow["noise_scale_low"]
    noise = noise_scale.ratio_interval([(10, 30.0, 2.0), (10, 30.0, -1.5), (10, 30.0, 0.5)])
    assert noise["noise_scale"] > 0 and noise["noise_scale_high"] == math.inf
    below = noise_scale.ratio_interval([(10, 30.0, -1.0), (10, 30.0, 0.5)])
    assert math.isnan(below["noise_scale"])
    few = noise_scale.estimate([(3.0, 2.5, 8, 16)] * 3)  # under MIN_STEPS: an estimate, no interval
    assert math.isfinite(few["noise_scale"]) and math.isnan(few["noise_scale_low"])


def _dataset(n: int = 512):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=generator)
    teacher = torch.randn(8, 4, generator=generator)
    y = (x @ teacher + 1.5 * torch.randn(n, 4, generator=generator)).argmax(1)
    torch.manual_seed(0)
    return x, y, nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _brute_force(x, y, model) -> tuple[float, float]:
    """(tr(Σ), |G|²) from every sample's own gradient: Σ the covariance over the dataset."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(len(x), -1) for g in per_sample.values()], 1).double()
    mean = flat.mean(0)
    return float(((flat - mean) ** 2).sum(1).mean()), float(mean @ mean)


@pytest.mark.unit
def test_one_workers_estimate_matches_per_sample_gradients_within_ten_percent():
    from scaling import instrument

    torch.set_num_threads(1)
    x, y, model = _dataset()
    trace, grad_sq = _brute_force(x, y, model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the parameters stay where brute force looked
    generator = torch.Generator().manual_seed(1)

    def forward_backward(batch):
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()

    def calibration(epoch):  # batches drawn with replacement: the estimator's i.i.d. samples
        for _ in range(2 * PAIRS):
            index = torch.randint(0, len(x), (BATCH,), generator=generator)
            yield x[index], y[index]

    meter = instrument.attach(
        model,
        optimizer,
        warmup_steps=0,
        telemetry_interval_s=0,
        calibration_pairs=PAIRS,
        forward_backward=forward_backward,
        calibration_data=calibration,
    )
    for batch in meter.batches([(x[:BATCH], y[:BATCH])]):
        forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad()
    row = meter.end_epoch(val_accuracy=0.5)
    meter.finish()
    assert row["noise_steps"] == PAIRS
    assert row["noise_scale"] == pytest.approx(trace / grad_sq, rel=0.10)
    assert row["grad_trace"] == pytest.approx(trace, rel=0.10)
    assert row["noise_scale_low"] < trace / grad_sq < row["noise_scale_high"]


# --- two ranks: the all-reduce's norms -------------------------------------------------------------------
STEPS = 4


def _squared(parameters) -> float:
    return float(sum((p.grad.double() ** 2).sum() for p in parameters))


def _ddp_case(rank: int, run_dir: str, user_hook: bool) -> list[dict]:
    from scaling import instrument

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    own = copy.deepcopy(module)  # the rank's gradient, computed apart
    model = DistributedDataParallel(module, bucket_cap_mb=0.01)  # ~2,600 floats a bucket: several buckets
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    meter = instrument.attach(
        model, optimizer, run_dir=run_dir, warmup_steps=0, collective_timing_every=1, telemetry_interval_s=0
    )
    if user_hook:
        model.register_comm_hook(None, allreduce_hook)  # after attaching: kept, timed, and its norms read
    generator = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, 8, generator=generator), torch.randint(0, 4, (BATCH,), generator=generator))]
    batches *= STEPS
    expected = []
    for x, y in meter.batches(batches):
        nn.functional.cross_entropy(model(x), y).backward()
        own.zero_grad()
        nn.functional.cross_entropy(own(x), y).backward()
        expected.append({"small": _squared(own.parameters()), "big": _squared(model.parameters())})
        optimizer.step()
        optimizer.zero_grad()
    meter.end_epoch(val_accuracy=0.5)
    meter.finish()
    return expected


def _fsdp_case(rank: int, run_dir: str) -> list[dict]:
    from torch.distributed.fsdp import fully_shard

    from scaling import instrument

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    own = copy.deepcopy(module)  # the rank's gradient, and the average, computed apart
    for layer in (module[0], module[2], module[4]):
        fully_shard(layer)
    model = fully_shard(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    meter = instrument.attach(
        model, optimizer, run_dir=run_dir, warmup_steps=0, collective_timing_every=1, telemetry_interval_s=0
    )
    generator = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, 8, generator=generator), torch.randint(0, 4, (BATCH,), generator=generator))]
    expected = []
    for x, y in meter.batches(batches * STEPS):
        nn.functional.cross_entropy(model(x), y).backward()
        own.zero_grad()
        nn.functional.cross_entropy(own(x), y).backward()
        small = _squared(own.parameters())
        for p in own.parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2
        expected.append({"small": small, "big": _squared(own.parameters())})
        optimizer.step()
        optimizer.zero_grad()
    meter.end_epoch(val_accuracy=0.5)
    meter.finish()
    return expected


def _two_rank_job(rank: int, port: int, tmp: str) -> None:
    from scaling.launch.local import exit_without_finalization, release_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for case in ("reducer", "hook", "fsdp"):
        if case == "fsdp":
            expected = _fsdp_case(rank, os.path.join(tmp, case))
        else:
            expected = _ddp_case(rank, os.path.join(tmp, case), user_hook=case == "hook")
        with open(os.path.join(tmp, f"{case}.rank{rank}.json"), "w") as f:
            json.dump(expected, f)
    release_process_group()
    exit_without_finalization()


@pytest.mark.slow
def test_the_collectives_norms_are_the_ranks_gradient_and_the_global_one(tmp_path):
    from scaling.launch.local import start_workers
    from scaling.results import RunDir
    from scaling.testbed.local_cluster import free_port

    start_workers(_two_rank_job, (free_port(), str(tmp_path)), 2)
    for case in ("reducer", "hook", "fsdp"):
        steps = RunDir(tmp_path / case).steps()
        for rank in range(2):
            expected = json.loads((tmp_path / f"{case}.rank{rank}.json").read_text())
            mine = steps[(steps["rank"] == rank) & (steps["kind"] == "train")].sort_values("step")
            assert len(mine) == STEPS, case
            for row, want in zip(mine.itertuples(), expected):
                assert row.grad_sq_small == pytest.approx(want["small"], rel=1e-4), (case, rank)
                assert row.grad_sq_big == pytest.approx(want["big"], rel=1e-4), (case, rank)
                assert (row.noise_batch_small, row.noise_batch_big) == (BATCH, 2 * BATCH)
        epochs = RunDir(tmp_path / case).epochs()
        assert epochs["noise_steps"].iloc[0] == STEPS
        # the epoch's figure pools the ranks: each step's small-batch norm the mean of the two ranks' own
        both = [json.loads((tmp_path / f"{case}.rank{rank}.json").read_text()) for rank in range(2)]
        terms = [
            noise_scale.step_terms((a["small"] + b["small"]) / 2, a["big"], BATCH, 2 * BATCH) for a, b in zip(*both)
        ]
        assert epochs["grad_trace"].iloc[0] == pytest.approx(sum(t for t, _ in terms) / STEPS, rel=1e-4)
        assert epochs["grad_sq"].iloc[0] == pytest.approx(sum(g for _, g in terms) / STEPS, rel=1e-4)


@pytest.mark.unit
def test_a_sweeps_tables_give_the_tta_gap_the_noise_scale_expects_and_the_claim_names_the_cause():
    import pandas as pd

    from scaling.analysis import intervals as iv
    from scaling.analysis import scaling_tables as st
    from scaling.report import headline_claims

    rows = []
    for workers, tta_s in ((1, 100.0), (4, 50.0)):  # throughput 4x; TTA only 2x: a gap of 0.5
        for repeat in range(3):
            rows.append(
                {
                    "num_workers": workers,
                    "status": "target_reached",
                    "global_batch": 64 * workers,
                    "throughput_samples_per_s": 100.0 * workers * (1 + 0.01 * repeat),
                    "time_per_epoch_s": 10.0 / workers,
                    "tta_s": tta_s * (1 + 0.01 * repeat),
                    "epochs_to_target": 10.0,
                    "noise_scale": 128.0 if workers == 1 else 500.0,
                    "repeat": repeat,
                }
            )
    runs = st.prepare_runs(pd.DataFrame(rows))
    table = st.add_speedup(st.per_worker_count(runs))
    # the baseline's noise scale: (1 + 64/128) / (1 + 256/128) = 0.5 expected from samples-to-target growth alone
    assert table.loc[table["num_workers"] == 4, "gap_tta_model"].item() == pytest.approx(0.5)
    assert table.loc[table["num_workers"] == 1, "gap_tta_model"].item() == pytest.approx(1.0)
    claims = headline_claims(iv.scaling_intervals(runs, table))
    assert any("samples-to-target growth at the larger batch explains it" in claim for claim in claims), claims
    from scaling.plots.figures import throughput_vs_tta_figure

    figure = throughput_vs_tta_figure(table)  # the model's TTA speedup drawn beside the measured bars
    labels = [text.get_text() for ax in figure.axes if ax.get_legend() for text in ax.get_legend().get_texts()]
    assert "TTA speedup, noise-scale model" in labels
    slower = runs.assign(tta_s=runs["tta_s"].where(runs["num_workers"] == 1, runs["tta_s"] * 1.6))  # gap 0.31
    table = st.add_speedup(st.per_worker_count(slower))
    claims = headline_claims(iv.scaling_intervals(slower, table))
    assert any("more than samples-to-target growth explains" in claim for claim in claims), claims
