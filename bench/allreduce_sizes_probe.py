"""One rank of a gloo all-reduce timing over several message sizes, kept alive across link caps.

    python bench/allreduce_sizes_probe.py --rank R --world N --master IP [--port P]

The same measurement as scaling/launch/allreduce_probe.py (an fp32 tensor of S bytes, one
warm-up all-reduce, then `iters` timed ones, each after a barrier so that every rank starts
together; gloo bound to $GLOO_SOCKET_IFNAME), but for many sizes in one process group, so
that a sweep over sizes and link caps pays torch's import and gloo's rendezvous once. The
driver (bench/projection_vs_minicluster.py) writes one JSON line per request to every rank's
stdin, {"sizes": [...], "iters": k}, changing the link cap between requests; rank 0 answers
each with one JSON line {"results": [{"bytes", "seconds": [...], "median_s"}, ...]}. An
empty line or end of input ends the process group.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, default=29512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=600))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        request = json.loads(line)
        results = []
        for nbytes in request["sizes"]:
            tensor = torch.ones(int(nbytes) // 4)
            dist.barrier()
            dist.all_reduce(tensor)  # warm-up: buffers, connections, the token bucket's state
            seconds = []
            for _ in range(int(request.get("iters", 3))):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                seconds.append(time.perf_counter() - start)
            results.append({"bytes": int(nbytes), "seconds": seconds, "median_s": statistics.median(seconds)})
        if args.rank == 0:
            print(json.dumps({"results": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
