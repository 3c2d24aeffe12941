"""FSDP2's overheads, two ratios measured in one run on gpt2-tiny with FSDP2 (`fully_shard` each
block, then the root), gloo, 2 ranks of one CPU thread each, fp32, the generated token data of
experiments/gpt2-tiny-fsdp.yaml (batch 32 sequences of 64 tokens per rank, SGD with Nesterov
momentum at the config's learning rate): the instrument on a user's FSDP job (budget: attached /
bare <= 1.03), and the lab's own FSDP loop against a bare FSDP2 loop (budget: lab / bare <= 1.02).

Three arms, each a fresh pair of processes:
  "bare"      a hand-written FSDP2 loop (`_spawned_worker` below, started with torch.multiprocessing):
              seed, the token data (scaling/data/tokens.py `make_token_rule`), the model from the
              registry, `fully_shard` per block then the root, the optimizer over the sharded
              parameters; per step forward, cross-entropy per token, backward, `optimizer.step()`,
              `zero_grad()`. The batches are indexed from each epoch's shard (scaling/data
              `train_shard`), as the lab's in-memory dataset indexes them. `torch.set_num_threads(1)`
              and one inter-op thread, as the lab sets each worker (scaling/train/loop.py
              `set_cpu_threads`, `workers.cpus_per_worker: 1`).
  "attached"  the same loop as a user's job with the instrument: `scaling.instrument.attach(model,
              optimizer, run_dir=...)` with its defaults (per-step timing, FSDP2's collectives timed),
              the loop over `meter.batches(...)` and `meter.end_epoch()` after each epoch, as
              tests/fsdp_jobs.py attaches it. No `forward_backward`: no A/B calibration (it runs in
              `end_epoch`, outside the step clock, in the lab's arm too it is off).
  "lab"       the lab's loop with `backend: fsdp` (scaling/train/loop.py, scaling/train/backends/fsdp.py),
              i.e. `scaling run experiments/gpt2-tiny-fsdp.yaml --launcher local --workers 2` run
              in-process with `scaling.launch.run.execute_run(cfg, dir, launcher="local")`: its
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

Order: rounds of the three arms, lab bare attached, then attached bare lab, and so on, so each
ratio's runs alternate A B B A around the shared bare run; each ratio is the median over its
adjacent (A, bare) pairs (`adjacent_pairs`), decided by the 95% order-statistic interval of that
median (`median_order_interval`, `interval_verdict`: "pass" when its upper end is within the
budget, "miss" when its lower end is beyond it, else undecided; an interval exists from 6 pairs).
The benchmark runs `--pairs` rounds, then adds one round at a time while any of the four verdicts
is undecided, up to `--max-pairs` and `--max-minutes`.

    .venv/bin/python bench/fsdp_overhead.py            # 8 rounds x 4 epochs (about 18 min), more while undecided, at most 30 min
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


def _spawned_worker(rank: int, world_size: int, port: int, spec: dict, out_path: str, attach_dir: str | None) -> None:
    """One rank of the bare FSDP2 loop, or (`attach_dir`) of the same loop as a user's job with the instrument."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    from scaling.data import train_shard
    from scaling.data.tokens import make_token_rule
    from scaling.models import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(spec["threads"])
    torch.set_num_interop_threads(1)
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
    if rank == 0:
        Path(out_path).write_text(json.dumps({"epochs": epochs}))
    dist.destroy_process_group()


def measure_spawned(arm: str, i: int, spec: dict, tmp: str) -> dict:
    """One run of the bare or attached loop in 2 fresh processes: steady-state step time and workers' CPU per step."""
    import torch.multiprocessing as mp

    from scaling.testbed.local_cluster import free_port

    out_path = Path(tmp) / f"run{i:02d}-{arm}.json"
    attach_dir = str(Path(tmp) / f"run{i:02d}-{arm}") if arm == "attached" else None
    with bl.RunQueue() as rq, bl.TreeCpu([os.getpid()]) as cpu:
        mp.spawn(_spawned_worker, args=(WORKERS, free_port(), spec, str(out_path), attach_dir),
                 nprocs=WORKERS, join=True)
    epochs = json.loads(out_path.read_text())["epochs"]
    out_path.unlink()
    if attach_dir:
        shutil.rmtree(attach_dir, ignore_errors=True)
    steady = [e for e in epochs if e["epoch"] > 1]
    if not steady:
        raise RuntimeError(f"{arm} run trained no epoch after the first; run 2 epochs or more")
    steps = sum(e["steps"] for e in steady)
    worker_cpu = sum(cpu.cpu_s("train_workers", e["start_unix"], e["end_unix"]) for e in steady)
    return {"order": i, "arm": arm, "steady_step_s": bl.median(e["step_s"] for e in steady),
            "mean_runnable": rq.mean, "worker_cpu_s_per_step": worker_cpu / steps,
            "cores": cpu.cores(steady[0]["start_unix"], steady[-1]["end_unix"]), "epochs": epochs}


def measure_lab(i: int, cfg, tmp: str) -> dict:
    """One run of the lab's loop (`scaling run ... --launcher local`, in-process), measured as
    bench/instrumentation_overhead.py measures it."""
    from scaling.analysis.run_metrics import steady_step_s
    from scaling.launch.run import execute_run
    from scaling.results import RunDir

    run_dir = Path(tmp) / f"run{i:02d}-lab"
    with bl.RunQueue() as rq, bl.TreeCpu([os.getpid()]) as cpu:
        summary = execute_run(cfg, run_dir, launcher="local")
    if summary["status"] == "failed":
        raise RuntimeError(f"lab run failed: {summary['error']}")
    epochs_table = RunDir(run_dir).epochs()
    step_s, epoch_rows = steady_step_s(epochs_table, cfg.global_batch)
    steady = bl.steady_cpu(cpu, epochs_table, cfg.global_batch)
    shutil.rmtree(run_dir, ignore_errors=True)  # a long sequence of runs would otherwise fill the temporary directory
    return {"order": i, "arm": "lab", "steady_step_s": step_s, "mean_runnable": rq.mean, **steady, "epochs": epoch_rows}


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
                        help="rounds at most, added one at a time while a verdict is undecided (default 24)")
    parser.add_argument("--max-minutes", type=float, default=30.0,
                        help="no round beyond --pairs starts once the next would end after this (default 30)")
    parser.add_argument("--epochs", type=int, help="epochs per run, the first is left out (default 4; quick 2)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the committed result's rounds (same config, epochs and order) with more rounds")
    args = parser.parse_args()
    min_rounds = args.pairs or (1 if args.quick else 8)
    max_rounds = max(min_rounds, args.max_pairs or (min_rounds if args.quick else 24))
    epochs = args.epochs or (2 if args.quick else 4)
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
    if args.resume:  # earlier rounds are ABBA pairs like any other: the verdict takes them all
        earlier = json.loads((bl.REPO / "bench" / "results" / f"{NAME}.json").read_text())
        if earlier["overrides"] != overrides or earlier.get("quick"):
            parser.error(f"--resume: bench/results/{NAME}.json was run with other settings; run without --resume")
        runs = earlier["runs"][:len(ROUND) * earlier["rounds"]]
        started -= earlier["wall_s"]
    first_round = len(runs) // len(ROUND)
    sitting_started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:
        for round_index in range(first_round, max_rounds):
            elapsed = time.time() - sitting_started
            if round_index >= min_rounds:
                if bl.UNDECIDED not in [c["verdict"] for c in figures(runs, round_index, epochs)]:
                    break
                per_round = elapsed / (round_index - first_round) if round_index > first_round else 0.0
                if round_index > first_round and elapsed + per_round > 60 * args.max_minutes:
                    print(f"[{NAME}] undecided after {round_index} rounds, and another would end after "
                          f"{args.max_minutes:g} min: stopping", flush=True)
                    break
            for arm in ROUND if round_index % 2 == 0 else ROUND[::-1]:
                print(f"[{NAME}] round {round_index + 1} (of {min_rounds} to {max_rounds}): {arm}", flush=True)
                i = len(runs)
                run = measure_lab(i, cfg, tmp) if arm == "lab" else measure_spawned(arm, i, spec, tmp)
                runs.append(run)
                cpu = run["worker_cpu_s_per_step"]
                print(f"[{NAME}]   steady-state step {run['steady_step_s'] * 1e3:.2f} ms, worker CPU "
                      f"{cpu * 1e3 if cpu else float('nan'):.1f} ms/step (runnable tasks {run['mean_runnable']}; "
                      f"cores {run['cores']})", flush=True)
    rounds = len(runs) // len(ROUND)
    comparisons = figures(runs, rounds, epochs)
    cli = f".venv/bin/scaling run {CONFIG} --launcher local --workers {WORKERS} " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides)
    path = bl.write_result(
        NAME, __doc__, args.quick, started, load_start, comparisons,
        config=CONFIG, workers=WORKERS, rounds=rounds, min_rounds=min_rounds, max_rounds=max_rounds,
        epochs_per_run=epochs, overrides=overrides, loop=spec,
        arms={"lab": f"{cli} --out DIR", "bare": "bench/fsdp_overhead.py _spawned_worker without the instrument",
              "attached": "bench/fsdp_overhead.py _spawned_worker with "
                          "scaling.instrument.attach(model, optimizer, run_dir=...)"},
        pair_ratios={arm: pair_ratios(runs, arm, "steady_step_s") for arm in ("attached", "lab")},
        cpu_pair_ratios={arm: pair_ratios(runs, arm, "worker_cpu_s_per_step") for arm in ("attached", "lab")},
        runs=runs,
    )
    bl.print_comparisons(comparisons)
    print(f"[{NAME}] wrote {path.relative_to(bl.REPO)}", flush=True)


if __name__ == "__main__":  # torch.multiprocessing and the plain launcher spawn processes that re-import this module
    main()
