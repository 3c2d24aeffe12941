"""Horovod as a second backend (issue 5): a 2-process Horovod job on gloo, with Horovod's rendezvous
set up by scaling.train.horovod_backend over the job's torch.distributed group.

One pair of processes (module fixture: the plain launcher's, `scaling.launch.local.start_workers`)
runs, on both ranks: the same tiny model trained for a few steps with DDP and with Horovod from the
same (deliberately rank-different) initialisation and the same per-rank data; a backward under
`no_sync`; then shuts Horovod down so that rank 0's timeline is complete. The tests check what it
returned. The same job placed by Ray Train V2's TorchTrainer on two minicluster nodes, its
rendezvous over Ray Train's group: `test_two_nodes_of_the_minicluster`; the lab's own Horovod runs
under Ray Train: tests/test_horovod_run.py.

Needs Horovod (`make horovod`); the Horovod tests skip with the reason when it does not import.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from scaling.train import horovod_backend as hb

HOROVOD_OK, HOROVOD_WHY = hb.available()
needs_horovod = pytest.mark.skipif(not HOROVOD_OK, reason=HOROVOD_WHY or "horovod unavailable")

STEPS = 6
IN_FEATURES, HIDDEN, CLASSES, BATCH = 32, 64, 10, 16
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4
FUSION_BYTES, CYCLE_MS = 1 << 20, 2.5


# --- what runs on each Ray worker --------------------------------------------------------------


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


def _batches(rank: int, count: int):
    """Different data on each rank, the same for both backends."""
    import torch

    gen = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(BATCH, IN_FEATURES, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
        for _ in range(count)
    ]


def _sgd(model):
    import torch

    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True, weight_decay=WEIGHT_DECAY)


def _flat(tensors):
    import torch

    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def _job(rank: int, world: int, local_rank: int, local_world: int, node_rank: int, timeline: str) -> list[dict]:
    """Both ranks' results (every rank returns them all), on an initialised torch.distributed group."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from scaling.instrument.backends.horovod import HorovodCommTimer, horovod_no_sync
    from scaling.instrument.timing import Clock, StepMarks
    from scaling.train import horovod_backend as hb

    torch.set_num_threads(1)
    batches = _batches(rank, STEPS + 1)
    out: dict = {"rank": rank}

    # DDP: every rank starts from its own init; DDP broadcasts rank 0's.
    model = _model(1000 + rank)
    ddp = DistributedDataParallel(model)
    opt = _sgd(ddp)
    ddp_losses = []
    for x, y in batches[:STEPS]:
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ddp_losses.append(loss.item())
    out["ddp_losses"] = ddp_losses
    out["ddp_final"] = _flat(model.parameters())

    # Horovod, rendezvous through this torch.distributed group.
    ranks = hb.setup_horovod_env_and_init(
        rank, world, local_rank, local_world, node_rank, None, tuning=hb.HorovodTuning(FUSION_BYTES, CYCLE_MS, timeline)
    )
    import horovod.torch as hvd

    ours = (ranks.rank, ranks.size, ranks.local_rank, ranks.cross_rank)
    out["ranks"] = (ours, (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_rank()))
    out["node_rank"] = node_rank
    out["env"] = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}

    model = _model(1000 + rank)
    rank0_init = [_flat(model.parameters()) if rank == 0 else None]
    dist.broadcast_object_list(rank0_init, src=0)
    opt = _sgd(model)
    try:
        hb.wrap_optimizer(opt, model, fusion_threshold_bytes=FUSION_BYTES * 2)
        out["mismatch_raised"] = False
    except ValueError:
        out["mismatch_raised"] = True
    hopt = hb.wrap_optimizer(opt, model, fusion_threshold_bytes=FUSION_BYTES, cycle_time_ms=CYCLE_MS)
    out["start_equals_rank0"] = bool(torch.equal(_flat(model.parameters()), rank0_init[0]))
    out["optimizer_state_after_wrap"] = len(hopt.state_dict()["state"])

    clock = Clock()
    timer = HorovodCommTimer(hopt, clock)
    hvd_losses, records = [], []
    for step, (x, y) in enumerate(batches[:STEPS]):
        start = clock.mark()
        loss = F.cross_entropy(model(x), y)
        after_forward = clock.mark()
        loss.backward()
        timer.synchronize()  # the exposed wait is part of backward, as with DDP
        after_backward = clock.mark()
        with hopt.skip_synchronize():
            hopt.step()
        hopt.zero_grad()
        records.append(
            StepMarks.single(
                1,
                step,
                "train",
                False,
                len(y),
                start,
                (start, after_forward, after_backward, clock.mark()),
                timer.take(),
            ).resolve(clock)
        )
        hvd_losses.append(loss.item())
    out["hvd_losses"] = hvd_losses
    out["hvd_final"] = _flat(model.parameters())
    out["records"] = records
    out["num_params"] = len(list(model.parameters()))

    # no_sync: a backward that launches no all-reduce; gradients stay this rank's own.
    x, y = batches[STEPS]
    reference = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    with horovod_no_sync(hopt):
        F.cross_entropy(model(x), y).backward()
    out["nosync_launched"] = timer.handed_over()
    out["nosync_grad"] = _flat(p.grad for p in model.parameters())
    out["nosync_equals_local"] = bool(torch.equal(out["nosync_grad"], _flat(reference)))
    hopt.zero_grad()  # refused by Horovod if placeholders of the no_sync pass were left behind
    # and the hooks are live again: the next backward is averaged; the noise scale's norms taken around it
    timer.norms = True
    F.cross_entropy(model(x), y).backward()
    timer.synchronize()
    before, after, factor = timer.take_norms()
    out["norms"] = (factor * float(torch.stack(before).sum()), float(torch.stack(after).sum()))
    out["sync_grad"] = _flat(p.grad for p in model.parameters())
    out["local_grad"] = _flat(reference)
    hopt.zero_grad()

    hb.shutdown()  # closes rank 0's timeline
    # Ray refuses torch tensors in a return value: numpy arrays instead
    out = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, out)
    return gathered


def _ray_train_job(config: dict) -> list[dict]:
    import ray.train

    ctx = ray.train.get_context()
    return _job(
        ctx.get_world_rank(),
        ctx.get_world_size(),
        ctx.get_local_rank(),
        ctx.get_local_world_size(),
        ctx.get_node_rank(),
        config["timeline"],
    )


def _fit(timeline: str, storage: str) -> list[dict]:
    """Run `_job` on 2 Ray Train workers of the connected cluster; every rank's results."""
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import tests/
    trainer = TorchTrainer(
        train_loop_per_worker=_ray_train_job,
        train_loop_config={"timeline": timeline},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="horovod_test", storage_path=storage),
    )
    return trainer.fit().return_value


TIMELINE, RESULTS = "timeline.json", "ranks.pkl"


def _plain_job(rank: int, port: int, tmp: str) -> None:
    """`_job` on one machine's 2 processes (the plain launcher's); rank 0 writes the results."""
    import pickle

    import torch.distributed as dist

    from scaling.launch.local import exit_without_finalization, release_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = _job(rank, 2, rank, 2, 0, os.path.join(tmp, TIMELINE))
    if rank == 0:
        with open(os.path.join(tmp, RESULTS), "wb") as f:
            pickle.dump(results, f)
    release_process_group()
    exit_without_finalization()


@pytest.fixture(scope="module")
def hvd_job(tmp_path_factory):
    import pickle

    from scaling.launch.local import start_workers
    from scaling.testbed.local_cluster import free_port

    if not HOROVOD_OK:
        pytest.skip(HOROVOD_WHY)
    tmp = tmp_path_factory.mktemp("horovod")
    start_workers(_plain_job, (free_port(), str(tmp)), 2)
    return pickle.loads((tmp / RESULTS).read_bytes()), tmp / TIMELINE


# --- tests -----------------------------------------------------------------------------------


@needs_horovod
def test_rendezvous_over_the_torch_group_gives_its_ranks(hvd_job):
    outs, _ = hvd_job
    assert [o["rank"] for o in outs] == [0, 1]
    for o in outs:
        ours, horovods = o["ranks"]
        assert ours == horovods == (o["rank"], 2, o["rank"], 0)  # one node: local rank = rank, cross rank 0
        env = o["env"]
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_GLOO_IFACE"] == "lo" and env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        # tuning reached the environment that hvd.init() read
        assert env["HOROVOD_FUSION_THRESHOLD"] == str(FUSION_BYTES) and float(env["HOROVOD_CYCLE_TIME"]) == CYCLE_MS
        assert o["mismatch_raised"], "a fusion threshold that init did not apply must be refused"


@needs_horovod
def test_wrap_optimizer_starts_every_rank_at_rank0s_parameters_and_ends_identical(hvd_job):
    outs, _ = hvd_job
    for o in outs:
        assert o["start_equals_rank0"], "broadcast_parameters must give rank 0's init, unmoved by any optimizer step"
        assert o["optimizer_state_after_wrap"] == 0
    assert np.array_equal(outs[0]["hvd_final"], outs[1]["hvd_final"])
    assert outs[0]["hvd_losses"] != outs[1]["hvd_losses"]  # the ranks did see different data


@needs_horovod
def test_no_sync_keeps_gradients_rank_local(hvd_job):
    outs, _ = hvd_job
    for o in outs:
        assert o["nosync_launched"] == 0  # no all-reduce was handed to Horovod
        assert o["nosync_equals_local"]  # the gradient is this rank's own, bit for bit
    assert not np.allclose(outs[0]["nosync_grad"], outs[1]["nosync_grad"])
    # after the block the hooks work again: the next backward is averaged across ranks
    assert np.array_equal(outs[0]["sync_grad"], outs[1]["sync_grad"])
    mean_local = (outs[0]["local_grad"] + outs[1]["local_grad"]) / 2
    assert np.allclose(outs[0]["sync_grad"], mean_local, rtol=1e-5, atol=1e-7)


@needs_horovod
def test_the_noise_scales_norms_are_the_ranks_gradient_and_the_average(hvd_job):
    outs, _ = hvd_job
    # the two squared norms scaling/noise_scale.py reads: this rank's own gradient, and the averaged one
    for o in outs:
        small, big = o["norms"]
        assert small == pytest.approx(float((o["local_grad"].astype(np.float64) ** 2).sum()), rel=1e-4)
        assert big == pytest.approx(float((o["sync_grad"].astype(np.float64) ** 2).sum()), rel=1e-4)


@needs_horovod
def test_step_records_time_horovod_communication(hvd_job):
    outs, _ = hvd_job
    for o in outs:
        for record in o["records"]:
            assert record["num_buckets"] == o["num_params"]  # one mark per parameter tensor
            assert 0 <= record["exposed_comm_s"] <= record["backward_s"]
            assert record["allreduce_s"] > 0


@needs_horovod
def test_timeline_parses_into_allreduce_intervals(hvd_job):
    outs, timeline = hvd_job
    assert timeline.is_file(), "rank 0 writes the timeline"
    df = hb.parse_timeline(timeline)
    assert list(df.columns) == ["tensor", "phase", "start_s", "end_s", "duration_s"]
    assert len(df) > 0 and (df["phase"] == "ALLREDUCE").all()
    assert (df["duration_s"] >= 0).all() and (df["end_s"] >= df["start_s"]).all()
    # every parameter's gradient was all-reduced, and more than once: Horovod's timeline writer is a
    # thread of its own that may start after the first cycles (one run under load kept 4 of the 7
    # all-reduces per tensor), so the count is not the job's
    per_tensor = df.groupby("tensor").size()
    assert len(per_tensor) >= outs[0]["num_params"]
    assert 2 <= per_tensor.max() <= STEPS + 1
    everything = hb.parse_timeline(timeline, phase=None)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= set(everything["phase"])


@needs_horovod
def test_ddp_and_horovod_follow_the_same_loss_trajectory(hvd_job):
    """Both average gradients over the ranks: the same math, so the same losses step by step."""
    outs, _ = hvd_job
    for o in outs:
        ddp, hvd = np.array(o["ddp_losses"]), np.array(o["hvd_losses"])
        assert len(ddp) == len(hvd) == STEPS
        assert np.allclose(hvd, ddp, rtol=1e-4, atol=0), (o["rank"], o["ddp_losses"], o["hvd_losses"])
        assert np.allclose(o["hvd_final"], o["ddp_final"], rtol=1e-4, atol=1e-6)
    assert outs[0]["ddp_losses"][-1] < outs[0]["ddp_losses"][0]  # it did train


@needs_horovod
def test_two_nodes_of_the_minicluster(whole_minicluster, tmp_path):
    """One worker on each of two network-namespace nodes whose hostname resolves to 127.0.0.1:
    Horovod 0.28.1 as released binds its collectives' gloo device by hostname there and fails
    (`connect [127.0.0.1]`); the build's patch makes it use HOROVOD_GLOO_IFACE (lab0 here).
    On the session's minicluster (tests/conftest.py): skips where its network cannot be built,
    fails where `.ci/run` requires it."""
    from tests.conftest import MINICLUSTER_SUBNET, REPO, run_cli

    out = tmp_path / "outs.json"
    run = run_cli(
        "minicluster",
        "exec",
        "--name",
        whole_minicluster,
        "--",
        sys.executable,
        str(REPO / "tests" / "test_horovod.py"),
        str(out),
        str(tmp_path),
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    outs = json.loads(out.read_text())
    assert sorted(o["node_rank"] for o in outs) == [0, 1]
    for o in outs:
        (rank, size, local_rank, cross_rank), horovods = o["ranks"]
        assert (rank, size, local_rank) == (o["rank"], 2, 0) and cross_rank == o["node_rank"]
        assert list(horovods) == [rank, size, local_rank, cross_rank]
        assert o["env"]["HOROVOD_GLOO_IFACE"] == "lab0" and o["env"]["HOROVOD_HOSTNAME"] == f"node{o['node_rank']}"
        assert o["env"]["HOROVOD_GLOO_RENDEZVOUS_ADDR"].startswith(MINICLUSTER_SUBNET.rsplit(".", 1)[0] + ".")
        assert np.allclose(o["hvd_losses"], o["ddp_losses"], rtol=1e-4, atol=0)
    assert outs[0]["hvd_final"] == outs[1]["hvd_final"]


# --- without horovod ---------------------------------------------------------------------------


def test_compute_ranks_matches_horovods_coordinator():
    # two nodes with two processes each, ranks interleaved across nodes
    ranks = hb.compute_ranks([(0, 0), (1, 0), (0, 1), (1, 1)])
    assert [(r.rank, r.local_rank, r.local_size, r.cross_rank, r.cross_size) for r in ranks] == [
        (0, 0, 2, 0, 2),
        (1, 0, 2, 1, 2),
        (2, 1, 2, 0, 2),
        (3, 1, 2, 1, 2),
    ]
    # uneven nodes: local rank 1 exists on node 0 only
    ranks = hb.compute_ranks([(0, 0), (0, 1), (1, 0)])
    assert [(r.local_size, r.cross_rank, r.cross_size) for r in ranks] == [(2, 0, 2), (2, 0, 1), (1, 1, 2)]


def test_tuning_env_and_validation(tmp_path):
    tuning = hb.HorovodTuning.from_mb(4, 3.5, str(tmp_path / "t.json"))
    assert tuning.env() == {
        "HOROVOD_FUSION_THRESHOLD": str(4 << 20),
        "HOROVOD_CYCLE_TIME": "3.5",
        "HOROVOD_TIMELINE": str(tmp_path / "t.json"),
    }
    assert hb.HorovodTuning().env() == {}
    with pytest.raises(ValueError, match="absolute"):
        hb.HorovodTuning(timeline_path="relative.json").env()


def test_parse_timeline_reads_a_trace_cut_mid_event(tmp_path):
    """Horovod's format: metadata lines, then events appended as `,{...}]` on one line; a file
    read while Horovod writes can end inside an event, which is left out."""
    path = tmp_path / "t.json"
    head = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1700000000000000}},
        {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "fc.weight"}},
    ]
    events = [
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1000, "pid": 1},
        {"ph": "E", "ts": 1500, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 1500, "pid": 1},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 1600, "pid": 1},
        {"ph": "E", "ts": 2600, "pid": 1},
        {"ph": "E", "ts": 3000, "pid": 1},
    ]
    text = "[\n" + "".join(json.dumps(e) + ",\n" for e in head) + ",".join(json.dumps(e) for e in events)
    path.write_text(text + "]")
    complete = hb.parse_timeline(path)
    assert complete.to_dict("records") == [
        pytest.approx(
            {"tensor": "fc.weight", "phase": "ALLREDUCE", "start_s": 0.0015, "end_s": 0.003, "duration_s": 0.0015}
        )
    ]
    assert complete.attrs["start_unix_s"] == 1700000000.0
    path.write_text(text + ',{"ph": "B", "ts": 40')
    assert hb.parse_timeline(path).to_dict("records") == complete.to_dict("records")
    everything = hb.parse_timeline(path, phase=None)
    assert set(everything["phase"]) == {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE"}
    assert everything.set_index("phase").loc["GLOO_ALLREDUCE", "depth"] == 1


if __name__ == "__main__":
    # `python tests/test_horovod.py OUT_JSON TMP_DIR`: the job on the Ray cluster at RAY_ADDRESS
    # (run inside a minicluster node by test_two_nodes_of_the_minicluster).
    from scaling.launch.ray_train import connect

    connect(log_to_driver=False)
    results = _fit(os.path.join(sys.argv[2], "timeline.json"), os.path.join(sys.argv[2], "ray"))
    plain = [
        {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in o.items() if k != "records"} for o in results
    ]
    with open(sys.argv[1], "w") as f:
        json.dump(plain, f)
