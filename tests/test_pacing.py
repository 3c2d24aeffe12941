"""A paced 1-worker run (`instrument.pace_idle_s`): the baseline of a projection onto CPU nodes.

At one worker nothing is communicated, but a rank of a multi-worker run idles through every
collective, and a CPU's compute resumes slower after an idle (docs/projection.md). A paced run
idles wherever the job at more workers would wait on a collective: a plain model, or one
wrapped in DDP at one worker, once per step, after backward (its gradients' all-reduce); an
FSDP2 model at each unit's all-gather and reduce-scatter point, as many as the model issues at
two ranks (tests/test_fsdp.py counts those). Each idle is a pause of the step (`paused_s`), out
of its phases; the job computes the same losses paced or not.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests import fsdp_jobs

pytestmark = pytest.mark.slow  # training steps in a process group

PACE_S = 0.03
STEPS, WARMUP = 6, 1


@pytest.fixture(scope="module")
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(run_dir, kind: str, pace_s: float) -> list[float]:
    from scaling import instrument

    torch.manual_seed(0)
    model = fsdp_jobs.Blocks()
    if kind == "fsdp2":
        model = fsdp_jobs.sharded(model)
    elif kind == "ddp":  # as examples/own_job/train.py wraps it at one worker
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    with instrument.attach(
        model, optimizer, run_dir=str(run_dir), warmup_steps=WARMUP, calibration_pairs=0, pace_idle_s=pace_s
    ) as meter:
        for x, y in meter.batches(fsdp_jobs.batches(STEPS, seed=0)):
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        meter.end_epoch(val_accuracy=0.5)
    return losses


@pytest.mark.parametrize("kind", ["plain", "ddp", "fsdp2"])
def test_a_paced_run_idles_at_each_collective_point_outside_its_phases(one_rank_group, tmp_path, kind):
    paced = _train(tmp_path / "paced", kind, PACE_S)
    assert paced == _train(tmp_path / "unpaced", kind, 0.0)  # the job computes the same
    steps = pd.read_parquet(tmp_path / "paced" / "steps.parquet")
    train = steps[steps["kind"] == "train"].sort_values("step")
    assert len(train) == STEPS
    # as many idles as the job at two ranks waits on collectives: FSDP2 gathers every unit in forward,
    # each resharded block again in backward, and reduce-scatters every unit (tests/test_fsdp.py)
    points = (fsdp_jobs.BLOCKS + 1) + fsdp_jobs.BLOCKS + (fsdp_jobs.BLOCKS + 1) if kind == "fsdp2" else 1
    assert ((train["paused_s"] / PACE_S).median() // 1) == points, train["paused_s"].tolist()
    # out of the phases: a step's span (start to the next's start) is its phases and its idles, no more
    span = train["start_t"].diff().shift(-1).dropna()
    assert ((span - (train["step_s"] + train["paused_s"]).iloc[:-1]).abs() < 1e-4).all()
    phases = train["data_s"] + train["forward_s"] + train["backward_s"] + train["optimizer_s"]
    assert (phases - train["step_s"]).abs().max() < 1e-6


def test_pacing_is_refused_where_collectives_wait_themselves_or_steps_are_not_timed(one_rank_group, tmp_path):
    from scaling import instrument

    model = fsdp_jobs.Blocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(ValueError, match="pace_idle_s is for a 1-worker run with step timing"):
        instrument.attach(model, optimizer, run_dir=str(tmp_path), pace_idle_s=PACE_S, step_timing=False)
    from scaling.instrument.settings import InstrumentSettings

    assert InstrumentSettings(pace_idle_s=-1).problems("instrument.") == ["instrument.pace_idle_s must be >= 0, got -1"]
