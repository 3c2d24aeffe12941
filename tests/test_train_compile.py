"""`train.compile` in the lab's loop, in process (unit tier): the compiled model computes as the eager one
(aot_eager: forward and backward traced, no code generated, no compiler process), the config takes it with
DDP and FSDP2 and asks for warm-up steps to hold the compilation, and `CompileClock` reports the first
steps' extra time as `compile_s` once. The 2-rank runs: tests/test_train_compile_ranks.py (slow).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaling.config import ConfigError, load_config
from scaling.models.gpt import GPT, GPTShape
from scaling.train.compile import CompileClock, compile_forward
from tests.conftest import REPO
from tests.one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread)

TINY = REPO / "experiments" / "gpt2-tiny.yaml"
FSDP = REPO / "experiments" / "gpt2-tiny-fsdp.yaml"


def test_the_compiled_gpt_computes_the_eager_ones_loss_and_gradients():
    import torch._dynamo

    cfg = load_config(TINY, overrides=["train.compile=true", "train.compile_backend=aot_eager"])
    torch.manual_seed(0)
    model = GPT(GPTShape(layers=1, heads=2, width=16, context=8), 50)  # padded to 64
    ids, targets = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))
    torch._dynamo.reset()
    compiled = compile_forward(cfg, model)
    assert compiled is not model
    results = []
    for forward in (model, compiled):
        model.zero_grad()
        loss = F.cross_entropy(forward(ids).flatten(0, 1), targets.flatten())
        loss.backward()
        results.append((loss.detach(), model.tokens.weight.grad.clone()))
    torch.testing.assert_close(results[0], results[1])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it was compiled, not run eagerly
    torch._dynamo.reset()
    assert compile_forward(load_config(TINY), model) is model  # train.compile off: the model itself


@pytest.mark.parametrize("path", [TINY, FSDP])
def test_compile_is_taken_with_ddp_and_fsdp2_and_needs_warm_up_steps_to_hold_it(path):
    cfg = load_config(path, overrides=["train.compile=true"], num_workers=2)
    assert cfg.train.compile and cfg.train.compile_backend == "inductor"
    with pytest.raises(ConfigError, match="instrument.warmup_steps must be >= 2"):
        load_config(path, overrides=["train.compile=true", "instrument.warmup_steps=1"], num_workers=2)
    with pytest.raises(ConfigError, match="must be one of inductor, aot_eager"):
        load_config(path, overrides=["train.compile=true", "train.compile_backend=cudagraphs"])


def test_compile_clock_reports_the_first_steps_time_above_their_fastest_once(monkeypatch):
    from scaling.train import compile as compile_module

    ticks = iter([0.0, 5.0, 10.0, 10.5, 20.0, 20.25, 30.0, 30.25])  # steps of 5, 0.5, 0.25, 0.25 s
    monkeypatch.setattr(compile_module.time, "perf_counter", lambda: next(ticks))
    clock = CompileClock(3, torch.device("cpu"))
    for _ in range(2):
        clock.start()
        clock.stop()
    assert clock.columns() == {}  # not all its steps yet
    clock.start()
    clock.stop()
    assert clock.columns() == {"compile_s": pytest.approx(5.0 + 0.5 + 0.25 - 3 * 0.25), "compile_steps": 3}
    assert clock.columns() == {}  # once
    clock.start()  # later steps: not timed (perf_counter would run out of ticks)
    clock.stop()
    assert CompileClock(0, torch.device("cpu")).columns() == {}  # train.compile off: no column


def test_compile_clock_synchronizes_the_warm_up_steps_only(monkeypatch):
    """The one device sync per step it makes (on CUDA) stops with the warm-up: the steady steps run unsynchronised."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    device = torch.device("cuda", 0)
    for steps, expected in ((3, 3), (0, 0)):  # train.compile on (3 warm-up steps), off
        syncs.clear()
        clock = CompileClock(steps, device)
        for _ in range(10):
            clock.start()
            clock.stop()
        assert len(syncs) == expected and all(d == device for d in syncs)


@pytest.mark.parametrize(
    "name, model, batch, optimizer",
    [("gpu-gpt2-small.yaml", "gpt2-small", 32, "adamw"), ("gpu-resnet50.yaml", "resnet50", 256, "sgd")],
)
def test_the_gpu_configs_load_as_a_user_would_run_them(name, model, batch, optimizer):
    cfg = load_config(REPO / "experiments" / name)
    assert (cfg.model.name, cfg.train.per_worker_batch, cfg.optim.name) == (model, batch, optimizer)
    assert cfg.workers.use_gpu and cfg.train.precision == "bf16" and cfg.train.compile
    assert cfg.train.compile_backend == "inductor" and cfg.instrument.warmup_steps >= 2
    assert cfg.data.name in ("tokens", "synthetic")  # held on the device: a batch is an index into it
