"""A user's own FSDP2 Ray Train job: a Hugging Face GPT-2, each block sharded with `fully_shard`.

Its own model (transformers' `GPT2LMHeadModel` at toy size, called with keywords), its own
generated token sequences (a fixed random Markov chain: learnable, nothing downloaded), FSDP2 as
its documentation writes it (each block, then the root), AdamW. The lines marked `# scaling` are
all that measuring it takes (docs/own-job.md). The job shards at every world size, one worker
too: its 1-worker run holds FSDP2's own work per step (the copies into and out of its buffers,
the DTensor optimizer step), which `scaling project RUN_DIR` projects from.

    python -m examples.own_job.gpt2_fsdp --workers 2 --out results/own-gpt2/w2

or through the lab, over worker counts:

    scaling sweep examples/own_job/gpt2_fsdp.yaml --workers 1,2 --out results/own-gpt2
"""

import argparse
import math

import ray.train
import torch
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

from scaling import instrument  # scaling


def markov_tokens(count: int, seq_len: int, vocab: int, seed: int) -> TensorDataset:
    """`count` sequences of a fixed random Markov chain over `vocab` tokens (each token has 4 likely successors)."""
    generator = torch.Generator().manual_seed(1234)  # the chain: the same for every split
    successors = torch.randint(0, vocab, (vocab, 4), generator=generator)
    generator.manual_seed(seed)
    tokens = torch.empty(count, seq_len, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (count,), generator=generator)
    for t in range(1, seq_len):
        choice = torch.randint(0, 4, (count,), generator=generator)
        tokens[:, t] = successors[tokens[:, t - 1], choice]
    return TensorDataset(tokens)


def validation_loss(model, dataset) -> float:
    model.eval()
    with torch.no_grad():
        (tokens,) = dataset.tensors
        loss = model(input_ids=tokens, labels=tokens).loss.item()
    model.train()
    return loss


def train_func(config: dict):
    torch.manual_seed(config.get("seed", 0))
    vocab, seq_len = config.get("vocab", 256), config.get("seq_len", 64)
    train_set = markov_tokens(config.get("num_train", 2048), seq_len, vocab, seed=config.get("seed", 0))
    val_set = markov_tokens(256, seq_len, vocab, seed=10_000)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_positions=seq_len,
            n_embd=config.get("width", 64),
            n_layer=config.get("layers", 2),
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    context = ray.train.get_context()
    sampler = DistributedSampler(train_set, context.get_world_size(), context.get_world_rank(), shuffle=True)
    loader = DataLoader(train_set, batch_size=config["batch_size"], sampler=sampler, drop_last=True)

    def forward_backward(batch):  # scaling: one forward + backward, for the A/B overhead
        (tokens,) = batch  # scaling
        model(input_ids=tokens, labels=tokens).loss.backward()  # scaling

    with instrument.attach(
        model,
        optimizer,
        run_dir=config.get("run_dir"),  # scaling
        forward_backward=forward_backward,
        calibration_data=loader,
    ) as meter:  # scaling
        for epoch in range(config["epochs"]):
            sampler.set_epoch(epoch)
            for (tokens,) in meter.batches(loader):  # scaling: was `in loader`
                loss = model(input_ids=tokens, labels=tokens).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            val_loss = validation_loss(model, val_set)
            meter.end_epoch(val_loss=val_loss, val_perplexity=math.exp(val_loss))  # scaling
            ray.train.report({"loss": loss.item(), "epoch": epoch, "val_loss": val_loss})


def main() -> None:
    import os

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", required=True, help="the run directory the instrument writes")
    args = parser.parse_args()
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
