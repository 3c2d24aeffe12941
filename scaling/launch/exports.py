"""Per-run exports in the formats the field's leaderboards used.

- `dawnbench.tsv` + `dawnbench.json`: DAWNBench's entry format: one row per epoch with
  `epoch, hours, top1Accuracy` (accuracy in percent, `hours` = cumulative *training* time,
  the lab's TTA definition: evaluation and calibration excluded), and a JSON description.
- `mlperf.log`: an MLPerf-style log written through the `mlperf-logging` package's `mllog`
  (`:::MLLOG {...}` lines), marked open division, status research. No compliance is claimed:
  the lab's workloads and rules are not MLPerf's.

Written when the run finishes, from its records (summary.json, epochs.parquet), atomically
(scaling/launch/finish.py).
"""

from __future__ import annotations

import datetime as dt
import io
import logging
from pathlib import Path

import pandas as pd

from scaling.results import DAWNBENCH_JSON, DAWNBENCH_TSV, MLPERF_LOG, write_json_atomic, write_text_atomic


def dawnbench_tsv(epochs: pd.DataFrame) -> str:
    """epoch, hours, top1Accuracy[, top5Accuracy] (in %), as DAWNBench entries list them."""
    # Runs recorded before top-1/top-5 were split hold only val_accuracy (top-1 then).
    top1 = epochs["val_top1"] if "val_top1" in epochs else epochs["val_accuracy"]
    top5 = epochs["val_top5"] if "val_top5" in epochs and epochs["val_top5"].notna().any() else None
    lines = ["epoch\thours\ttop1Accuracy" + ("\ttop5Accuracy" if top5 is not None else "")]
    for i, row in enumerate(epochs.itertuples()):
        line = f"{row.epoch}\t{row.elapsed_train_s / 3600:.6f}\t{100 * top1.iloc[i]:.2f}"
        if top5 is not None:
            line += f"\t{100 * top5.iloc[i]:.2f}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def dawnbench_json(summary: dict) -> dict:
    nodes = summary.get("num_nodes") or 1
    price = summary.get("node_price_per_hour") or 0.0
    hardware = summary["hardware"]
    device = (
        f"{hardware['gpu_count']} x {hardware['gpu_name']}"
        if hardware.get("gpu_count")
        else f"{hardware['cpu_model']} ({hardware['cpu_count']} CPUs)"
    )
    return {
        "version": "v1.0",
        "author": "scaling lab",
        "framework": f"PyTorch {summary['versions']['torch']} + Ray {summary['versions']['ray']} "
        f"({summary['backend']})",
        "codeURL": "",
        "model": summary["model"],
        "dataset": summary["dataset"],
        "hardware": f"{summary['num_workers']} workers on {nodes} node(s); {device}",
        "costPerHour": price * nodes if price else None,
        "timestamp": summary["started_at"],
        "misc": {
            "targetAccuracy": summary["target_accuracy"],
            # DAWNBench's rule: training time to the end of the first epoch at the target
            "ttaHours": summary["tta_epoch_end_s"] / 3600 if summary.get("tta_epoch_end_s") is not None else None,
            "globalBatch": summary["global_batch"],
            "status": summary["status"],
            "note": "hours = training time to the end of the first epoch at the target (evaluation and calibration "
            "excluded)",
        },
    }


def mlperf_log(summary: dict, epochs: pd.DataFrame) -> str:
    from mlperf_logging.mllog import constants, mllog

    buffer = io.StringIO()
    logger = logging.getLogger(f"scaling.mlperf.{summary['run_id']}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(buffer)
    logger.addHandler(handler)
    try:
        log = mllog.MLLogger(logger=logger)
        start_ms = dt.datetime.fromisoformat(summary["started_at"]).timestamp() * 1000
        log.event(constants.SUBMISSION_DIVISION, constants.OPEN, time_ms=start_ms)
        log.event(constants.SUBMISSION_STATUS, "research", time_ms=start_ms)
        log.event(constants.SUBMISSION_BENCHMARK, summary["model"], time_ms=start_ms)
        log.event(constants.GLOBAL_BATCH_SIZE, summary["global_batch"], time_ms=start_ms)
        log.event(constants.SEED, summary["seed"], time_ms=start_ms)
        log.event(constants.OPT_NAME, "sgd", time_ms=start_ms)
        log.start(constants.RUN_START, time_ms=start_ms)
        previous_ms = start_ms
        for row in epochs.itertuples():
            end_ms = start_ms + 1000 * row.elapsed_wall_s
            log.start(constants.EPOCH_START, metadata={"epoch_num": int(row.epoch)}, time_ms=previous_ms)
            log.end(constants.EPOCH_STOP, metadata={"epoch_num": int(row.epoch)}, time_ms=end_ms)
            log.event(
                constants.EVAL_ACCURACY, float(row.val_accuracy), metadata={"epoch_num": int(row.epoch)}, time_ms=end_ms
            )
            previous_ms = end_ms
        status = constants.SUCCESS if summary["status"] == "reached_target" else constants.ABORTED
        log.end(constants.RUN_STOP, metadata={"status": status}, time_ms=previous_ms)
    finally:
        logger.removeHandler(handler)
    return buffer.getvalue()


def write_exports(run_dir: Path, summary: dict, epochs: pd.DataFrame) -> None:
    run_dir = Path(run_dir)
    write_text_atomic(run_dir / DAWNBENCH_TSV, dawnbench_tsv(epochs))
    write_json_atomic(run_dir / DAWNBENCH_JSON, dawnbench_json(summary))
    write_text_atomic(run_dir / MLPERF_LOG, mlperf_log(summary, epochs))
