"""The lab's Grafana dashboard: shipped with the package, installed where Ray's Grafana finds it.

The dashboard (scaling/grafana/scaling_dashboard.json, package data) shows the live metrics of
scaling/launch/live_metrics.py: step time and its breakdown per rank, the three communication
figures, who waits for whom, throughput and MFU, with Ray Train's own report-blocked time
beside them. Its variables: `$run` (the lab's run name), `$rank` (world ranks, several or all),
`$run_id` (hidden: the Ray Train run id of `$run`, which filters Ray's own metric) and
`$datasource` (a Prometheus data source).

Where Ray's Grafana finds it (ray/dashboard/modules/metrics/metrics_head.py, Ray 2.60): when a
head's dashboard starts it writes `<session>/metrics/grafana/` afresh: grafana.ini, whose
provisioning folder is `<temp dir>/session_latest/metrics/grafana/provisioning`, and there a
dashboard provider reading the folder `<session>/metrics/grafana/dashboards/` (or the head's
RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR), where Ray puts its own dashboards (the Train
Dashboard among them). `install` copies the lab's there, beside them; a head started again
rewrites the folder, so it is installed again after each `ray start`.

    path = install(Path("/tmp/ray/session_latest"))      # -> .../metrics/grafana/dashboards/scaling_dashboard.json
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib.resources import files
from pathlib import Path

from scaling.errors import UsageError

DASHBOARD_FILE = "scaling_dashboard.json"
DASHBOARD_OUTPUT_DIR_ENV = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"  # Ray's own override of the folder


def dashboard_path() -> Path:
    """The shipped dashboard JSON."""
    return Path(str(files("scaling").joinpath("grafana", DASHBOARD_FILE)))


def load() -> dict:
    return json.loads(dashboard_path().read_text())


def default_session_dir() -> Path:
    """Where a head started on this machine with Ray's defaults keeps its session (Ray's temp dir:
    $RAY_TMPDIR or the system's, then ray/session_latest)."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "session_latest"


def provisioned_folder(session_dir: Path) -> Path:
    """The folder the Grafana provisioning that Ray wrote under `session_dir` reads dashboards from."""
    return Path(os.environ.get(DASHBOARD_OUTPUT_DIR_ENV) or Path(session_dir) / "metrics" / "grafana" / "dashboards")


def install(session_dir: Path) -> Path:
    """Copy the dashboard where the Grafana provisioning of the Ray head's session `session_dir` finds
    it; returns the copy's path. A session without Ray's Grafana folder is refused in one line."""
    session_dir = Path(session_dir)
    if not session_dir.is_dir():
        raise UsageError(
            f"{session_dir}: no such Ray session directory (a head's is <temp dir>/session_latest, "
            f"by default {default_session_dir()})"
        )
    grafana = session_dir / "metrics" / "grafana"
    if not grafana.is_dir():
        raise UsageError(
            f"{session_dir}: no metrics/grafana/ in it: Ray writes its Grafana provisioning there when the "
            "head starts with its dashboard (ray start --head --include-dashboard=true)"
        )
    folder = provisioned_folder(session_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / DASHBOARD_FILE
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(dashboard_path(), partial)
    partial.replace(target)  # whole or absent: Grafana polls the folder
    return target


def grafana_steps(session_dir: Path) -> list[str]:
    """How to open the installed dashboard with Ray's Prometheus and Grafana configuration."""
    metrics = Path(session_dir) / "metrics"
    return [
        f"prometheus --config.file={metrics / 'prometheus' / 'prometheus.yml'}   "
        "(Ray's config: it scrapes every node through the session's service-discovery file)",
        f"grafana server --config {metrics / 'grafana' / 'grafana.ini'} --homepath <Grafana's home, e.g. "
        "/usr/share/grafana> web   (Ray's provisioning: its dashboards and this one)",
        'open http://localhost:3000, Dashboards > Ray > "Scaling lab: step time, communication, stragglers"; '
        "pick the run ($run) and ranks ($rank)",
        "a head started again rewrites metrics/grafana/: run `scaling dashboard install` again after each `ray start`",
    ]


def manual_steps() -> list[str]:
    """How to use the dashboard without a Ray head's provisioning on this machine."""
    return [
        f"the dashboard: {dashboard_path()}",
        "Grafana: Dashboards > New > Import, upload that file, pick the Prometheus data source that scrapes the "
        "Ray cluster (Ray's prometheus.yml under <session>/metrics/prometheus/ does)",
        "or, on the head, after `ray start --head`: scaling dashboard install --session-dir <temp dir>/session_latest",
    ]
