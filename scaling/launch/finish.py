"""Finishing a run: from the records its ranks wrote, the run's summary, trace and exports.

    summary = write_summary(run_dir, description, status=None, error=None, started_at=..., wall_s=...)

Whoever runs the job calls it once every rank has stopped: the lab's launchers
(scaling/launch/run.py), or the instrument's `finish()` for a job on its own, which is handed
this function. It reads the run directory through `scaling.results.RunDir` and writes:

- summary.json: what the run was (`description`) and its figures, computed from the records
  by `scaling.analysis.run_metrics.summarize_run` (every figure is defined there), the clock
  alignment's worst uncertainty, the machine and the software versions;
- ranks.parquet: per rank, who waits for whom;
- trace.json: the ranks' sampled steps merged into one Chrome trace (scaling/instrument/trace.py);
- dawnbench.tsv, dawnbench.json, mlperf.log (scaling/launch/exports.py), when an epoch finished.
"""

from __future__ import annotations

from pathlib import Path

from scaling.analysis.run_metrics import NO_STEP, run_costs, summarize_run
from scaling.schema import STEP_COLUMNS
from scaling.launch.machine import describe_hardware, describe_versions
from scaling.instrument.trace import merge_trace
from scaling.launch.exports import write_exports
from scaling.results import RANKS_PARQUET, SCHEMA_VERSION, TRACE_JSON, RunDir, write_json_atomic, write_parquet_atomic


def write_summary(
    run_dir: Path, description: dict, *, status: str | None, error: str | None, started_at, wall_s: float
) -> dict:
    """Merge the run's trace, compute its figures and write summary.json (and the exports); returns the summary.

    `description` says what the run was (the lab's: scaling.launch.run.run_description, from
    the config; a job on its own: the instrument's). `status` None: reached_target or
    max_epochs, from the records. A figure nothing was observed for is null, and
    `not_measured` names it with the reason (a run that finished no epoch: every figure).
    """
    run = RunDir(run_dir)
    steps = run.step_batches(STEP_COLUMNS)  # by column, in batches: never the whole record set
    epochs = run.epochs()
    evals = run.evals()
    figures = summarize_run(
        steps,
        epochs,
        description["target_accuracy"],
        description["num_workers"],
        run.compute_profile(),
        run.attempts(),
        ab_calibration=description.get("ab_calibration", True),
        evals=evals if run.evals_path.exists() else None,
        tta_rule=description.get("tta_rule", "first_eval"),
        target_loss=description.get("target_loss"),
    )
    if status is None:
        status = "reached_target" if figures["epochs_to_target"] is not None else "max_epochs"
    if description.get("step_timing") is False:  # no step records by design: say so, not "none recorded"
        figures["not_measured"] = {
            name: "instrument.step_timing is off (epoch timing only)" if why == NO_STEP else why
            for name, why in figures["not_measured"].items()
        }
        if "comm_overhead_pct" in figures["not_measured"]:
            figures["comm_overhead_note"] = f"A/B not measured: {figures['not_measured']['comm_overhead_pct']}"
    hardware = run.machine() or describe_hardware()
    num_nodes = figures.pop("num_nodes")
    ranks = figures.pop("ranks")
    figures.update(
        run_costs(figures["tta_s"], figures["time_lost_s"], num_nodes, description.get("node_price_per_hour"))
    )
    if not ranks.empty:
        write_parquet_atomic(run.path / RANKS_PARQUET, ranks)
    uncertainty_s = max((clock["uncertainty_s"] for clock in run.rank_records("clock")), default=None)
    figures["clock_offset_uncertainty_us"] = uncertainty_s * 1e6 if uncertainty_s is not None else None
    figures["trace"] = TRACE_JSON if merge_trace(run.path) else None
    summary = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.name,
        **description,
        "num_nodes": num_nodes,
        "workers_per_node": description["num_workers"] / num_nodes if num_nodes else None,
        "status": status,
        "error": error,
        **figures,
        "started_at": started_at.isoformat(timespec="seconds"),
        "run_wall_s": wall_s,
        "versions": describe_versions(),
        "hardware": hardware,
    }
    write_json_atomic(run.summary_path, summary)
    if not epochs.empty:
        write_exports(run.path, summary, epochs)
    return summary
