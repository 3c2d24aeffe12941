"""The run's figures, live, in Ray's own metrics (scaling/launch/live_metrics.py): during a real
2-worker Ray Train run, the head node's Prometheus endpoint serves each rank's step time,
exposed communication, waiting and throughput, tagged with the run's name and Ray Train's world
rank (what each figure means, checked against the run's records through a real Prometheus:
tests/test_dashboard.py).

Ray exports a worker's gauges only while the worker lives (every few seconds; the metrics agent
drops a dead worker's), so the run is held (tests/held_model.py) in its second epoch's
evaluation, after every rank set its gauges at the end of epoch 1, until the endpoint has
served them all (or a deadline passed): what is checked does not depend on how fast the CPU
trains.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO
from tests.held_model import held, hold, release

WANTED = ("ray_scaling_step_seconds", "ray_scaling_exposed_comm_seconds", "ray_scaling_waiting_seconds",
          "ray_scaling_throughput_samples_per_second")
RANKS = ("0", "1")
SCRAPE_EVERY_S = 0.5
# From the run's start: Ray Train's start-up (under 10 s here), an epoch, and Ray's export period.
DEADLINE_S = 240.0


def _metrics_port() -> int:
    import ray

    head = [n for n in ray.nodes() if n["Alive"]][0]
    return int(head["MetricsExportPort"])


def _scrape(url: str, name: str, seen: dict) -> None:
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return
    for line in text.splitlines():
        for metric in WANTED:
            match = re.match(rf"{metric}{{(.*)}} (\S+)$", line)
            if match and f'run="{name}"' in match.group(1):
                rank = re.search(r'ray_train_worker_world_rank="(\d+)"', match.group(1)).group(1)
                seen[(metric, rank)] = float(match.group(2))


def test_each_worker_exports_its_figures_to_rays_prometheus_endpoint(ray_connected, tmp_path):
    name = f"live-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    # 8 steps per rank and epoch: 3 after the 5 warm-up steps, so epoch 1 sets the step gauges
    cfg = load_config(REPO / "experiments" / "quickstart.yaml", num_workers=2, overrides=[
        f"name={name}", "model.name=tests.held_model:held_small_cnn", "data.train_samples=1024",
        "data.val_samples=256", "train.max_epochs=2", "train.target_accuracy=1.0", "instrument.calibration_pairs=0",
        "train.eval_every=1"])
    gate = hold(run_dir, after_evaluations=2)  # one evaluation per epoch: the second is epoch 2's
    url = f"http://127.0.0.1:{_metrics_port()}/metrics"
    wanted = {(metric, rank) for metric in WANTED for rank in RANKS}
    seen, stop, when = {}, threading.Event(), {}

    def scrape_until_seen():  # the run itself must own the main thread: Ray Train sets signal handlers
        start = time.monotonic()
        while not stop.is_set() and time.monotonic() < start + DEADLINE_S and not wanted <= set(seen):
            _scrape(url, name, seen)
            stop.wait(SCRAPE_EVERY_S)
        when.update(after_s=time.monotonic() - start, held=[held(gate, int(rank)) is not None for rank in RANKS])
        release(gate)  # seen (or given up on): let the run finish

    scraper = threading.Thread(target=scrape_until_seen, daemon=True)
    scraper.start()
    try:
        summary = execute_run(cfg, run_dir, launcher="ray")
    finally:
        stop.set()
        scraper.join(timeout=30)
        release(gate)
    print(f"scraped until {when['after_s']:.1f} s after the run started ({len(seen)} of {len(wanted)} gauges seen); "
          f"ranks held by then: {when['held']}")
    assert summary["status"] == "max_epochs", summary["error"]
    assert wanted <= set(seen), sorted(seen)
    assert seen[("ray_scaling_step_seconds", "0")] > 0 and seen[("ray_scaling_throughput_samples_per_second", "0")] > 0
    assert seen[("ray_scaling_step_seconds", "1")] > 0 and seen[("ray_scaling_throughput_samples_per_second", "1")] > 0
