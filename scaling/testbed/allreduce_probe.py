"""One rank of a gloo all-reduce (or all-gather) timing, for checking links between minicluster nodes.

    python -m scaling.testbed.allreduce_probe --rank R --world N --master IP [--port P]

Each rank joins a gloo process group at IP:P (bound to $GLOO_SOCKET_IFNAME, the node's own
link inside a minicluster), prints {"ready": true} once the group is formed, then answers
requests, one JSON line each on its stdin, {"sizes": [S, ...], "iters": k, "collective": C}: per
size, an fp32 tensor of S bytes is all-reduced (C "all_reduce", the default) or gathered from
every rank's 1/N of it (C "all_gather": `all_gather_into_tensor`, as FSDP2 gathers a unit's
parameters) once to warm up (buffers, connections, a token bucket's state), then k times, each
after a barrier so that every rank starts together and the time is the collective's. With
"interleaved": {"compute_s": c, "segments": m}, each size is timed as a training step issues it:
m times compute of about c seconds then the collective, against the same compute alone
(`time_interleaved`): what a collective costs inside a loop that back-to-back timing does not
show. Rank 0 answers each request with one JSON line {"results": [{"bytes", "seconds": [...],
"median_s", "mean_s"}, ...]}: the median for a link's typical collective, the mean (its tail
included) for what a mean step spends in it. An empty line or the end of input ends the group.

The process stays alive across requests, so a sweep over sizes and link caps pays torch's
import and gloo's rendezvous once. The driver that starts one rank per node and talks to
them is `scaling.testbed.minicluster.AllreduceProbe`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_PORT = 29511


def _collective(nbytes: int, collective: str):
    """A call of `collective` on an fp32 tensor of `nbytes`: all_reduce it, or all_gather it from every
    rank's 1/N (module docstring)."""
    tensor = torch.ones(int(nbytes) // 4)
    if collective == "all_gather":
        shard = torch.ones(len(tensor) // dist.get_world_size())
        tensor = tensor[: len(shard) * dist.get_world_size()]
        return lambda: dist.all_gather_into_tensor(tensor, shard)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(tensor)
    raise ValueError(f"collective must be all_reduce or all_gather, got {collective!r}")


def time_collective(nbytes: int, iters: int, collective: str = "all_reduce") -> dict:
    """{"bytes", "seconds", "median_s", "mean_s"}: `iters` timed all-reduces of an fp32 tensor of
    `nbytes`, or all-gathers into one (module docstring)."""
    run = _collective(nbytes, collective)
    dist.barrier()
    run()  # warm-up
    seconds = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return {
        "bytes": int(nbytes),
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "mean_s": statistics.fmean(seconds),
    }


def _busy_compute(repeats: int, matrix: torch.Tensor) -> torch.Tensor:
    x = matrix
    for _ in range(repeats):
        x = torch.tanh(x @ matrix)
    return x


def time_interleaved(nbytes: int, iters: int, collective: str, compute_s: float, segments: int) -> dict:
    """A training step's pattern: `segments` x (compute of about `compute_s`, then one blocking
    collective of `nbytes`), `iters` times, against the same compute without collectives. Per segment,
    medians: "compute_alone_s", "compute_interleaved_s" (the compute that follows a collective), and
    "collective_interleaved_s" (the collective there, the shorter of the ranks' durations: the rank
    that arrived last spent only the transfer in it), with its mean "collective_interleaved_mean_s";
    "collective_alone_s" as `time_collective` times it."""
    matrix = torch.randn(128, 128, generator=torch.Generator().manual_seed(0)) / 16
    start = time.perf_counter()
    _busy_compute(50, matrix)
    repeats = max(1, round(compute_s / ((time.perf_counter() - start) / 50)))
    repeats = int(_agreed_max(repeats))  # every rank computes the same amount
    run = _collective(nbytes, collective)
    alone, computes, collectives = [], [], []
    for _ in range(iters):
        dist.barrier()
        for _ in range(segments):
            t0 = time.perf_counter()
            _busy_compute(repeats, matrix)
            alone.append(time.perf_counter() - t0)
        dist.barrier()
        run()  # the first collective of an iteration follows the barrier, not compute: not counted
        for _ in range(segments):
            t0 = time.perf_counter()
            _busy_compute(repeats, matrix)
            t1 = time.perf_counter()
            run()
            computes.append(t1 - t0)
            collectives.append(time.perf_counter() - t1)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, collectives)
    shortest = [min(per_rank) for per_rank in zip(*gathered)]
    return {
        "bytes": int(nbytes),
        "collective": collective,
        "compute_alone_s": statistics.median(alone),
        "compute_interleaved_s": statistics.median(computes),
        "collective_interleaved_s": statistics.median(shortest),
        "collective_interleaved_mean_s": statistics.fmean(shortest),
        "collective_alone_s": time_collective(nbytes, iters, collective)["median_s"],
    }


def _agreed_max(value: float) -> float:
    tensor = torch.tensor([float(value)])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=600),
    )
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        request = json.loads(line)
        iters, collective = int(request.get("iters", 3)), request.get("collective", "all_reduce")
        if request.get("interleaved"):
            compute_s, segments = float(request["interleaved"]["compute_s"]), int(request["interleaved"]["segments"])
            results = [time_interleaved(n, iters, collective, compute_s, segments) for n in request["sizes"]]
        else:
            results = [time_collective(nbytes, iters, collective) for nbytes in request["sizes"]]
        if args.rank == 0:
            print(json.dumps({"results": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
