"""A user's own Ray Train job (examples/own_job) through the lab, as a user would run it.

- `ray job submit ... scaling sweep examples/own_job/sweep.yaml --workers 1,2` on a real Ray
  head runs the user's train function at 1 and 2 workers into the lab's run directories, and
  `scaling report` draws the speedup, communication-overhead and step-breakdown figures;
- the ground truth on the user's job: `instrument.inject_comm_delay_s = D` grows the exposed
  communication per step and the A/B difference by D (+-15%) against the sweep's own 2-worker run.
"""

from __future__ import annotations

import json
import re
import subprocess

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import BIN, REPO, run_cli

SMALL = ["--set", "train.function_config.num_train=1024", "--set", "train.max_epochs=2"]
INJECTED_S = 0.1


@pytest.fixture(scope="module")
def own_sweep(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own")
    env = {**ray_cluster["env"], "RAY_ADDRESS": ray_cluster["dashboard"]}
    runtime_env = json.dumps({"env_vars": {"SCALING_RESULTS_DIR": str(tmp), "RAY_AUTH_MODE": "disabled"}})
    submit = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--working-dir", ".", "--runtime-env-json", runtime_env, "--",
         "scaling", "sweep", "examples/own_job/sweep.yaml", "--workers", "1,2", "--out", "results/own", *SMALL],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    job_id = re.search(r"Job '([^']+)' submitted successfully", submit.stdout + submit.stderr).group(1)
    status = subprocess.run([str(BIN / "ray"), "job", "status", job_id], env=env, capture_output=True, text=True, timeout=60)
    assert "succeeded" in (status.stdout + status.stderr).lower()
    return tmp / "results" / "own"


def test_ray_job_submit_sweeps_the_users_job_and_the_report_draws_it(own_sweep, tmp_path):
    index = pd.read_parquet(own_sweep / "runs.parquet")
    assert sorted(index["num_workers"]) == [1, 2] and set(index["status"]) <= {"max_epochs", "reached_target"}
    assert set(index["model"]) == {"TinyViT"} and set(index["launcher"]) == {"ray"}
    two = index[index["num_workers"] == 2].iloc[0]
    assert two["comm_overhead_pct"] is not None and two["exposed_comm_s"] > 0 and two["step_s"] > 0
    report = run_cli("report", str(own_sweep), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-2000:]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "TinyViT" in text
    figures = {p.stem for p in (tmp_path / "report").glob("*.png")}
    assert {"speedup", "comm_overhead", "step_breakdown"} <= figures, figures


def test_injected_delay_is_measured_on_the_users_job(own_sweep, ray_connected, tmp_path):
    base_dir = next(p for p in (own_sweep / "runs").iterdir() if json.loads((p / "summary.json").read_text())["num_workers"] == 2)
    base = json.loads((base_dir / "summary.json").read_text())
    cfg = load_config(REPO / "examples" / "own_job" / "sweep.yaml", num_workers=2,
                      overrides=[s for s in SMALL if s != "--set"] + [f"instrument.inject_comm_delay_s={INJECTED_S}"])
    injected = execute_run(cfg, tmp_path / "injected", launcher="ray")
    assert injected["status"] in ("max_epochs", "reached_target"), injected["error"]
    exposed_growth = injected["exposed_comm_s"] - base["exposed_comm_s"]
    ab_growth = injected["comm_delta_s"] - base["comm_delta_s"]
    print(f"injected {INJECTED_S:.3f} s: exposed grew {exposed_growth:.4f} s, A/B grew {ab_growth:.4f} s")
    assert exposed_growth == pytest.approx(INJECTED_S, rel=0.15)
    assert ab_growth == pytest.approx(INJECTED_S, rel=0.15)
