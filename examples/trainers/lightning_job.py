"""A Lightning job under Ray Train, as Ray's guide writes it, measured by one callback.

A small classifier (a LightningModule) on generated data, `lightning.Trainer` inside a Ray Train
`train_func` with `ray.train.lightning`'s RayDDPStrategy, RayLightningEnvironment and
prepare_trainer. The lines that instrument it are marked `# scaling`. Runs on CPU, under Ray Train or
under torchrun (Lightning's own DDP strategy):

    .venv/bin/python -m examples.trainers.lightning_job --workers 2 --out results/lightning-alone
    .venv/bin/torchrun --nproc_per_node 2 -m examples.trainers.lightning_job --out results/lightning-torchrun
"""

from __future__ import annotations

import argparse
import os

import torch

TARGET_LOSS = 1.5  # the validation loss TTA is measured to


def classifier_and_data(config: dict):
    """The LightningModule and its train and validation loaders."""
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=config.get("lr", 1e-3))

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(config.get("num_train", 2048), 64, generator=generator)
    y = x[:, :10].argmax(dim=1)  # a learnable rule
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=config["batch_size"], shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(256)), batch_size=config["batch_size"])
    return Classifier(), train, val


TRAINER_SETTINGS = dict(enable_progress_bar=False, enable_checkpointing=False, logger=False)


def train_func(config: dict):
    """The job under Ray Train (`main`, and `scaling run` with train.function naming it)."""
    import lightning as L
    import ray.train.lightning

    from scaling.integrations.lightning import ScalingCallback  # scaling

    model, train, val = classifier_and_data(config)
    callbacks = []
    callbacks.append(ScalingCallback(config.get("run_dir"), target_loss=config.get("target_loss")))  # scaling
    trainer = L.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        devices="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=callbacks,
        accumulate_grad_batches=config.get("accumulate", 1),
        **TRAINER_SETTINGS,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    trainer.fit(model, train, val)


def torchrun_main(args) -> None:
    """The same job, each process started by torchrun (Lightning reads torchrun's environment)."""
    import lightning as L

    from scaling.integrations.lightning import ScalingCallback  # scaling

    model, train, val = classifier_and_data({"batch_size": 32, "num_train": args.num_train})
    callbacks = []
    callbacks.append(ScalingCallback(args.out, target_loss=TARGET_LOSS))  # scaling
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        callbacks=callbacks,
        **TRAINER_SETTINGS,
    )
    trainer.fit(model, train, val)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (not under torchrun)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-train", type=int, default=2048, help="training samples")
    parser.add_argument("--out", help="the run directory the instrument writes (under torchrun: optional)")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:  # started by torchrun
        torchrun_main(args)
        return
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if args.out is None:
        parser.error("--out is required under Ray Train")
    run_dir = os.path.abspath(args.out)
    TorchTrainer(
        train_func,
        train_loop_config={"batch_size": 32, "epochs": args.epochs, "run_dir": run_dir, "target_loss": TARGET_LOSS},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(run_dir, "ray_train")),
    ).fit()
    print(f"records and summary in {run_dir}")


if __name__ == "__main__":
    main()
