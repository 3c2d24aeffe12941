"""One rank of a gloo all-reduce timing, for checking links between minicluster nodes.

    python -m scaling.launch.allreduce_probe --rank R --world N --master IP --port P --bytes S

Each rank joins a gloo process group at IP:P (bound to $GLOO_SOCKET_IFNAME, the node's own
link inside a minicluster), all-reduces an fp32 tensor of S bytes once to warm up, then
`--iters` times, and rank 0 prints {"bytes", "seconds": [...], "median_s"} as JSON. Every
rank finishes each all-reduce together (a barrier before each), so the time is the collective's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, default=29511)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=300))
    tensor = torch.ones(args.bytes // 4)
    dist.all_reduce(tensor)
    seconds = []
    for _ in range(args.iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds.append(time.perf_counter() - start)
    if args.rank == 0:
        print(json.dumps({"bytes": args.bytes, "seconds": seconds, "median_s": statistics.median(seconds)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
