"""Accelerate used directly (`accelerator.accumulate`): `attach` on what `accelerator.prepare` returned.

No callback is needed: the loop is the job's own, so the instrument's usual lines apply to the
DDP model and the optimizer Accelerate prepared (the torch optimizer inside its wrapper), and
`accelerator.accumulate` (which skips DDP's sync on all micro-batches but the last) makes a step
of `gradient_accumulation_steps` micro-batches, as `no_sync` does in a hand-written loop. Runs on
CPU, 2 gloo processes, under torchrun (Accelerate reads its environment); `accelerate launch --cpu`
starts one process whatever `--num_processes` says (its simple launcher):

    .venv/bin/torchrun --nproc_per_node 2 -m examples.trainers.accelerate_job --out results/accel
"""

from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator

from scaling import instrument


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the run directory the instrument writes")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    train(os.path.abspath(args.out), args.epochs)


def train(run_dir: str, epochs: int) -> None:
    """The job: Accelerate's loop, measured by attach (tests/test_trainers.py runs it on its gloo group)."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    x = torch.randn(1024, 64)
    y = x[:, :10].argmax(dim=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with instrument.attach(model, optimizer.optimizer, run_dir=run_dir) as meter:  # scaling
        for _ in range(epochs):
            for inputs, labels in meter.batches(loader):  # scaling: was `in loader`
                with accelerator.accumulate(model):
                    accelerator.backward(torch.nn.functional.cross_entropy(model(inputs), labels))
                    optimizer.step()
                    optimizer.zero_grad()
            meter.end_epoch()  # scaling
    accelerator.end_training()


if __name__ == "__main__":
    main()
