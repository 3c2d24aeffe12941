"""All-reduce microbenchmark: sum all-reduce of float32 tensors between 2 ranks on this host, one CPU
thread each, message sizes 4 KiB to 256 MiB, with torch.distributed gloo (A) and, where it imports,
Horovod on gloo (B); median time, algorithm bandwidth and bus bandwidth per size.

Definitions are nccl-tests' (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
  algbw = S / t            S: message size in bytes, t: time of one all-reduce
  busbw = algbw * 2(n-1)/n n: ranks; for all-reduce, the bandwidth a link must carry (each rank
                           sends and receives 2(n-1)/n * S in a ring), comparable across n.
                           At n = 2 the factor is 1: busbw = algbw.
Bandwidths are in GB/s = 1e9 bytes/s, as nccl-tests prints them; sizes are powers of 4 in KiB/MiB.

How: 2 processes (torch.multiprocessing spawn), each with torch.set_num_threads(1), a gloo process
group over 127.0.0.1 TCP. Horovod (B) is set up on the same processes the way the lab runs it
(`scaling.train.horovod_backend.setup_horovod_env_and_init`: rank 0's rendezvous server, gloo
controller and CPU operations, Horovod's default fusion threshold and 1 ms cycle time) and called
as `hvd.allreduce_(tensor, op=hvd.Sum)`, which returns when the reduction is done. A is
`dist.all_reduce(tensor)`. Per size and backend: one all-reduce checked for the right sum,
`--warmup` untimed iterations, then timed iterations, each preceded by a torch barrier so that
both ranks start together; an iteration's time is the slower rank's (the collective is done when
the last rank is done); the figure is the median over iterations. The sizes are visited in
`--rounds` rounds, ascending and descending alternately, and within a size the backends go A B in
even rounds and B A in odd ones (A B B A), so that a drift of the machine touches every size and
both backends; the iterations per size, backend and round aim at about `--target-s` seconds (3 to
50). nccl-tests instead reports the mean over iterations of a rank-averaged time; the median is
kept here because this 2-core machine is shared. NCCL is not measured: the torch here is the CPU
wheel (no NCCL, no GPU); the JSON records which backends were present (`backends_present`).

Writes bench/results/allreduce.json and bench/results/allreduce.png (+ .svg; log-log: time and
bandwidth against message size).

    .venv/bin/python bench/allreduce.py            # 4 KiB .. 256 MiB, 3 rounds (about 2 min here)
    .venv/bin/python bench/allreduce.py --quick    # 4 KiB .. 16 MiB, 2 rounds
"""

from __future__ import annotations

import importlib.util

import benchlib as bl
from benchjobs import measure, sizes_bytes


NAME = "allreduce"
KIB, MIB = 1024, 1024 * 1024
WORLD = 2
LABEL = {"torch_gloo": "torch.distributed gloo", "horovod_gloo": "Horovod (gloo)"}
COLOUR = {"torch_gloo": "#0072B2", "horovod_gloo": "#D55E00"}
MARKER = {"torch_gloo": "o", "horovod_gloo": "s"}


def size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes:.0f} B"


def quantile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.quantile(values, q))


def horovod_importable() -> tuple[bool, str]:
    """(True, '') when the lab's Horovod backend can run here; else (False, why not)."""
    try:
        from scaling.train import horovod_backend
    except ImportError as exc:
        return False, f"scaling.train.horovod_backend does not import ({exc})"
    return horovod_backend.available()


def backends_present(horovod_ok: bool, horovod_why: str) -> dict:
    import torch
    import torch.distributed as dist

    present = {
        "torch_gloo": dist.is_gloo_available(),
        "torch_nccl": dist.is_nccl_available(),
        "torch_mpi": dist.is_mpi_available(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "horovod_installed": importlib.util.find_spec("horovod") is not None,
        "horovod_usable": horovod_ok,
    }
    not_measured = []
    if not present["torch_nccl"] or not present["cuda_devices"]:
        not_measured.append(
            f"NCCL (torch {torch.__version__}: nccl {'built' if present['torch_nccl'] else 'not built'}, "
            f"{present['cuda_devices']} GPUs)"
        )
    if not horovod_ok:
        not_measured.append(f"Horovod ({horovod_why})")
    present["not_measured"] = "; ".join(not_measured) or "nothing left out"
    return present


def minor_label(y: float, _=None) -> str:
    """Minor ticks of a log axis: label 2 and 5 of each decade, so that a short axis still reads."""
    import math

    mantissa = y / 10 ** math.floor(math.log10(y)) if y > 0 else 0
    return f"{y:g}" if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""


def figure(rows: dict[str, list[dict]]):
    """Two log-log panels against message size: median time (interquartile band) and busbw, per backend."""
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from scaling.plots.figures import GRID, STYLE

    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(8.0, 3.8), layout="constrained")
        ax_time, ax_bw = fig.subplots(1, 2)
        for backend, series in rows.items():
            sizes = [r["bytes"] for r in series]
            colour, marker = COLOUR[backend], MARKER[backend]
            ax_time.fill_between(
                sizes,
                [r["p25_s"] * 1e3 for r in series],
                [r["p75_s"] * 1e3 for r in series],
                color=colour,
                alpha=0.15,
                linewidth=0,
            )
            ax_time.plot(
                sizes, [r["median_s"] * 1e3 for r in series], color=colour, marker=marker, label=LABEL[backend]
            )
            ax_bw.plot(sizes, [r["busbw_GBps"] for r in series], color=colour, marker=marker, label=LABEL[backend])
        ax_time.set_ylabel("time per all-reduce (ms)")
        ax_time.set_title("Time (median; band: 25th–75th percentile)")
        ax_bw.set_ylabel("busbw (GB/s, 10⁹ B/s)")
        ax_bw.set_title(f"Bus bandwidth (= algbw at n = {WORLD})" if WORLD == 2 else "Bus bandwidth")
        sizes = [r["bytes"] for r in next(iter(rows.values()))]
        for ax in (ax_time, ax_bw):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(FixedLocator(sizes))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(x)))
            ax.tick_params(axis="x", labelrotation=45)
            ax.set_xlabel("message size (bytes, float32)")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(minor_label))
            ax.grid(True, which="major", **GRID)
        ax_time.legend(loc="upper left")
        ax_bw.legend(loc="lower right")
        fig.suptitle(f"Sum all-reduce, {WORLD} ranks on one host, 1 CPU thread each")
    return fig


def main() -> None:
    bench = bl.Benchmark(NAME, __doc__, quick="4 KiB .. 16 MiB, 2 rounds")
    bench.parser.add_argument("--max-mib", type=int, help="largest message in MiB (default 256; quick 16)")
    bench.parser.add_argument(
        "--rounds", type=int, help="rounds over the sizes, ascending/descending (default 3; quick 2)"
    )
    bench.parser.add_argument("--warmup", type=int, default=3, help="untimed iterations per size, backend and round")
    bench.parser.add_argument(
        "--target-s", type=float, help="timed seconds per size, backend and round (default 0.6; quick 0.2)"
    )
    bench.parser.add_argument("--no-horovod", action="store_true", help="torch.distributed gloo only")
    args = bench.parse()
    max_bytes = (args.max_mib or (16 if args.quick else 256)) * MIB
    rounds = args.rounds or (2 if args.quick else 3)
    target_s = args.target_s or (0.2 if args.quick else 0.6)

    horovod_ok, horovod_why = (False, "left out (--no-horovod)") if args.no_horovod else horovod_importable()
    backends = ["torch_gloo"] + (["horovod_gloo"] if horovod_ok else [])
    sizes = sizes_bytes(max_bytes)
    print(
        f"[{NAME}] {', '.join(LABEL[b] for b in backends)}; {WORLD} ranks, {len(sizes)} sizes "
        f"{size_label(sizes[0])}..{size_label(sizes[-1])}, {rounds} rounds",
        flush=True,
    )
    with bl.RunQueue() as rq:
        times, horovod_error = measure(sizes, backends, rounds, args.warmup, target_s)
    if horovod_error:
        horovod_ok, horovod_why = False, f"set-up failed: {horovod_error}"
        print(f"[{NAME}] Horovod left out: {horovod_error}", flush=True)
    factor = 2 * (WORLD - 1) / WORLD
    rows: dict[str, list[dict]] = {}
    for backend, per_size in times.items():
        rows[backend] = []
        for size in sizes:
            values = per_size[size]
            t = bl.median(values)
            algbw = size / t / 1e9
            rows[backend].append(
                {
                    "bytes": size,
                    "size": size_label(size),
                    "iterations": len(values),
                    "median_s": t,
                    "min_s": min(values),
                    "p25_s": quantile(values, 0.25),
                    "p75_s": quantile(values, 0.75),
                    "max_s": max(values),
                    "algbw_GBps": algbw,
                    "busbw_GBps": algbw * factor,
                }
            )
    for i, size in enumerate(sizes):
        print(
            f"[{NAME}] {size_label(size):>8}  "
            + "  ".join(
                f"{LABEL[b]}: {rows[b][i]['median_s'] * 1e3:9.3f} ms, busbw {rows[b][i]['busbw_GBps']:6.3f} GB/s"
                for b in rows
            ),
            flush=True,
        )

    from scaling.plots.figures import save

    figure_paths = save(figure(rows), bl.results_dir(args.quick) / NAME)
    torch_rows = rows["torch_gloo"]
    small, large = torch_rows[0], torch_rows[-1]
    peak = max(torch_rows, key=lambda r: r["busbw_GBps"])
    hvd_rows = rows.get("horovod_gloo")
    a = f"torch.distributed gloo, {WORLD} ranks × 1 thread"
    b = "Horovod (gloo)" if hvd_rows else ""
    why_no_b = "" if hvd_rows else f"; Horovod not measured: {horovod_why}"
    comparisons = [
        bl.comparison(
            f"all-reduce latency, {small['size']}",
            a,
            b,
            small["median_s"] * 1e3,
            hvd_rows[0]["median_s"] * 1e3 if hvd_rows else None,
            "ms",
            bl.ratio(hvd_rows[0]["median_s"], small["median_s"]) if hvd_rows else None,
            "Horovod / torch time of one all-reduce (medians)" if hvd_rows else "",
            note="median time of one all-reduce, the slower rank's" + why_no_b,
        ),
        bl.comparison(
            f"all-reduce busbw, {large['size']}",
            a,
            b,
            large["busbw_GBps"],
            hvd_rows[-1]["busbw_GBps"] if hvd_rows else None,
            "GB/s",
            bl.ratio(hvd_rows[-1]["busbw_GBps"], large["busbw_GBps"]) if hvd_rows else None,
            "Horovod / torch bus bandwidth" if hvd_rows else "",
            note=f"busbw = size / time × 2(n−1)/n (nccl-tests); torch's peak {peak['busbw_GBps']:.3f} GB/s at "
            f"{peak['size']}" + why_no_b,
        ),
    ]
    bench.finish(
        comparisons,
        world_size=WORLD,
        threads_per_rank=1,
        dtype="float32",
        op="sum",
        rounds=rounds,
        warmup_iterations=args.warmup,
        target_s_per_size_backend_and_round=target_s,
        definitions={
            "time": "median over iterations of the slower rank's time of one all-reduce (barrier before each)",
            "algbw": "bytes / time, GB/s = 1e9 B/s",
            "busbw": "algbw * 2(n-1)/n",
            "source": "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md",
        },
        backends_measured=list(rows),
        backends_present=backends_present(horovod_ok, horovod_why),
        horovod_settings="scaling.train.horovod_backend.setup_horovod_env_and_init defaults: gloo controller and CPU "
        "operations, fusion threshold 128 MiB, cycle time 1 ms"
        if hvd_rows
        else None,
        mean_runnable=rq.mean,
        sizes=rows,
        figure=[str(p.relative_to(bl.REPO)) for p in figure_paths],
        iteration_times_s={b: {str(k): v for k, v in per.items()} for b, per in times.items()},
    )
    print(f"[{NAME}] figures {', '.join(p.name for p in figure_paths)}", flush=True)


if __name__ == "__main__":
    main()
