"""A Hugging Face Trainer job under Ray Train, as Ray's guide writes it, measured by one callback.

A tiny GPT-2 (transformers) on generated token sequences that count up from a random start (a rule
to learn: uniform random ids would hold the loss at ln 512 = 6.24), `transformers.Trainer` inside a Ray Train
`train_func` with `ray.train.huggingface.transformers.prepare_trainer`. The one line that
instruments it is marked `# scaling`. Runs on CPU, under Ray Train or under torchrun:

    .venv/bin/python -m examples.trainers.hf_trainer --workers 2 --out results/hf-alone
    .venv/bin/torchrun --nproc_per_node 2 -m examples.trainers.hf_trainer --out results/hf-torchrun
    .venv/bin/scaling sweep examples/trainers/hf_sweep.yaml --workers 1,2 --out results/hf-trainer
"""

from __future__ import annotations

import argparse
import os

import torch

SEQ = 64
TARGET_LOSS = 5.5  # the eval loss TTA is measured to


class TokenIds(torch.utils.data.Dataset):
    """Generated token ids, a causal language model's inputs and labels: each sequence counts up (mod 512)."""

    def __init__(self, n: int, seed: int):
        starts = torch.randint(0, 512, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (starts + torch.arange(SEQ)) % 512

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_trainer(config: dict, callbacks: list):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4))
    args = TrainingArguments(
        output_dir=os.path.abspath(config.get("output_dir", "hf-output")),
        per_device_train_batch_size=config["batch_size"],
        gradient_accumulation_steps=config.get("accumulate", 2),
        num_train_epochs=config["epochs"],
        learning_rate=config.get("lr", 1e-3),
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="epoch",
        report_to=[],
        use_cpu=True,
        seed=config.get("seed", 0),
        disable_tqdm=True,
    )
    return Trainer(
        model=model,
        args=args,
        train_dataset=TokenIds(config.get("num_train", 512), 1),
        eval_dataset=TokenIds(64, 2),
        callbacks=callbacks,
    )


def train_func(config: dict):
    """The job under Ray Train (`main`, and `scaling run` through examples/trainers/hf_sweep.yaml)."""
    import ray.train.huggingface.transformers

    from scaling.integrations.hf import ScalingCallback  # scaling

    callbacks = []
    callbacks.append(ScalingCallback(config.get("run_dir"), target_loss=config.get("target_loss")))  # scaling
    trainer = make_trainer(config, callbacks)
    trainer.add_callback(ray.train.huggingface.transformers.RayTrainReportCallback())
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)
    trainer.train()


def torchrun_main(args) -> None:
    """The same job, each process started by torchrun (the Trainer joins torchrun's process group)."""
    from scaling.integrations.hf import ScalingCallback  # scaling

    callbacks = []
    callbacks.append(ScalingCallback(args.out, target_loss=TARGET_LOSS))  # scaling
    config = {"batch_size": 8, "epochs": args.epochs, "num_train": args.num_train, "output_dir": args.hf_output}
    make_trainer(config, callbacks).train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (not under torchrun)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-train", type=int, default=512, help="training sequences")
    parser.add_argument("--hf-output", default="hf-output", help="the Trainer's own output_dir")
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
        train_loop_config={"batch_size": 8, "epochs": args.epochs, "run_dir": run_dir, "target_loss": TARGET_LOSS},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(run_dir, "ray_train")),
    ).fit()
    print(f"records and summary in {run_dir}")


if __name__ == "__main__":
    main()
