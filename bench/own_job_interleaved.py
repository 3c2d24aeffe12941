"""The user's job of examples/own_job twice in one Ray Train run, its steps interleaved: one copy
with the instrument attached, one without; the train function of
bench/instrumentation_overhead.py `--job own`.

`train_func` is the run's `train.function` (`scaling run examples/own_job/sweep.yaml --launcher
ray --set train.function=bench.own_job_interleaved:train_func ...`). On every worker it builds
the job of examples/own_job/train.py twice, from that file's own parts (`make_datasets`,
`TinyViT`, `prepare_model`, `prepare_data_loader`, Adam, cross-entropy): "instrumented" is
attached as the job attaches it (`instrument.attach(model, optimizer, forward_backward=...,
calibration_data=...)`, with the settings `scaling run` hands a user's function), "bare" is not
attached at all. Each epoch, the two jobs' steps alternate, the order flipped every step
(instrumented bare bare instrumented ...); a step's window is the request for its batch through
`optimizer.step()`, timed by bench/benchlib.py `StepWindows` (wall clock, the process's CPU,
garbage collection), and the instrumented job's closing request of an epoch (where the meter
ends its last step) is added to its last step. After the epoch, outside the windows, the
instrumented job evaluates, ends its epoch and reports to Ray Train, as the job does. Each rank
writes its windows to `windows-rank<r>.json` in the run directory.
"""

from __future__ import annotations

import json
import os

ARMS = ("instrumented", "bare")


def windows_file(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"windows-rank{rank}.json")


def train_func(config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from bench.benchlib import StepWindows
    from torch import nn
    from torch.utils.data import DataLoader

    from examples.own_job.data import make_datasets
    from examples.own_job.train import evaluate
    from examples.own_job.vit import TinyViT
    from scaling import instrument
    from scaling.instrument.settings import LaunchedRun

    torch.manual_seed(config.get("seed", 0))
    train_set, val_set = make_datasets(num_train=config.get("num_train", 2048), seed=config.get("seed", 0))
    criterion = nn.CrossEntropyLoss()
    jobs = {}
    for arm in ARMS:
        model = ray.train.torch.prepare_model(TinyViT(num_classes=10))
        loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True, drop_last=True)
        jobs[arm] = (
            model,
            torch.optim.Adam(model.parameters(), lr=config["lr"]),
            ray.train.torch.prepare_data_loader(loader),
        )
    model, optimizer, train_loader = jobs["instrumented"]

    def forward_backward(batch):
        images, labels = batch
        criterion(model(images), labels).backward()

    windows, last_loss = StepWindows(), {}
    world_size = ray.train.get_context().get_world_size()
    with instrument.attach(model, optimizer, forward_backward=forward_backward, calibration_data=train_loader) as meter:
        for epoch in range(config["epochs"]):
            iterators = {}
            for arm, (_, _, loader) in jobs.items():
                if world_size > 1:
                    loader.sampler.set_epoch(epoch)
                iterators[arm] = iter(meter.batches(loader) if arm == "instrumented" else loader)
            for step in range(10**9):
                ended = []
                for arm in ARMS if step % 2 == 0 else ARMS[::-1]:
                    arm_model, arm_optimizer, _ = jobs[arm]
                    start = windows.now()
                    batch = next(iterators[arm], None)
                    if batch is not None:
                        images, labels = batch
                        loss = criterion(arm_model(images), labels)
                        arm_optimizer.zero_grad()
                        loss.backward()
                        arm_optimizer.step()
                        last_loss[arm] = loss
                    else:
                        ended.append(arm)
                    windows.add(epoch + 1, arm, start, windows.now(), into_last=batch is None)
                if ended:
                    if len(ended) != 2:
                        raise RuntimeError(f"the two jobs' epochs differ in length: {ended} ended first")
                    break
            accuracy = evaluate(model, val_set)
            meter.end_epoch(val_accuracy=accuracy)
            ray.train.report({"loss": last_loss["instrumented"].item(), "epoch": epoch, "val_accuracy": accuracy})
    windows.close()
    with open(windows_file(LaunchedRun.from_environment().run_dir, ray.train.get_context().get_world_rank()), "w") as f:
        json.dump(windows.rows, f)


if __name__ == "__main__":
    # A train function, not a benchmark: run as a script it only says so (and answers --help).
    import argparse

    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The train function bench/instrumentation_overhead.py --job own runs under Ray Train; it measures "
        "nothing "
        "itself.",
    ).parse_args()
    print("bench/own_job_interleaved.py is the train function of bench/instrumentation_overhead.py --job own")
