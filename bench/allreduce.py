"""All-reduce microbenchmark: torch.distributed gloo all_reduce (sum, float32) between 2 ranks on
this host, one CPU thread each, message sizes 4 KiB to 256 MiB; median time, algorithm bandwidth and
bus bandwidth per size.

Definitions are nccl-tests' (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
  algbw = S / t            S: message size in bytes, t: time of one all-reduce
  busbw = algbw * 2(n-1)/n n: ranks; for all-reduce, the bandwidth a link must carry (each rank
                           sends and receives 2(n-1)/n * S in a ring), comparable across n.
Bandwidths are in GB/s = 1e9 bytes/s, as nccl-tests prints them; sizes are powers of 4 in KiB/MiB.

How: 2 processes (torch.multiprocessing spawn), each with torch.set_num_threads(1), a gloo process
group over 127.0.0.1 TCP. Per size: one all-reduce checked for the right sum, `--warmup` untimed
iterations, then timed iterations, each preceded by a barrier so that both ranks start together;
an iteration's time is the slower rank's (the collective is done when the last rank is done), and
the figure is the median over iterations. The sizes are visited in `--rounds` rounds, ascending and
descending alternately (the benchmark's A B B A), so that a drift of the machine touches every size;
the iterations per size and round aim at about `--target-s` seconds (3 to 50). nccl-tests instead
reports the mean over iterations of a rank-averaged time; the median is kept here because this
2-core machine is shared. NCCL and Horovod are not measured: the torch here is the CPU wheel (no
NCCL, no GPU) and Horovod was not installed when this was written; the JSON records which
backends were present (`backends_present`).

Writes bench/results/allreduce.json and bench/results/allreduce.png (log-log: time and bandwidth
against message size).

    .venv/bin/python bench/allreduce.py            # 4 KiB .. 256 MiB, 3 rounds (about 1 min here)
    .venv/bin/python bench/allreduce.py --quick    # 4 KiB .. 16 MiB, 2 rounds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import benchlib as bl

NAME = "allreduce"
KIB, MIB = 1024, 1024 * 1024
WORLD = 2


def sizes_bytes(max_bytes: int) -> list[int]:
    sizes, size = [], 4 * KIB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes:.0f} B"


def quantile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.quantile(values, q))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, sizes: list[int], rounds: int, warmup: int, target_s: float, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    try:
        for r in range(rounds):
            for size in (sizes if r % 2 == 0 else list(reversed(sizes))):
                tensor = torch.ones(size // 4, dtype=torch.float32)
                dist.all_reduce(tensor)
                if not bool((tensor == WORLD).all()):
                    raise RuntimeError(f"all_reduce of {size} bytes gave a wrong sum")
                warm = []
                for _ in range(warmup):
                    dist.barrier()
                    t0 = time.perf_counter()
                    dist.all_reduce(tensor)
                    warm.append(time.perf_counter() - t0)
                estimate = torch.tensor([min(warm) if warm else 1e-3], dtype=torch.float64)
                dist.all_reduce(estimate, op=dist.ReduceOp.MAX)  # both ranks agree on the iteration count
                iters = int(min(50, max(3, target_s / max(float(estimate), 1e-6))))
                elapsed = torch.zeros(iters, dtype=torch.float64)
                for i in range(iters):
                    tensor.fill_(1.0)  # keep values finite over the iterations
                    dist.barrier()
                    t0 = time.perf_counter()
                    dist.all_reduce(tensor)
                    elapsed[i] = time.perf_counter() - t0
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # an iteration ends when its slower rank ends
                times[size] += elapsed.tolist()
                del tensor
        if rank == 0:
            Path(out_path).write_text(json.dumps({str(k): v for k, v in times.items()}))
    finally:
        dist.destroy_process_group()


def measure(sizes: list[int], rounds: int, warmup: int, target_s: float) -> dict[int, list[float]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bench-ar-") as tmp:
        out = Path(tmp) / "times.json"
        mp.start_processes(_rank, args=(free_port(), sizes, rounds, warmup, target_s, str(out)), nprocs=WORLD,
                           join=True, start_method="spawn")
        return {int(k): v for k, v in json.loads(out.read_text()).items()}


def backends_present() -> dict:
    import torch
    import torch.distributed as dist

    present = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "horovod": importlib.util.find_spec("horovod") is not None,
    }
    why = [f"torch {torch.__version__} has no NCCL" if not present["nccl"] else "",
           "no GPU" if not present["cuda_devices"] else "",
           "Horovod is not installed" if not present["horovod"] else "Horovod is installed but not measured here"]
    present["note"] = "only torch.distributed gloo is measured: " + ", ".join(w for w in why if w)
    return present


def figure(rows: list[dict]):
    """Two log-log panels against message size: median time (interquartile band), algbw and busbw."""
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from scaling.plots.figures import GRID, STYLE

    sizes = [r["bytes"] for r in rows]
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(8.0, 3.6), layout="constrained")
        ax_time, ax_bw = fig.subplots(1, 2)
        ax_time.fill_between(sizes, [r["p25_s"] * 1e3 for r in rows], [r["p75_s"] * 1e3 for r in rows],
                             color="#0072B2", alpha=0.2, linewidth=0, label="25th–75th percentile")
        ax_time.plot(sizes, [r["median_s"] * 1e3 for r in rows], color="#0072B2", marker="o", label="median")
        ax_time.set_ylabel("time per all-reduce (ms)")
        ax_time.set_title("Time")
        ax_bw.plot(sizes, [r["busbw_GBps"] for r in rows], color="#D55E00", marker="s", markersize=5,
                   label="busbw = algbw × 2(n−1)/n")
        ax_bw.plot(sizes, [r["algbw_GBps"] for r in rows], color="#009E73", marker="o", markersize=9,
                   markerfacecolor="none", markeredgewidth=1.3, linestyle="--", linewidth=1.2,
                   label="algbw = size / time" + (" (= busbw at n = 2)" if WORLD == 2 else ""))
        ax_bw.set_ylabel("bandwidth (GB/s, 10⁹ B/s)")
        ax_bw.set_title("Bandwidth")
        for ax in (ax_time, ax_bw):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(FixedLocator(sizes))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(x)))
            ax.tick_params(axis="x", labelrotation=45)
            ax.set_xlabel("message size (bytes, float32)")
            ax.grid(True, which="major", **GRID)
        ax_time.legend(loc="upper left")
        ax_bw.legend(loc="lower right")
        fig.suptitle(f"gloo all-reduce, {WORLD} ranks on one host, 1 CPU thread each")
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 KiB .. 16 MiB, 2 rounds")
    parser.add_argument("--max-mib", type=int, help="largest message in MiB (default 256; quick 16)")
    parser.add_argument("--rounds", type=int, help="rounds over the sizes, ascending/descending (default 3; quick 2)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations per size and round")
    parser.add_argument("--target-s", type=float, help="timed seconds per size and round (default 1.0; quick 0.3)")
    args = parser.parse_args()
    max_bytes = (args.max_mib or (16 if args.quick else 256)) * MIB
    rounds = args.rounds or (2 if args.quick else 3)
    target_s = args.target_s or (0.3 if args.quick else 1.0)
    started, load_start = time.time(), bl.load_average()

    sizes = sizes_bytes(max_bytes)
    print(f"[{NAME}] gloo, {WORLD} ranks, {len(sizes)} sizes {size_label(sizes[0])}..{size_label(sizes[-1])}, "
          f"{rounds} rounds", flush=True)
    times = measure(sizes, rounds, args.warmup, target_s)
    factor = 2 * (WORLD - 1) / WORLD
    rows = []
    for size in sizes:
        t = bl.median(times[size])
        algbw = size / t / 1e9
        rows.append({"bytes": size, "size": size_label(size), "iterations": len(times[size]), "median_s": t,
                     "min_s": min(times[size]), "p25_s": quantile(times[size], 0.25),
                     "p75_s": quantile(times[size], 0.75), "max_s": max(times[size]), "algbw_GBps": algbw,
                     "busbw_GBps": algbw * factor})
        print(f"[{NAME}] {size_label(size):>8}  {t * 1e3:9.3f} ms  algbw {algbw:7.3f} GB/s  busbw {algbw * factor:7.3f} GB/s"
              f"  ({len(times[size])} it.)", flush=True)

    from scaling.plots.figures import save

    out_dir = bl.results_dir(args.quick)
    figure_paths = save(figure(rows), out_dir / NAME)
    small, large = rows[0], rows[-1]
    peak = max(rows, key=lambda r: r["busbw_GBps"])
    comparisons = [
        bl.comparison(f"gloo all-reduce latency, {small['size']}", f"{WORLD} ranks, 1 thread each", "",
                      small["median_s"] * 1e3, None, "ms", None, "", note="median time of one all-reduce"),
        bl.comparison(f"gloo all-reduce busbw, {large['size']}", f"{WORLD} ranks, 1 thread each", "",
                      large["busbw_GBps"], None, "GB/s", None, "",
                      note=f"busbw = size / time × 2(n−1)/n (nccl-tests); peak {peak['busbw_GBps']:.3f} GB/s at {peak['size']}"),
    ]
    path = bl.write_result(
        NAME, __doc__, args.quick, started, load_start, comparisons,
        world_size=WORLD, threads_per_rank=1, backend="gloo", dtype="float32", op="sum", rounds=rounds,
        warmup_iterations=args.warmup, target_s_per_size_and_round=target_s,
        definitions={"time": "median over iterations of the slower rank's time of one all_reduce (barrier before each)",
                     "algbw": "bytes / time, GB/s = 1e9 B/s", "busbw": "algbw * 2(n-1)/n",
                     "source": "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md"},
        backends_present=backends_present(), sizes=rows,
        figure=[str(p.relative_to(bl.REPO)) for p in figure_paths],
        iteration_times_s={str(k): v for k, v in times.items()},
    )
    bl.print_comparisons(comparisons)
    print(f"[{NAME}] wrote {path.relative_to(bl.REPO)} and {', '.join(p.name for p in figure_paths)}", flush=True)


if __name__ == "__main__":
    main()
