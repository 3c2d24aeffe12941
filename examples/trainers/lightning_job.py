"""A Lightning job under Ray Train, as Ray's guide writes it, measured by one callback.

A small classifier (a LightningModule) on generated data, `lightning.Trainer` inside a Ray Train
`train_func` with `ray.train.lightning`'s RayDDPStrategy, RayLightningEnvironment and
prepare_trainer. The one line that instruments it is marked `# scaling`. Runs on CPU:

    .venv/bin/python -m examples.trainers.lightning_job --workers 2 --out results/lightning-alone
"""

from __future__ import annotations

import argparse
import os

import torch


def train_func(config: dict):
    import lightning as L
    import ray.train.lightning

    from scaling.integrations.lightning import ScalingCallback  # scaling

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
    trainer = L.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        devices="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[
            ScalingCallback(
                config.get("run_dir"),  # scaling: None under `scaling run`
                target_loss=config.get("target_loss"),
            )
        ],
        accumulate_grad_batches=config.get("accumulate", 1),
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    trainer.fit(Classifier(), train, val)


def main() -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", required=True, help="the run directory the instrument writes")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.out)
    TorchTrainer(
        train_func,
        train_loop_config={"batch_size": 32, "epochs": args.epochs, "run_dir": run_dir, "target_loss": 1.5},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(run_dir, "ray_train")),
    ).fit()
    print(f"records and summary in {run_dir}")


if __name__ == "__main__":
    main()
