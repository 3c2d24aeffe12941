"""One rank of a gloo all-reduce timing, for checking links between minicluster nodes.

    python -m scaling.testbed.allreduce_probe --rank R --world N --master IP [--port P]

Each rank joins a gloo process group at IP:P (bound to $GLOO_SOCKET_IFNAME, the node's own
link inside a minicluster), prints {"ready": true} once the group is formed, then answers
requests, one JSON line each on its stdin, {"sizes": [S, ...], "iters": k}: per size, an fp32
tensor of S bytes is all-reduced once to warm up (buffers, connections, a token bucket's
state), then k times, each after a barrier so that every rank starts together and the time
is the collective's. Rank 0 answers each request with one JSON line {"results": [{"bytes",
"seconds": [...], "median_s"}, ...]}. An empty line or the end of input ends the group.

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


def time_allreduce(nbytes: int, iters: int) -> dict:
    """{"bytes", "seconds", "median_s"}: `iters` timed all-reduces of an fp32 tensor of `nbytes`."""
    tensor = torch.ones(int(nbytes) // 4)
    dist.barrier()
    dist.all_reduce(tensor)  # warm-up
    seconds = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds.append(time.perf_counter() - start)
    return {"bytes": int(nbytes), "seconds": seconds, "median_s": statistics.median(seconds)}


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
        results = [time_allreduce(nbytes, int(request.get("iters", 3))) for nbytes in request["sizes"]]
        if args.rank == 0:
            print(json.dumps({"results": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
