"""FSDP2's overheads, two ratios measured in one run on gpt2-tiny with FSDP2 (`fully_shard` each
block, then the root), gloo, 2 ranks of one CPU thread each, fp32, the generated token data of
experiments/gpt2-tiny-fsdp.yaml (batch 32 sequences of 64 tokens per rank, SGD with Nesterov
momentum at the config's learning rate): the instrument on a user's FSDP job (budget: attached /
bare <= 1.03), and the lab's own FSDP loop against a bare FSDP2 loop (budget: lab / bare <= 1.02).

Three arms, run one after the other in the same two worker processes (`_rounds_worker`):
  "bare"      a hand-written FSDP2 loop (`_fsdp_loop` below):
              seed, the token data (scaling/data/tokens.py `make_token_rule`), the model from the
              registry, `fully_shard` per block then the root, the optimizer over the sharded
              parameters; per step forward, cross-entropy per token, backward, `optimizer.step()`,
              `zero_grad()`. The batches are indexed from each epoch's shard (scaling/data
              `train_shard`), as the lab's in-memory dataset indexes them.
  "attached"  the same loop as a user's job with the instrument: `scaling.instrument.attach(model,
              optimizer, run_dir=...)` with its defaults (per-step timing, FSDP2's collectives timed),
              the loop over `meter.batches(...)` and `meter.end_epoch()` after each epoch, as
              tests/fsdp_jobs.py attaches it. No `forward_backward`: no A/B calibration (it runs in
              `end_epoch`, outside the step clock, in the lab's arm too it is off).
  "lab"       the lab's loop with `backend: fsdp` (scaling/train/loop.py `train_worker`,
              scaling/train/backends/fsdp.py), what each worker of `scaling run
              experiments/gpt2-tiny-fsdp.yaml --launcher local --workers 2` runs: its
              instrument with the lab's defaults (step timing on), its LR schedule, its loss
              bookkeeping and validation; `train.eval_every=1` and an unreachable `train.target_loss`
              (every epoch trains, no evaluation inside one), `instrument.calibration_pairs=0`.
"attached" / "bare" is the instrument's cost on a user's FSDP job; "lab" / "bare" is everything
the lab's loop adds to a bare FSDP2 step (its instrument, scheduler and bookkeeping together).

Measured: per run, the steady-state step time = median over the epochs after the first of the
epoch clock / steps. The epoch clock is the same in every arm: from the request for the epoch's
first batch to the end of its iteration, on rank 0 (the lab's `train_s` in epochs.parquet, as
bench/instrumentation_overhead.py reads it; `time.perf_counter()` around the loop in the other two).
Besides, the training workers' CPU seconds per steady-state step (bench/benchlib.py `TreeCpu`, from
/proc, over the same epochs), which other jobs on the machine hardly move, with the same budgets.

Every run builds its model, shards it and makes its optimizer afresh; the processes, their
process group and their CPU set-up (`set_up_worker`: one torch thread and one inter-op thread, as
the lab sets each worker for `workers.cpus_per_worker: 1`) are shared. Why: with fresh processes per run, one
run's step differs from the next by about 5% on 2 CPUs (where the two ranks land on the two
cores), and 40 such rounds left a 2% budget undecided; runs in the same processes differ by
what each arm does.

Order: rounds of the three arms, lab bare attached, then attached bare lab, and so on, so each
ratio's runs alternate A B B A around the shared bare run; each ratio is the median over its
adjacent (A, bare) pairs (`adjacent_pairs`), decided by the 95% order-statistic interval of that
median (`median_order_interval`, `interval_verdict`: "pass" when its upper end is within the
budget, "miss" when its lower end is beyond it, else undecided; an interval exists from 6 pairs).
The first pair of processes runs `--pairs` rounds; while any of the four verdicts is undecided,
another pair runs `--block` more, up to `--max-pairs` and `--max-minutes`.

    .venv/bin/python bench/fsdp_overhead.py            # 8 rounds x 3 epochs (about 11 min), more while undecided, at most 30 min
    .venv/bin/python bench/fsdp_overhead.py --quick    # 1 round x 2 short epochs (no interval: a check that it runs)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import benchlib as bl

NAME = "fsdp_overhead"
CONFIG = "experiments/gpt2-tiny-fsdp.yaml"
INSTRUMENT_BUDGET = 1.03
LOOP_BUDGET = 1.02
# rounds alternate this order and its reverse: "bare" is always next to both others
ROUND = ("lab", "bare", "attached")
WORKERS = 2


def timing_overrides(epochs: int, quick: bool) -> list[str]:
    """The config as a timing run: every epoch trains (a validation loss no model reaches), no evaluation
    inside an epoch, no calibration, a small validation set (neither is inside the epoch clock);
    the full run's epochs of 64 steps, the quick run's of 32."""
    return [
        f"train.max_epochs={epochs}",
        "train.target_loss=0.001",
        "train.eval_every=1",
        "instrument.calibration_pairs=0",
        "data.val_samples=64",
        f"data.train_samples={2048 if quick else 4096}",
    ]


def loop_spec(cfg) -> dict:
    """What the bare and attached loops need of the lab's config, so that all arms do the same work per step."""
    return {
        "model": cfg.model.name, "vocab": cfg.data.num_classes, "seq_len": cfg.data.seq_len,
        "data_seed": cfg.data.seed, "train_samples": cfg.data.train_samples, "val_samples": cfg.data.val_samples,
        "token_noise": cfg.data.token_noise, "seed": cfg.train.seed, "batch": cfg.train.per_worker_batch,
        "epochs": cfg.train.max_epochs, "threads": cfg.workers.cpus_per_worker,
        # the lab's optimizer (scaling/train/loop.py): SGD at the linearly scaled peak rate, Nesterov with momentum
        "lr": cfg.optim.lr * cfg.global_batch / cfg.optim.reference_batch, "momentum": cfg.optim.momentum,
        "weight_decay": cfg.optim.weight_decay,
    }


def _fsdp_loop(rank: int, world_size: int, spec: dict, attach_dir: str | None) -> list[dict]:
    """The bare FSDP2 loop, or (`attach_dir`) the same loop as a user's job with the instrument: its epochs."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    from scaling.data import train_shard
    from scaling.data.tokens import make_token_rule
    from scaling.models import build_model

    torch.manual_seed(spec["seed"])
    train_x, train_y, _, _ = make_token_rule(spec["data_seed"], spec["vocab"], spec["seq_len"], spec["train_samples"],
                                             spec["val_samples"], spec["token_noise"])
    model = build_model(spec["model"], spec["vocab"])
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=spec["momentum"],
                                nesterov=spec["momentum"] > 0, weight_decay=spec["weight_decay"])

    def epoch_batches(epoch: int):
        indices = torch.tensor(train_shard(len(train_y), rank, world_size, epoch, spec["seed"]))
        for start in range(0, len(indices) - spec["batch"] + 1, spec["batch"]):
            batch = indices[start:start + spec["batch"]]
            yield train_x[batch], train_y[batch]

    if attach_dir is None:
        meter_context = contextlib.nullcontext()
    else:
        from scaling import instrument

        meter_context = instrument.attach(model, optimizer, run_dir=attach_dir)
    epochs = []
    with meter_context as meter:
        for epoch in range(1, spec["epochs"] + 1):
            steps, start_unix, start = 0, time.time(), time.perf_counter()
            batches = epoch_batches(epoch)
            for inputs, targets in (meter.batches(batches) if meter else batches):
                logits = model(inputs)
                loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
            train_s = time.perf_counter() - start
            epochs.append({"epoch": epoch, "train_s": train_s, "steps": steps, "step_s": train_s / steps,
                           "start_unix": start_unix, "end_unix": start_unix + train_s})
            if meter:
                meter.end_epoch()
    return epochs


def round_order(round_index: int) -> tuple[str, ...]:
    """ROUND on even rounds, reversed on odd ones: each ratio's runs alternate A B B A around "bare"."""
    return ROUND if round_index % 2 == 0 else ROUND[::-1]


def run_path(tmp: str, round_index: int, arm: str) -> Path:
    """Where a run leaves what the driver reads: the lab's run directory, or the other arms' epochs (JSON)."""
    return Path(tmp) / f"round{round_index:03d}-{arm}{'' if arm == 'lab' else '.json'}"


def _rounds_worker(rank: int, world_size: int, port: int, config: dict, spec: dict, first_round: int, rounds: int,
                   tmp: str) -> None:
    """One rank of a block of rounds: every arm's runs, one after the other, in these same two processes."""
    import gc
    import sys

    import torch
    import torch.distributed as dist

    from scaling.config import from_dict
    from scaling.train.loop import WorkerContext, set_up_worker, train_worker
    from scaling.train.user_function import lab_context

    cfg = from_dict(config)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ctx = WorkerContext(rank=rank, world_size=world_size, local_rank=rank, node_rank=0, device=torch.device("cpu"))
    set_up_worker(cfg, ctx)  # once, for every arm: one torch thread and one inter-op thread, as the lab sets a worker
    # an epoch of the bare loop, not measured: what a process pays once (its first FSDP2 step, the
    # allocator's growth) would otherwise fall on the block's first run, always the lab's
    _fsdp_loop(rank, world_size, {**spec, "epochs": 1}, None)
    for round_index in range(first_round, first_round + rounds):
        for arm in round_order(round_index):
            path = run_path(tmp, round_index, arm)
            if arm == "lab":  # what the plain launcher's worker runs (scaling/launch/local.py, run_worker)
                with lab_context(cfg, path):
                    train_worker(cfg, ctx, path)
                continue
            epochs = _fsdp_loop(rank, world_size, spec, str(path.with_suffix("")) if arm == "attached" else None)
            if rank == 0:
                path.write_text(json.dumps({"epochs": epochs}))
            gc.collect()
    gc.collect()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as the plain launcher's workers leave (scaling/launch/local.py: gloo's threads at finalization)


def measure_rounds(first_round: int, rounds: int, cfg, spec: dict, tmp: str) -> list[dict]:
    """`rounds` rounds in one pair of processes: each run's steady-state step time and workers' CPU per step."""
    import torch.multiprocessing as mp

    from scaling.analysis.run_metrics import steady_step_s
    from scaling.results import RunDir
    from scaling.testbed.local_cluster import free_port

    # sampled every 50 ms: what follows a measured epoch differs by arm (the lab validates, the
    # instrument writes its records), and a coarser sampling smears its CPU into the window
    with bl.RunQueue() as rq, bl.TreeCpu([os.getpid()], interval_s=0.05, discover_every=40) as cpu:
        mp.spawn(_rounds_worker, args=(WORKERS, free_port(), cfg.to_dict(), spec, first_round, rounds, tmp),
                 nprocs=WORKERS, join=True)
    runs = []
    for round_index in range(first_round, first_round + rounds):
        for arm in round_order(round_index):
            path = run_path(tmp, round_index, arm)
            if arm == "lab":
                epochs_table = RunDir(path).epochs()
                step_s, epochs = steady_step_s(epochs_table, cfg.global_batch)
                steady = bl.steady_cpu(cpu, epochs_table, cfg.global_batch)
                shutil.rmtree(path, ignore_errors=True)
            else:
                epochs = json.loads(path.read_text())["epochs"]
                path.unlink()
                shutil.rmtree(path.with_suffix(""), ignore_errors=True)
                measured = [e for e in epochs if e["epoch"] > 1]
                if not measured:
                    raise RuntimeError(f"{arm} run trained no epoch after the first; run 2 epochs or more")
                step_s = bl.median(e["step_s"] for e in measured)
                worker_cpu = sum(cpu.cpu_s("train_workers", e["start_unix"], e["end_unix"]) for e in measured)
                steady = {"worker_cpu_s_per_step": worker_cpu / sum(e["steps"] for e in measured),
                          "cores": cpu.cores(measured[0]["start_unix"], measured[-1]["end_unix"])}
            run = {"order": 3 * round_index + len(runs) % 3, "round": round_index, "arm": arm, "steady_step_s": step_s,
                   "mean_runnable": rq.mean, **steady, "epochs": epochs}
            runs.append(run)
            cpu_s = run["worker_cpu_s_per_step"]
            print(f"[{NAME}] round {round_index + 1} {arm}: steady-state step {step_s * 1e3:.2f} ms, worker CPU "
                  f"{cpu_s * 1e3 if cpu_s else float('nan'):.1f} ms/step (cores {run['cores']})", flush=True)
    return runs


def pair_ratios(runs: list[dict], arm: str, key: str) -> list[float]:
    """`arm` / bare over the adjacent pairs of the runs of those two arms (A B B A ... by the round order)."""
    sequence = [(r["arm"], r[key]) for r in runs if r["arm"] in (arm, "bare")]
    return [a / b for a, b in bl.adjacent_pairs(sequence, arm, "bare") if a and b]


def figures(runs: list[dict], rounds: int, epochs: int) -> list[dict]:
    """Four comparison rows (each ratio's step time and workers' CPU per step), each decided by its interval."""
    rows = []
    cases = (("attached", "instrument on a user's FSDP job", "attached (scaling.instrument.attach, defaults)",
              INSTRUMENT_BUDGET, "the same hand-written FSDP2 loop with and without the instrument attached"),
             ("lab", "the lab's FSDP loop vs a bare FSDP2 loop", "lab (scaling run, backend: fsdp)",
              LOOP_BUDGET, "the lab's loop (its instrument with the lab's defaults, LR schedule, bookkeeping) "
                           "against a hand-written FSDP2 loop doing the same forward, backward and step"))
    for arm, title, label, budget, what in cases:
        for key, unit, figure, measured in (
                ("steady_step_s", "s/step", "step time", "steady-state step time"),
                ("worker_cpu_s_per_step", "CPU s/step", "workers' CPU per step",
                 "CPU seconds of the training workers per steady-state step")):
            ratios = pair_ratios(runs, arm, key)
            a_med = bl.median(r[key] for r in runs if r["arm"] == arm)
            b_med = bl.median(r[key] for r in runs if r["arm"] == "bare")
            note = (f"{what}; {CONFIG}, gpt2-tiny, {WORKERS} gloo ranks x 1 thread, fp32; {rounds} rounds x {epochs} "
                    f"epochs; ratio of arm medians {bl.ratio(a_med, b_med) or float('nan'):.3f}; pair ratios "
                    f"{', '.join(f'{r:.3f}' for r in ratios)}")
            if key == "steady_step_s":
                note += f"; {bl.contention_note(runs)}"
            else:
                elsewhere = [r["cores"]["rest_of_machine_cores"] for r in runs if r.get("cores")]
                note += (f"; /proc CPU time of the {WORKERS} worker processes over the epochs after the first"
                         + (f"; the rest of the machine (other jobs) used {min(elsewhere):.2f} to {max(elsewhere):.2f} "
                            f"cores meanwhile" if elsewhere else ""))
            rows.append(bl.comparison(
                f"{title} ({figure})", label, "bare FSDP2 loop", a_med, b_med, unit, bl.median(ratios),
                f"median over adjacent ABBA pairs of {arm} / bare {measured}",
                budget, f"{arm} / bare <= {budget:g} on CPU, by the 95% interval of the median ratio",
                pair_ratios=ratios, decided_by_interval=True, note=note))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 2 short epochs (a check that it runs)")
    parser.add_argument("--pairs", type=int, help="rounds (one pair for each ratio) always run (default 8; quick 1)")
    parser.add_argument("--max-pairs", type=int,
                        help="rounds at most, added --block at a time while a verdict is undecided (default 24)")
    parser.add_argument("--max-minutes", type=float, default=30.0,
                        help="no rounds beyond --pairs start once they would end after this (default 30)")
    parser.add_argument("--epochs", type=int, help="epochs per run, the first is left out (default 3; quick 2)")
    parser.add_argument("--block", type=int, default=4,
                        help="rounds in each pair of processes after the first, while undecided (default 4)")
    args = parser.parse_args()
    min_rounds = args.pairs or (1 if args.quick else 8)
    max_rounds = max(min_rounds, args.max_pairs or (min_rounds if args.quick else 24))
    epochs = args.epochs or (2 if args.quick else 3)
    if epochs < 2:
        parser.error("--epochs must be 2 or more: the first epoch is left out")

    from scaling.config import load_config

    started, load_start = time.time(), bl.load_average()
    overrides = timing_overrides(epochs, args.quick)
    cfg = load_config(bl.REPO / CONFIG, overrides=overrides, num_workers=WORKERS)
    if cfg.backend != "fsdp" or cfg.train.precision != "fp32" or cfg.fsdp.shard != "blocks":
        raise SystemExit(f"{CONFIG} is no longer the fp32 FSDP2 run per block this benchmark compares against")
    spec = loop_spec(cfg)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:
        done = 0
        while done < max_rounds:
            more = min(args.block if done else min_rounds, max_rounds - done)
            if done >= min_rounds:
                if bl.UNDECIDED not in [c["verdict"] for c in figures(runs, done, epochs)]:
                    break
                elapsed = time.time() - started
                if elapsed + elapsed / done * more > 60 * args.max_minutes:
                    print(f"[{NAME}] undecided after {done} rounds, and {more} more would end after "
                          f"{args.max_minutes:g} min: stopping", flush=True)
                    break
            print(f"[{NAME}] rounds {done + 1} to {done + more} (of {min_rounds} to {max_rounds}) in one pair of "
                  "processes", flush=True)
            runs += measure_rounds(done, more, cfg, spec, tmp)
            done += more
    rounds = len(runs) // len(ROUND)
    comparisons = figures(runs, rounds, epochs)
    cli = f".venv/bin/scaling run {CONFIG} --launcher local --workers {WORKERS} " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides)
    path = bl.write_result(
        NAME, __doc__, args.quick, started, load_start, comparisons,
        config=CONFIG, workers=WORKERS, rounds=rounds, min_rounds=min_rounds, max_rounds=max_rounds,
        epochs_per_run=epochs, overrides=overrides, loop=spec,
        arms={"lab": f"scaling/train/loop.py train_worker, as `{cli} --out DIR` runs it on each worker",
              "bare": "bench/fsdp_overhead.py _fsdp_loop without the instrument",
              "attached": "bench/fsdp_overhead.py _fsdp_loop with scaling.instrument.attach(model, optimizer, run_dir=...)"},
        pair_ratios={arm: pair_ratios(runs, arm, "steady_step_s") for arm in ("attached", "lab")},
        cpu_pair_ratios={arm: pair_ratios(runs, arm, "worker_cpu_s_per_step") for arm in ("attached", "lab")},
        runs=runs,
    )
    bl.print_comparisons(comparisons)
    print(f"[{NAME}] wrote {path.relative_to(bl.REPO)}", flush=True)


if __name__ == "__main__":  # torch.multiprocessing and the plain launcher spawn processes that re-import this module
    main()
