"""Jobs trained by the Hugging Face Trainer and by Lightning, with and without scaling's callbacks.

Run by tests/test_trainers.py in two spawned gloo processes (`world_job`): every case of CASES in
turn, each a tiny GPT-2 (transformers) or a tiny MLP classifier (Lightning) with dropout, 2
micro-batches per optimizer step and 6 optimizer steps; the GPT-2 with `bf16=True` (Accelerate's autocast,
entered inside the model's forward). Each case writes, per rank, what the test
compares: a hash of the trained parameters (bit-identical training with and without a callback)
and the run directory's records.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

DELAY_S = 0.1  # the ground truth injected into each synchronised all-reduce
ACCUMULATE = 2
OPTIMIZER_STEPS = 11  # 10 steady, all timed: DDP's own timers compared on about 9 (4 left a loaded run undecided)
BATCH = 4  # per rank and micro-batch
SEQ = 16
SAMPLES = 2 * BATCH * ACCUMULATE * OPTIMIZER_STEPS  # the whole training set, 2 ranks
SETTINGS = {"warmup_steps": 1, "calibration_pairs": 4, "telemetry_interval_s": 0, "trace_steps": 0}


def _parameters_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for parameter in model.parameters():
        whole = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter  # FSDP2's shards
        digest.update(whole.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


# --- Hugging Face Trainer -----------------------------------------------------------------------


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int):
        self.ids = torch.randint(0, 64, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_job(run_dir: str | None, **callback_settings) -> dict:
    """A tiny GPT-2 through transformers.Trainer; the callback only when `run_dir` is given."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

    from scaling.integrations.hf import ScalingCallback

    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(run_dir or "/tmp/x"), "hf-out"),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        num_train_epochs=1,
        learning_rate=1e-3,
        eval_strategy="epoch",
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    callbacks = [] if run_dir is None else [ScalingCallback(run_dir, target_loss=10.0, **SETTINGS, **callback_settings)]
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenDataset(SAMPLES, 1),
        eval_dataset=TokenDataset(2 * BATCH, 2),
        callbacks=callbacks,
    )
    trainer.train()
    return {"parameters": _parameters_hash(model), "eval_loss": trainer.evaluate()["eval_loss"]}


# --- Lightning -----------------------------------------------------------------------------------


def lightning_job(run_dir: str | None, strategy: str = "ddp", **callback_settings) -> dict:
    """A tiny classifier through lightning.Trainer on the spawned group: DDPStrategy, or `strategy="fsdp2"`
    ModelParallelStrategy with `fully_shard` on each linear layer and the network in `configure_model`;
    the callback when `run_dir`."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    from scaling.integrations.lightning import ScalingCallback

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 4)
            )

        def configure_model(self):
            if strategy == "fsdp2":
                mesh = self.device_mesh["data_parallel"]
                for layer in (self.net[0], self.net[3]):
                    fully_shard(layer, mesh=mesh)
                fully_shard(self.net, mesh=mesh)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    L.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(SAMPLES, 32, generator=generator), torch.randint(0, 4, (SAMPLES,), generator=generator)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:8], y[:8]), batch_size=BATCH)
    model = Classifier()
    callbacks = [] if run_dir is None else [ScalingCallback(run_dir, target_loss=10.0, **SETTINGS, **callback_settings)]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        num_nodes=1,
        strategy=DDPStrategy()
        if strategy == "ddp"
        else ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_epochs=1,
        accumulate_grad_batches=ACCUMULATE,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, train, val)
    return {"parameters": _parameters_hash(model)}


CASES = {
    "hf_plain": lambda tmp: hf_job(None),
    "hf": lambda tmp: hf_job(os.path.join(tmp, "hf")),
    "hf_delay": lambda tmp: hf_job(os.path.join(tmp, "hf_delay"), inject_comm_delay_s=DELAY_S),
    "pl_plain": lambda tmp: lightning_job(None),
    "pl": lambda tmp: lightning_job(os.path.join(tmp, "pl")),
    "pl_delay": lambda tmp: lightning_job(os.path.join(tmp, "pl_delay"), inject_comm_delay_s=DELAY_S),
    "pl_fsdp2_plain": lambda tmp: lightning_job(None, "fsdp2"),
    "pl_fsdp2": lambda tmp: lightning_job(os.path.join(tmp, "pl_fsdp2"), "fsdp2"),
    "pl_fsdp2_delay": lambda tmp: lightning_job(
        os.path.join(tmp, "pl_fsdp2_delay"), "fsdp2", inject_comm_delay_s=DELAY_S
    ),
    # last: Accelerate's end_training may release the process group
    "accelerate": lambda tmp: accelerate_job(os.path.join(tmp, "accelerate")),
}


def accelerate_job(run_dir: str) -> dict:
    """examples/trainers/accelerate_job.py's job (Accelerate's own loop, `accelerator.accumulate`, attach), 1 epoch."""
    from examples.trainers.accelerate_job import train

    train(run_dir, epochs=1)
    return {}


def world_job(rank: int, port: int, tmp: str, cases: list[str]) -> None:
    """One spawned rank of 2: the named cases in turn (start-up paid once); results as JSON files."""
    from scaling.launch.local import exit_without_finalization, release_process_group

    # what torchrun sets: the Trainer (Accelerate) and Lightning both join the group already made
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        NODE_RANK="0",
    )
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for name in cases:
        began = time.perf_counter()
        result = CASES[name](tmp)
        result["wall_s"] = time.perf_counter() - began
        if rank == 0:
            print(f"{name}: {result['wall_s']:.1f} s", flush=True)
        with open(os.path.join(tmp, f"result-{name}.rank{rank}.json"), "w") as f:
            json.dump(result, f)
    release_process_group()
    exit_without_finalization()
