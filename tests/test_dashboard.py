"""The lab's Grafana dashboard (scaling/grafana/scaling_dashboard.json, scaling/dashboard.py), checked
against a real Prometheus and the run's own records.

One real 2-worker Ray Train run (the module's `held_run`) serves both live checks:

`test_each_worker_exports_its_figures_to_rays_prometheus_endpoint`: the head node's own metrics
endpoint (scaling/launch/live_metrics.py), scraped directly while the run is held, serves each
rank's step time, exposed communication, waiting and throughput of epoch 2, tagged with the run's
name and Ray Train's world rank, equal to the records' figures. No Prometheus server needed.

`test_every_panel_answers_with_the_runs_records`: Debian's `prometheus` on loopback, with a
private data directory, scrapes the session's Ray head through the service-discovery file Ray
writes into its session directory (`prom_metrics_service_discovery.json`), every second. A real
2-worker Ray Train run of the lab trains three epochs and is held (tests/held_model.py) in epoch
3's evaluation, after every rank exported epochs 1 and 2 (Ray drops a dead worker's metrics, so
the workers must live while Prometheus scrapes them). Once Prometheus has epoch 2 from both ranks,
every query of every panel of the shipped JSON is evaluated through Prometheus's HTTP API at one
instant, with `$run`, `$rank` (both ranks) and `$run_id` substituted (`$run_id` resolved as
Grafana would: its `label_values` query), and each must return series for that run whose values
agree with the run's steps.parquet and epochs.parquet (epochs 1 and 2, each rank's steady-state
steps):

- per-epoch gauges (step time, its phases, communication, waiting, the straggler's share,
  collectives): epoch 2's figures to 1e-6 (the same arithmetic); throughput, FLOP/s and MFU, which
  come from the epoch's row (epochs.parquet keeps rank 0's): rank 0's to 1e-6, the others' above 0;
- quantiles of the per-step histograms (p50, p99): within 5% of the same bucket-interpolated
  quantile of the records (`bucket_quantile`, Prometheus's `histogram_quantile` applied to the
  records' values); the step time's p50 also within one bucket (19%) of the records' exact median;
- the shares of the step (per epoch and over the run so far) to 1e-6: each over the steps whose
  collectives were timed, numerator and denominator (`ray_scaling_comm_timed_step_seconds`, and
  over the run the counters of exact sums: a histogram's `_sum` is Ray's midpoint estimate), as
  run_metrics defines a share;
- throughput, tokens/s, FLOP/s and MFU worked out here from the epoch's row and the compute
  profile's fields, not by the exporter's own function;
- a figure the records do not have (tokens/s of a model without token ids; MFU where the device's
  peak is unknown) has no series either; Ray Train's own report-blocked time has one per rank.

Idle, about a minute here: Ray Train's start, three short epochs, and Ray's export period (the
head's default, about 10 s) before the held epoch's figures reach Prometheus.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from scaling import dashboard
from scaling.launch.live_metrics import BUCKETS, COLLECTIVE_COLUMN, COUNTERS, GAUGES, HISTOGRAMS, epoch_figures
from tests.conftest import REPO, prometheus_capability
from tests.dashboard_queries import panel_queries, substitute, variable_queries
from tests.held_model import hold, release

RANK = "ray_train_worker_world_rank"
RAY_METRICS = {"ray_train_report_total_blocked_time_s"}
SCRAPE_INTERVAL_S = 1
# Ray Train's start (under 10 s here), three epochs, Ray's export period and a scrape, with room for a loaded machine.
DEADLINE_S = 240.0


def bucket_quantile(values, q: float, bounds=BUCKETS) -> float:
    """The q-quantile of `values` as Prometheus' `histogram_quantile` computes it from a histogram
    with upper bounds `bounds` (inclusive, plus +Inf): linear inside the bucket that holds the
    rank q x count, from the bucket's lower bound (0 for the first); the highest finite bound when
    that bucket is +Inf (promql/quantile.go, Prometheus 2.42). NaN values (a step whose collectives were
    not timed) are left out, as `scaling.launch.live_metrics.step_observations` never observes them."""
    values = sorted(v for v in map(float, values) if math.isfinite(v))
    if not values:
        return math.nan
    counts, i = [], 0
    for bound in bounds:
        while i < len(values) and values[i] <= bound:
            i += 1
        counts.append(i)
    rank = q * len(values)
    b = next((k for k, c in enumerate(counts) if c >= rank), len(counts))
    if b == len(counts):  # the +Inf bucket
        return bounds[-1]
    start, below = (bounds[b - 1], counts[b - 1]) if b > 0 else (0.0, 0)
    return start + (bounds[b] - start) * (rank - below) / (counts[b] - below)


# --- the shipped JSON and the install, in process ------------------------------------------------------------


def test_the_shipped_dashboard_has_its_variables_and_queries_only_of_exported_metrics():
    board = dashboard.load()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"run", "rank", "run_id", "datasource"} <= set(variables)
    assert variables["rank"]["multi"] and variables["rank"]["includeAll"]
    exported = (
        {f"ray_{name}" for name in GAUGES}
        | {f"ray_{name}_{part}" for name in HISTOGRAMS for part in ("bucket", "sum", "count")}
        | {f"ray_{name}" for name in COUNTERS}
    )
    queries = panel_queries(board)
    assert len(queries) >= 20
    for title, ref, expr in queries:
        names = set(re.findall(r"\b(ray_[a-z_]+)\s*\{", expr))
        assert names and names <= exported | RAY_METRICS, (title, ref, names - exported - RAY_METRICS)
        if names & exported:
            assert "$run" in expr and "$rank" in expr, (title, ref)
    used = {
        name for _, _, expr in queries for name in re.findall(r"\b(ray_scaling_[a-z_]+?)(?:_bucket|_sum)?\s*\{", expr)
    }
    assert {f"ray_{name}" for name in (*GAUGES, *HISTOGRAMS, *COUNTERS)} <= used, "every exported figure has a panel"


def test_the_docs_show_every_panels_query():
    page = (REPO / "docs" / "dashboard.md").read_text()
    board = dashboard.load()
    missing = [(title, ref) for title, ref, expr in panel_queries(board) if expr not in page or title not in page]
    assert not missing, f"docs/dashboard.md lacks these panels' queries: {missing}"
    assert all(definition in page for definition in variable_queries(board).values())


def test_install_copies_it_where_rays_grafana_provisioning_reads(tmp_path, monkeypatch):
    monkeypatch.delenv(dashboard.DASHBOARD_OUTPUT_DIR_ENV, raising=False)
    session = tmp_path / "session_latest"
    (session / "metrics" / "grafana").mkdir(parents=True)
    target = dashboard.install(session)
    assert target == session / "metrics" / "grafana" / "dashboards" / dashboard.DASHBOARD_FILE
    assert json.loads(target.read_text())["uid"] == dashboard.load()["uid"]
    from scaling.cli import main

    assert main(["dashboard", "install", "--session-dir", str(tmp_path / "nowhere")]) == 2
    (tmp_path / "bare").mkdir()
    assert main(["dashboard", "install", "--session-dir", str(tmp_path / "bare")]) == 2
    assert not (tmp_path / "bare" / "metrics").exists(), "nothing written on a refusal"


def test_substitute_and_bucket_quantile():
    assert substitute('x{run=~"$run", r=~"${rank}"}', {"run": "a", "rank": "(0|1)"}) == 'x{run=~"a", r=~"(0|1)"}'
    # histogram_quantile's rule: linear inside the bucket holding rank q x count
    assert bucket_quantile([0.5, 1.5, 1.5, 3.0], 0.5, bounds=(1.0, 2.0, 4.0)) == pytest.approx(1.5)
    assert bucket_quantile([9.0], 0.5, bounds=(1.0, 2.0)) == 2.0  # in +Inf: the highest finite bound
    assert all(b > a for a, b in zip(BUCKETS, BUCKETS[1:])) and BUCKETS[0] < 1e-4 and BUCKETS[-1] >= 100


def test_epoch_figures_of_a_sharded_job_take_its_collective_columns():
    rows = [
        {
            "kind": "train",
            "warmup": False,
            "step_s": 1.0,
            "data_s": 0.1,
            "forward_s": 0.3,
            "backward_s": 0.5,
            "optimizer_s": 0.1,
            "comm_s": 0.4,
            "allgather_s": 0.3,
            "reducescatter_s": 0.2,
            "allgathers": 6,
            "reducescatters": 3,
            "allreduce_s": math.nan,
            "exposed_comm_s": 0.25,
            "straggler_rank": 1.0,
        }
    ]
    figures = {
        (name, tuple(tags.values())): value
        for name, tags, value in epoch_figures(
            rows, {"epoch": 1, "train_s": 2.0, "throughput_samples_per_s": 64.0, "tokens": 4096.0}, rank=1
        )
    }
    assert figures[("scaling_communicating_seconds", ())] == 0.4
    assert figures[("scaling_collective_seconds", ("allgather",))] == 0.3
    assert figures[("scaling_collectives_per_step", ("reducescatter",))] == 3
    assert ("scaling_collective_seconds", ("allreduce",)) not in figures  # NaN: not a figure
    assert figures[("scaling_throughput_tokens_per_second", ())] == 2048.0
    assert figures[("scaling_straggler_share", ())] == 1.0
    # a sequence of token ids without a `tokens` column: samples/s x tokens per sample, as the summary counts
    tokens = {
        name: value
        for name, tags, value in epoch_figures(
            [],
            {"epoch": 1, "train_s": 2.0, "throughput_samples_per_s": 10.0, "num_workers": 2},
            rank=0,
            profile={"input_shape": [128], "input_dtype": "int64"},
        )
    }
    assert tokens["scaling_throughput_tokens_per_second"] == 1280.0


def test_a_run_that_communicates_nothing_leaves_its_counters_where_they_are(monkeypatch):
    """A 1-worker run's timed steps have no exposed communication: its counter's increment is 0, which
    Ray's Counter refuses (ValueError), so it is left out; the step time's counter still goes up."""
    from scaling.launch import live_metrics

    class Counter:
        def __init__(self):
            self.total = 0.0

        def inc(self, value, tags=None):
            if value <= 0:  # as ray.util.metrics.Counter.inc
                raise ValueError(f"value must be >0, got {value}")
            self.total += value

    counters = {name: Counter() for name in COUNTERS}
    monkeypatch.setattr(live_metrics, "_ray_metric", lambda name: counters[name])
    monkeypatch.setattr(live_metrics, "step_observations", lambda rows: [])
    monkeypatch.setattr(live_metrics, "epoch_figures", lambda *args: [])
    meter = object.__new__(live_metrics.RayLiveMetrics)
    meter.tags, meter.rank, meter.profile = {"run": "r"}, 0, None
    row = {"kind": "train", "warmup": False, "step_s": 0.5, "exposed_comm_s": 0.0, "comm_s": 0.0}
    meter.update([row, dict(row)], {"epoch": 1})
    assert counters["scaling_comm_timed_step_seconds_total"].total == 1.0
    assert counters["scaling_exposed_comm_seconds_total"].total == 0.0


# --- against Prometheus ----------------------------------------------------------------------------------------


class Prometheus:
    """Debian's prometheus on 127.0.0.1, a private data dir, scraping Ray's service-discovery file."""

    def __init__(self, session_dir: Path, work: Path):
        from scaling.testbed.local_cluster import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = work / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
            "scrape_configs:\n- job_name: ray\n  file_sd_configs:\n  - files:\n"
            f"    - '{session_dir / 'prom_metrics_service_discovery.json'}'\n    refresh_interval: "
            f"{SCRAPE_INTERVAL_S}s\n"
        )
        self.log = work / "prometheus.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-1000:]}")
            try:
                if urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready within {timeout_s:g} s: {self.log.read_text()[-1000:]}")

    def api(self, path: str, **params) -> list:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]["result"] if isinstance(answer["data"], dict) else answer["data"]

    def query(self, expr: str, at: float | None = None) -> list:
        return self.api("query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))

    def label_values(self, definition: str, at: float) -> set[str]:
        """A `label_values(selector, label)` variable's values, as Grafana asks Prometheus for them."""
        selector, label = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", definition).groups()
        series = self.api("series", **{"match[]": selector, "start": f"{at - 300:.3f}", "end": f"{at:.3f}"})
        return {s[label] for s in series if label in s}

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _session_dir() -> Path:
    import ray

    return Path(ray._private.worker.global_worker.node.get_session_dir_path())


def _by_series(result: list, value_labels=("phase", "kind")) -> dict:
    """{(rank, phase or kind, ...): value} of an instant query's series."""
    values = {}
    for series in result:
        labels = series["metric"]
        key = (labels.get(RANK), *(labels[k] for k in value_labels if k in labels))
        assert key not in values, f"two series for {key}: {result}"
        values[key] = float(series["value"][1])
    return values


class Records:
    """What the run's records say, per rank, of what the dashboard shows at the held instant (epochs 1-2)."""

    def __init__(self, run_dir: Path, epochs_exported: int):
        from scaling.results import RunDir

        run = RunDir(run_dir)
        steps = run.steps()
        self.epochs = run.epochs()
        self.profile = run.compute_profile()
        self.steps = steps[steps["epoch"] <= epochs_exported]
        self.steady = self.steps[(self.steps["kind"] == "train") & ~self.steps["warmup"].astype(bool)]
        self.last_epoch = epochs_exported
        self.last = self.steady[self.steady["epoch"] == epochs_exported]
        self.ranks = sorted(int(r) for r in self.steady["rank"].unique())

    def per_rank(self, frame, function) -> dict:
        return {(str(rank),): function(frame[frame["rank"] == rank]) for rank in self.ranks}

    def mean(self, column: str) -> dict:
        return self.per_rank(self.last, lambda f: f[column].mean())

    def share(self, column: str) -> dict:
        """A share of the step over the steps that recorded `column` (run_metrics' definition)."""

        def over_the_same_steps(f):
            f = f[f[column].notna()]
            return 100 * f[column].mean() / f["step_s"].mean()

        return self.per_rank(self.last, over_the_same_steps)

    def quantile(self, column: str, q: float, phases: bool = False) -> dict:
        if phases:
            return {
                (str(r), p): bucket_quantile(self.steady[self.steady["rank"] == r][f"{p}_s"], q)
                for r in self.ranks
                for p in ("data", "forward", "backward", "optimizer")
            }
        return self.per_rank(self.steady, lambda f: bucket_quantile(f[column], q))

    def ab_share(self) -> dict:
        calib = self.steps[self.steps["epoch"] == self.last_epoch]

        def one(rank):
            mine = calib[calib["rank"] == rank].set_index("pair")
            sync = mine[mine["kind"] == "calib_sync"]["step_s"]
            nosync = mine[mine["kind"] == "calib_nosync"]["step_s"]
            steady = self.last[self.last["rank"] == rank]
            delta = (sync - nosync.reindex(sync.index)).dropna().median() * steady["synced_micro_batches"].mean()
            return 100 * delta / steady["step_s"].mean()

        return {(str(rank),): one(rank) for rank in self.ranks}

    def epoch_row(self) -> dict:
        return self.epochs[self.epochs["epoch"] == self.last_epoch].iloc[0].to_dict()

    def rank0_figure(self, name: str) -> dict:
        """Rank 0's gauge from the recorded epoch row (epochs.parquet is rank 0's) and the compute
        profile, worked out here from their fields, not by the exporter's own function."""
        row, profile = self.epoch_row(), self.profile or {}
        throughput = row["throughput_samples_per_s"]
        figures = {"scaling_throughput_samples_per_second": throughput}
        shape = profile.get("input_shape")
        if profile.get("input_dtype", "").startswith(("torch.int", "int")) and shape and len(shape) == 1:
            figures["scaling_throughput_tokens_per_second"] = throughput * shape[0]  # T token ids per sample
        if profile.get("train_flops"):
            achieved = profile["train_flops"] * throughput / int(row.get("num_workers") or 1)  # per worker
            figures["scaling_achieved_flops_per_second"] = achieved
            if profile.get("peak_flops_per_s") and achieved <= profile["peak_flops_per_s"]:
                figures["scaling_mfu"] = achieved / profile["peak_flops_per_s"]
        return {("0",): figures[name]} if name in figures else {}


EXACT, QUANTILE, PRESENT, RANK0 = "exact", "quantile", "present", "rank 0"


def _expected(records: Records) -> dict:
    """(panel title, refId) -> (how to compare, {series key: value}); {} where no series is expected."""
    r = records
    phases = {
        (str(rank), p): v
        for rank in r.ranks
        for p in ("data", "forward", "backward", "optimizer")
        for v in [r.last[r.last["rank"] == rank][f"{p}_s"].mean()]
    }
    # every rank records each step's straggler (the same all-gathered answer): the share of steps that name it
    straggler = r.per_rank(r.last, lambda f: float((f["straggler_rank"] == f["rank"]).mean()))
    kinds = [m.group(1) for c in r.last.columns if (m := COLLECTIVE_COLUMN.match(c)) and r.last[c].notna().any()]
    kind = {(rank, k): v for k in kinds for (rank,), v in r.mean(f"{k}_s").items()}
    counts = {k: f"{k}s" if f"{k}s" in r.last.columns else "num_buckets" for k in kinds}
    buckets = {(rank, k): v for k in kinds for (rank,), v in r.mean(counts[k]).items()}
    communicating = "comm_s" if "comm_s" in r.last.columns else "allreduce_s"
    return {
        ("Epoch finished per rank", "A"): (EXACT, {(str(rank),): float(r.last_epoch) for rank in r.ranks}),
        ("Step time per rank (epoch mean)", "A"): (EXACT, r.mean("step_s")),
        ("Step breakdown per rank (epoch mean)", "A"): (EXACT, phases),
        ("Step time p50 and p99 per rank (run so far)", "A"): (QUANTILE, r.quantile("step_s", 0.5)),
        ("Step time p50 and p99 per rank (run so far)", "B"): (QUANTILE, r.quantile("step_s", 0.99)),
        ("Phase p50 and p99 per rank (run so far)", "A"): (QUANTILE, r.quantile("", 0.5, phases=True)),
        ("Phase p50 and p99 per rank (run so far)", "B"): (QUANTILE, r.quantile("", 0.99, phases=True)),
        ("Communication, % of the step (epoch)", "A"): (EXACT, r.share(communicating)),
        ("Communication, % of the step (epoch)", "B"): (EXACT, r.share("exposed_comm_s")),
        ("Communication, % of the step (epoch)", "C"): (EXACT, r.ab_share()),
        ("Exposed communication, % of the step (run so far)", "A"): (
            EXACT,
            r.per_rank(
                r.steady, lambda f: 100 * f["exposed_comm_s"].sum() / f.loc[f["exposed_comm_s"].notna(), "step_s"].sum()
            ),
        ),
        ("Exposed communication p50 and p99 per rank (run so far)", "A"): (QUANTILE, r.quantile("exposed_comm_s", 0.5)),
        ("Exposed communication p50 and p99 per rank (run so far)", "B"): (
            QUANTILE,
            r.quantile("exposed_comm_s", 0.99),
        ),
        ("Collectives per kind: time in flight per step (epoch mean)", "A"): (EXACT, kind),
        ("Collectives per kind: count per step (epoch mean)", "A"): (EXACT, buckets),
        ("Waiting for the slowest rank, and transfer, per rank (epoch mean)", "A"): (EXACT, r.mean("waiting_s")),
        ("Waiting for the slowest rank, and transfer, per rank (epoch mean)", "B"): (EXACT, r.mean("transfer_s")),
        ("Waiting p50 and p99 per rank (run so far)", "A"): (QUANTILE, r.quantile("waiting_s", 0.5)),
        ("Waiting p50 and p99 per rank (run so far)", "B"): (QUANTILE, r.quantile("waiting_s", 0.99)),
        ("The straggler: share of steps each rank arrived last (epoch)", "A"): (EXACT, straggler),
        ("Throughput, samples/s (epoch)", "A"): (RANK0, r.rank0_figure("scaling_throughput_samples_per_second")),
        ("Throughput, tokens/s (epoch; models whose samples are token sequences)", "A"): (
            RANK0,
            r.rank0_figure("scaling_throughput_tokens_per_second"),
        ),
        ("MFU (epoch)", "A"): (RANK0, r.rank0_figure("scaling_mfu")),
        ("Achieved model FLOP/s per worker (epoch)", "A"): (RANK0, r.rank0_figure("scaling_achieved_flops_per_second")),
        ("Ray Train: report blocked time per rank (cumulative)", "A"): (
            PRESENT,
            {(str(rank),): None for rank in r.ranks},
        ),
    }


def _compare(title: str, ref: str, how: str, expected: dict, got: dict) -> list[str]:
    """What disagrees (empty: all agree)."""
    where = f"{title} [{ref}]"
    if how == RANK0:  # epochs.parquet is rank 0's row: rank 0 exactly; the others' own rows are not recorded
        if not expected:
            return [] if not got else [f"{where}: series {sorted(got)} where the records have no such figure"]
        if ("0",) not in got:
            return [f"{where}: no series of rank 0 in {sorted(got)} (records: {expected[('0',)]})"]
        problems = (
            []
            if math.isclose(got[("0",)], expected[("0",)], rel_tol=1e-6)
            else [f"{where}: rank 0 {got[('0',)]} != records {expected[('0',)]}"]
        )
        return problems + [f"{where}: rank {k[0]}: {v}" for k, v in got.items() if not v > 0]
    if set(got) != set(expected):
        return [f"{where}: series {sorted(got)} != expected {sorted(expected)}"]
    problems = []
    for key, want in expected.items():
        value = got[key]
        if how == PRESENT:
            ok = value >= 0
        elif how == EXACT:
            ok = math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-9)
        else:  # QUANTILE
            ok = math.isclose(value, want, rel_tol=0.05, abs_tol=1e-9)
        if not ok:
            problems.append(f"{where} {key}: Prometheus {value:.6g}, records {want:.6g} ({how})")
    return problems


def test_install_puts_it_beside_rays_train_dashboard_in_a_heads_session(ray_connected, monkeypatch):
    monkeypatch.delenv(dashboard.DASHBOARD_OUTPUT_DIR_ENV, raising=False)
    session = _session_dir()
    target = dashboard.install(session)
    try:
        assert (target.parent / "train_grafana_dashboard.json").is_file(), "beside Ray's own Train Dashboard"
        provider = (session / "metrics" / "grafana" / "provisioning" / "dashboards" / "default.yml").read_text()
        assert f"path: {target.parent}" in provider, provider  # the folder Ray's Grafana provisioning reads
    finally:
        target.unlink()


PROMETHEUS_MISSING = prometheus_capability()
EXPORTED = 2  # epochs every rank has exported while the run is held (in epoch EXPORTED + 1's evaluation)
LIVE = (
    "ray_scaling_epoch",
    "ray_scaling_step_seconds",
    "ray_scaling_exposed_comm_seconds",
    "ray_scaling_waiting_seconds",
    "ray_scaling_throughput_samples_per_second",
)
RANKS = ("0", "1")


def _scrape(url: str, name: str) -> dict:
    """{(metric, rank): value} of the run's untagged gauges in LIVE, as Ray's metrics endpoint serves them now."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    seen = {}
    for line in text.splitlines():
        match = re.match(r"(ray_scaling_\w+)\{(.*)\} (\S+)$", line)
        if match and match.group(1) in LIVE and f'run="{name}"' in match.group(2):
            rank = re.search(rf'{RANK}="(\d+)"', match.group(2)).group(1)
            seen[(match.group(1), rank)] = float(match.group(3))
    return seen


@pytest.fixture(scope="module")
def held_run(ray_connected, tmp_path_factory):
    """One real 2-worker Ray Train run for both live checks (one Ray Train start, tens of seconds here,
    instead of two): held in epoch 3's evaluation until the head's metrics endpoint, scraped directly,
    serves every rank's gauges of epoch 2 (`scraped`) and then, where a Prometheus server is installed,
    until Prometheus has them too and every panel's query is answered (`answers`)."""
    import ray

    from scaling.config import load_config
    from scaling.launch.run import execute_run

    name = f"dash-{uuid.uuid4().hex[:8]}"
    tmp_path = tmp_path_factory.mktemp("dashboard")
    run_dir = tmp_path / "run"
    # 32 steps per rank and epoch (27 after the 5 warm-up steps); 3 epochs, held in the third's evaluation
    cfg = load_config(
        REPO / "experiments" / "quickstart.yaml",
        num_workers=2,
        overrides=[
            f"name={name}",
            "model.name=tests.held_model:held_small_cnn",
            "data.train_samples=2048",
            "data.val_samples=256",
            "train.per_worker_batch=32",
            "train.max_epochs=3",
            "train.target_accuracy=1.0",
            "instrument.calibration_pairs=4",
            "train.eval_every=1",
        ],
    )
    gate = hold(run_dir, after_evaluations=EXPORTED + 1)
    head = [n for n in ray.nodes() if n["Alive"]][0]
    url = f"http://127.0.0.1:{int(head['MetricsExportPort'])}/metrics"
    prometheus = None
    if PROMETHEUS_MISSING is None:
        work = tmp_path / "prometheus"
        work.mkdir()
        prometheus = Prometheus(_session_dir(), work)
    board = dashboard.load()
    scraped, answers, failure, when = {}, {}, [], {}
    stop = threading.Event()

    def evaluate_when_held():  # the run owns the main thread: Ray Train sets signal handlers
        try:
            # Ray's own endpoint first: every rank's gauges, once both say they are of epoch 2
            start = time.monotonic()
            while not stop.is_set() and time.monotonic() < start + DEADLINE_S:
                seen = _scrape(url, name)
                if all(seen.get(("ray_scaling_epoch", rank)) == EXPORTED for rank in RANKS):
                    scraped.update(seen)
                    break
                stop.wait(0.5)
            when.update(scraped_after_s=time.monotonic() - start)
            if prometheus is None:
                return
            prometheus.wait_ready()
            start = time.monotonic()
            selector = f'ray_scaling_epoch{{run="{name}"}}'
            while not stop.is_set() and time.monotonic() < start + DEADLINE_S:
                result = prometheus.query(selector)
                epochs = _by_series(result)
                run_id = result[0]["metric"].get("ray_train_run_id", "") if result else ""
                blocked = run_id and prometheus.query(
                    f'ray_train_report_total_blocked_time_s{{ray_train_run_id="{run_id}"}}'
                )
                if len(epochs) == 2 and all(v >= EXPORTED for v in epochs.values()) and len(blocked or []) == 2:
                    break
                stop.wait(0.5)
            at = time.time()
            when.update(after_s=time.monotonic() - start, epochs=epochs)
            variables = variable_queries(board)
            runs = prometheus.label_values(variables["run"], at)
            ranks = prometheus.label_values(substitute(variables["rank"], {"run": name}), at)
            run_ids = prometheus.label_values(substitute(variables["run_id"], {"run": name}), at)
            answers["variables"] = (runs, ranks, run_ids)
            values = {"run": name, "rank": "(" + "|".join(sorted(ranks)) + ")", "run_id": "|".join(sorted(run_ids))}
            for title, ref, expr in panel_queries(board):
                answers[(title, ref)] = (expr, prometheus.query(substitute(expr, values), at=at))
        except Exception as exc:  # noqa: BLE001 - reported by the tests
            failure.append(exc)
        finally:
            release(gate)  # answered (or given up on): let the run finish

    evaluator = threading.Thread(target=evaluate_when_held, daemon=True)
    evaluator.start()
    try:
        summary = execute_run(cfg, run_dir, launcher="ray")
    finally:
        stop.set()
        evaluator.join(timeout=60)
        release(gate)
        if prometheus is not None:
            prometheus.stop()
    print(
        f"Ray's endpoint had epoch {EXPORTED} of both ranks {when.get('scraped_after_s', math.nan):.1f} s after the "
        f"run started; Prometheus {when.get('after_s', math.nan):.1f} s after it was ready"
    )
    return {
        "name": name,
        "run_dir": run_dir,
        "summary": summary,
        "scraped": scraped,
        "answers": answers,
        "failure": failure,
    }


@pytest.mark.slow
def test_each_worker_exports_its_figures_to_rays_prometheus_endpoint(held_run):
    """Ray's own metrics endpoint on the head (no Prometheus server needed) serves each rank's step time,
    exposed communication, waiting and throughput of the last finished epoch, tagged with the run's name
    and Ray Train's world rank, and each is the records' figure (the same arithmetic: 1e-6; throughput
    comes from the epoch's row, which epochs.parquet keeps of rank 0 only)."""
    assert held_run["summary"]["status"] == "max_epochs", held_run["summary"]["error"]
    assert not held_run["failure"], held_run["failure"]
    scraped = held_run["scraped"]
    assert {(metric, rank) for metric in LIVE for rank in RANKS} <= set(scraped), sorted(scraped)
    records = Records(held_run["run_dir"], EXPORTED)
    for metric, column in (
        ("ray_scaling_step_seconds", "step_s"),
        ("ray_scaling_exposed_comm_seconds", "exposed_comm_s"),
        ("ray_scaling_waiting_seconds", "waiting_s"),
    ):
        for (rank,), want in records.mean(column).items():
            assert math.isclose(scraped[(metric, rank)], want, rel_tol=1e-6, abs_tol=1e-9), (
                metric,
                rank,
                scraped[(metric, rank)],
                want,
            )
    throughput = records.rank0_figure("scaling_throughput_samples_per_second")[("0",)]
    assert math.isclose(scraped[("ray_scaling_throughput_samples_per_second", "0")], throughput, rel_tol=1e-6)
    assert scraped[("ray_scaling_throughput_samples_per_second", "1")] > 0


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS_MISSING is not None, reason=str(PROMETHEUS_MISSING))
def test_every_panel_answers_with_the_runs_records(held_run):
    run_dir, summary, answers, failure = (
        held_run["run_dir"],
        held_run["summary"],
        dict(held_run["answers"]),
        held_run["failure"],
    )
    name, exported = held_run["name"], EXPORTED
    assert summary["status"] == "max_epochs", summary["error"]
    assert not failure, failure
    runs, ranks, run_ids = answers.pop("variables")
    assert name in runs and ranks == {"0", "1"} and len(run_ids) == 1, (runs, ranks, run_ids)

    records = Records(run_dir, exported)
    expected = _expected(records)
    assert set(expected) == set(answers), (
        "a panel without a check, or a check without a panel",
        set(expected) ^ set(answers),
    )
    problems = []
    for key, (expr, result) in answers.items():
        how, want = expected[key]
        problems += _compare(*key, how, want, _by_series(result))
    assert not problems, "\n".join(problems)
    absent = [f"{title} [{ref}]" for (title, ref), (_, want) in expected.items() if not want]
    print(
        f"{len(answers)} panel queries agree with the records; without series, as the records have no such "
        f"figure: {', '.join(absent) or 'none'}"
    )
    # the histogram's p50 is interpolated inside buckets 2^(1/4) apart: within one bucket of the exact median
    exact = records.per_rank(records.steady, lambda f: float(f["step_s"].median()))
    got = _by_series(answers[("Step time p50 and p99 per rank (run so far)", "A")][1])
    for key, value in exact.items():
        assert abs(got[key] / value - 1) <= 2**0.25 - 1, (key, got[key], value)
    print(
        "step time p50 per rank, Prometheus vs the records' exact median: "
        + ", ".join(f"rank {k[0]} {got[k] * 1e3:.2f} ms vs {v * 1e3:.2f} ms" for k, v in exact.items())
    )
