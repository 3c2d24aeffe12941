"""The run's figures, live, in Ray's own metrics (scaling/instrument/live_metrics.py): during a real
2-worker Ray Train run, the head node's Prometheus endpoint serves each rank's step time,
exposed communication, waiting and throughput, tagged with the run's name."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO


def _metrics_port() -> int:
    import ray

    head = [n for n in ray.nodes() if n["Alive"]][0]
    return int(head["MetricsExportPort"])


def test_each_worker_exports_its_figures_to_rays_prometheus_endpoint(ray_connected, tmp_path):
    name = f"live-{uuid.uuid4().hex[:8]}"
    cfg = load_config(REPO / "experiments" / "quickstart.yaml", num_workers=2, overrides=[
        f"name={name}", "data.train_samples=8192", "data.val_samples=256", "train.max_epochs=5",
        "train.target_accuracy=1.0", "instrument.calibration_pairs=2", "train.eval_every=1"])
    url = f"http://127.0.0.1:{_metrics_port()}/metrics"
    wanted = ("ray_scaling_step_seconds", "ray_scaling_exposed_comm_seconds", "ray_scaling_waiting_seconds",
              "ray_scaling_throughput_samples_per_second")
    seen, running = {}, threading.Event()
    running.set()

    def scrape():  # while the run goes (the run itself must own the main thread: Ray Train sets signal handlers)
        while running.is_set():
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                text = ""
            for line in text.splitlines():
                for metric in wanted:
                    match = re.match(rf"{metric}{{(.*)}} (\S+)$", line)
                    if match and f'run="{name}"' in match.group(1):
                        rank = re.search(r'(?:^|,)rank="(\d+)"', match.group(1)).group(1)  # not node_rank
                        seen[(metric, rank)] = float(match.group(2))
            running.wait(0) and time.sleep(1)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        summary = execute_run(cfg, tmp_path / "run", launcher="ray")
    finally:
        running.clear()
        scraper.join(timeout=30)
    assert summary["status"] == "max_epochs", summary["error"]
    assert {(m, r) for m in wanted for r in ("0", "1")} <= set(seen), sorted(seen)
    assert seen[("ray_scaling_step_seconds", "0")] > 0 and seen[("ray_scaling_throughput_samples_per_second", "0")] > 0
