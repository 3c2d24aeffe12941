"""A Hugging Face Trainer job under Ray Train, as Ray's guide writes it, measured by one callback.

A tiny GPT-2 (transformers) on generated token sequences that count up from a random start (a rule
to learn: uniform random ids would hold the loss at ln 512 = 6.24), `transformers.Trainer` inside a Ray Train
`train_func` with `ray.train.huggingface.transformers.prepare_trainer`. The one line that
instruments it is marked `# scaling`. Runs on CPU:

    .venv/bin/python -m examples.trainers.hf_trainer --workers 2 --out results/hf-alone
    .venv/bin/scaling sweep examples/trainers/hf_sweep.yaml --workers 1,2 --out results/hf-trainer
"""

from __future__ import annotations

import argparse
import os

import torch

SEQ = 64


class TokenIds(torch.utils.data.Dataset):
    """Generated token ids, a causal language model's inputs and labels: each sequence counts up (mod 512)."""

    def __init__(self, n: int, seed: int):
        starts = torch.randint(0, 512, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (starts + torch.arange(SEQ)) % 512

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train_func(config: dict):
    import ray.train.huggingface.transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from scaling.integrations.hf import ScalingCallback  # scaling

    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4))
    args = TrainingArguments(
        output_dir=os.path.abspath("hf-output"),
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
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenIds(config.get("num_train", 512), 1),
        eval_dataset=TokenIds(64, 2),
        callbacks=[
            ScalingCallback(
                config.get("run_dir"),  # scaling: None under `scaling run`
                target_loss=config.get("target_loss"),
            )
        ],
    )
    trainer.add_callback(ray.train.huggingface.transformers.RayTrainReportCallback())
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)
    trainer.train()


def main() -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", required=True, help="the run directory the instrument writes")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.out)
    TorchTrainer(
        train_func,
        train_loop_config={"batch_size": 8, "epochs": args.epochs, "run_dir": run_dir, "target_loss": 5.5},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(run_dir, "ray_train")),
    ).fit()
    print(f"records and summary in {run_dir}")


if __name__ == "__main__":
    main()
