"""A user's own Ray Train job, in the shape of Ray's TorchTrainer quickstart, instrumented.

Its own model (vit.py, not in the lab's registry), its own DataLoader over generated data
(data.py), `prepare_model`, `prepare_data_loader`, `ray.train.report`. The lines marked
`# scaling` are all that measuring it takes (README, "Measure your own job"; docs/own-job.md).

Run it on its own (records in results/own-job/w2, summary and figures as for the lab's runs):

    python -m examples.own_job.train --workers 2 --out results/own-job/w2

or let the lab drive it over worker counts (examples/own_job/sweep.yaml names `train_func`):

    scaling sweep examples/own_job/sweep.yaml --workers 1,2 --out results/own-job
"""

import argparse

import ray.train
import ray.train.torch
import torch
from torch import nn
from torch.utils.data import DataLoader

from examples.own_job.data import make_datasets
from examples.own_job.vit import TinyViT
from scaling import instrument  # scaling


def evaluate(model, dataset) -> float:
    model.eval()
    with torch.no_grad():
        images, labels = dataset.tensors
        accuracy = (model(images).argmax(dim=1) == labels).float().mean().item()
    model.train()
    return accuracy


def train_func(config: dict):
    torch.manual_seed(config.get("seed", 0))
    train_set, val_set = make_datasets(num_train=config.get("num_train", 2048), seed=config.get("seed", 0))
    model = TinyViT(num_classes=10)
    model = ray.train.torch.prepare_model(model)
    if ray.train.get_context().get_world_size() == 1:  # scaling: DDP's own work in the 1-worker run too
        model = torch.nn.parallel.DistributedDataParallel(model)  # scaling: (prepare_model wraps only at 2+)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    train_loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True, drop_last=True)
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    def forward_backward(batch):  # scaling: one forward + backward, for the A/B overhead
        images, labels = batch  # scaling
        criterion(model(images), labels).backward()  # scaling

    with instrument.attach(
        model,
        optimizer,
        run_dir=config.get("run_dir"),  # scaling
        forward_backward=forward_backward,
        calibration_data=train_loader,
    ) as meter:  # scaling
        for epoch in range(config["epochs"]):
            if ray.train.get_context().get_world_size() > 1:
                train_loader.sampler.set_epoch(epoch)
            for images, labels in meter.batches(train_loader):  # scaling: was `in train_loader`
                outputs = model(images)
                loss = criterion(outputs, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            accuracy = evaluate(model, val_set)
            meter.end_epoch(val_accuracy=accuracy)  # scaling
            ray.train.report({"loss": loss.item(), "epoch": epoch, "val_accuracy": accuracy})


def main() -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", required=True, help="the run directory the instrument writes")
    args = parser.parse_args()
    import os

    run_dir = os.path.abspath(args.out)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 1e-3, "batch_size": 32, "epochs": args.epochs, "run_dir": run_dir},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(run_dir, "ray_train")),
    )
    trainer.fit()
    print(f"records and summary in {run_dir}")


if __name__ == "__main__":
    main()
