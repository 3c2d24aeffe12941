"""Hold N GPU worker nodes up (or let them go) on a cluster started from cluster/aws-*.yaml.

The YAMLs start with no workers (min_workers 0), and `scaling run|sweep` refuses at once a run the
cluster cannot place yet, so scale up before a sweep:

    ray submit cluster/aws-p3.16xlarge.yaml cluster/request_nodes.py 4    # 4 nodes, wait for them
    ray submit cluster/aws-p3.16xlarge.yaml cluster/request_nodes.py 4 --market spot   # 4 spot nodes
    ray submit cluster/aws-p3.16xlarge.yaml cluster/request_nodes.py 0    # release the request

It runs on the head: it reads the GPUs per worker node from the autoscaler's config there
(~/ray_bootstrap_config.yaml), asks the autoscaler for N whole nodes' worth of GPU bundles
(ray.autoscaler.sdk.request_resources; a later call replaces the request) and waits until the
cluster has them. Nodes launched this way stay until the request is released and they have been
idle for idle_timeout_minutes. The request stands: a spot node AWS takes back is replaced by the
autoscaler to meet it again.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml").expanduser()


def gpus_per_worker_node(config: dict) -> int:
    """GPUs of the (one) GPU worker node type in a cluster-launcher config."""
    gpus = {t["resources"]["GPU"] for t in config["available_node_types"].values() if t.get("resources", {}).get("GPU")}
    if len(gpus) != 1:
        raise SystemExit(f"expected one GPU worker node type, found GPU counts {sorted(gpus)}")
    return gpus.pop()


SPOT_RESOURCE = "spot_node"  # only the YAMLs' spot worker type has it (scaling/cluster_check.py)


def bundles(nodes: int, gpus: int, market: str = "on_demand") -> list[dict]:
    """One bundle per node, as large as a node, so that N bundles need N nodes. Spot bundles name
    the resource only spot nodes have, so the autoscaler launches spot nodes for them; on-demand
    bundles match the on-demand type exactly, which its scorer prefers."""
    bundle = {"GPU": gpus, SPOT_RESOURCE: 1} if market == "spot" else {"GPU": gpus}
    return [bundle] * nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodes", type=int, help="GPU worker nodes to hold (0 releases the request)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="how long to wait for the nodes")
    parser.add_argument(
        "--market",
        choices=("on_demand", "spot"),
        default="on_demand",
        help="on-demand nodes (gpu_worker) or spot nodes (gpu_worker_spot); a later call replaces the request",
    )
    args = parser.parse_args(argv)
    if args.nodes < 0:
        parser.error("nodes must be >= 0")

    import ray
    import yaml
    from ray.autoscaler.sdk import request_resources

    gpus = gpus_per_worker_node(yaml.safe_load(BOOTSTRAP_CONFIG.read_text()))
    ray.init(address="auto", logging_level="WARNING")
    request_resources(bundles=bundles(args.nodes, gpus, args.market))
    if args.nodes == 0:
        print("request released; idle workers go after idle_timeout_minutes")
        return 0
    want = args.nodes * gpus
    deadline = time.monotonic() + args.timeout_s
    while (have := int(ray.cluster_resources().get("GPU", 0))) < want:
        if time.monotonic() > deadline:
            print(f"timed out: {have} of {want} GPUs after {args.timeout_s:.0f} s (see `ray status`)", file=sys.stderr)
            return 1
        print(f"{have}/{want} GPUs up", flush=True)
        time.sleep(15)
    print(f"{have} GPUs up ({args.nodes} nodes x {gpus})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
