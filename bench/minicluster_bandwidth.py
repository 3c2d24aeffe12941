"""Benchmark: comm overhead % against link bandwidth on a real 2-node minicluster (root).

    .venv/bin/python bench/minicluster_bandwidth.py

Brings up a 2-node minicluster of this machine (network namespaces, one Ray node each), runs
experiments/minicluster-bandwidth.yaml through it (the quickstart CNN at 2 workers, one per
node, with every node's link capped at 100 Mbit/s, 1 Gbit/s, and uncapped: the sweep axis
`workers.link_bandwidth`), also times a gloo all-reduce of the model's gradient size at each
cap, reports the sweep (comm_vs_bandwidth.png), takes the cluster down, and writes
bench/results/minicluster_bandwidth.json (+ the figure) with the machine and the command.
The cluster comes down also when the script is ended by SIGTERM or Ctrl-C (minicluster.running).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scaling.launch.machine import describe_hardware, describe_versions  # noqa: E402
from scaling.testbed import minicluster as mc  # noqa: E402
from scaling.results import SweepDir, write_json_atomic  # noqa: E402

NAME = "bench"
GRADIENT_BYTES = 288_666 * 4  # small_cnn's fp32 gradients
CAPS = ("100mbit", "1gbit", "uncapped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Needs root; uses the minicluster {NAME!r} on 10.215.0.0/24 and takes it down at the end.",
    )
    parser.parse_args(argv)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    sweep = SweepDir(Path(tempfile.mkdtemp(prefix="mc-bw-")) / "sweep")
    sweep_dir = sweep.path
    scaling = str(Path(sys.executable).parent / "scaling")
    with mc.running(2, None, 1, NAME, "10.215.0.0/24"):
        probes = {}
        for cap in CAPS:
            mc.set_bandwidth(cap, NAME)
            probes[cap] = mc.allreduce_seconds(GRADIENT_BYTES, NAME, iters=5)["median_s"]
        subprocess.run(
            [
                scaling,
                "minicluster",
                "exec",
                "--name",
                NAME,
                "--",
                scaling,
                "sweep",
                "experiments/minicluster-bandwidth.yaml",
                "--out",
                str(sweep_dir),
            ],
            cwd=REPO,
            check=True,
        )
    subprocess.run([scaling, "report", str(sweep_dir)], cwd=REPO, check=True, capture_output=True)
    import pandas as pd

    runs = sweep.runs
    rows = []
    for _, run in runs.sort_values("link_bandwidth_bits_per_s", na_position="last").iterrows():
        cap = run["link_bandwidth"]
        bits = run["link_bandwidth_bits_per_s"]
        rows.append(
            {
                "link_bandwidth": cap,
                "comm_overhead_pct": run["comm_overhead_pct"],
                "exposed_comm_ms": 1e3 * run["exposed_comm_s"],
                "allreduce_ms": 1e3 * run["allreduce_s"],
                "step_ms": 1e3 * run["step_s"],
                "time_per_epoch_s": run["time_per_epoch_s"],
                "probe_allreduce_ms": 1e3 * probes[cap],
                "bandwidth_bound_ms": 1e3 * GRADIENT_BYTES * 8 / bits if pd.notna(bits) else None,
            }
        )
    result = {
        "benchmark": "minicluster_bandwidth",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/minicluster_bandwidth.py"]),
        "what": "2 nodes (network namespaces), 2 workers (one per node), quickstart CNN, each node's egress capped by "
        "tc tbf",
        "gradient_bytes": GRADIENT_BYTES,
        "rows": rows,
        "machine": describe_hardware(),
        "versions": describe_versions(),
    }
    write_json_atomic(out_dir / "minicluster_bandwidth.json", result)
    shutil.copy(sweep.report_path / "comm_vs_bandwidth.png", out_dir / "minicluster_bandwidth.png")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
