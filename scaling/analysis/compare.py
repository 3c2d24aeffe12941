"""Two runs, or two sweeps, compared figure by figure: each headline figure's change with its 95%
interval and a verdict (`scaling compare A B`). Pure numpy/pandas: observations in, a table out.

What is compared, and the observations each figure's interval is resampled from:

- **two runs**: `step_s` (steady training steps, the mean over ranks per step, cut in time order
  into `BLOCKS` consecutive blocks whose means are the observations: the batch-means method, since
  neighbouring steps are correlated and a per-step interval would be too narrow); the shares
  `exposed_comm_pct` and `allreduce_pct` (the same blocks of the steps whose collectives were
  timed, each block's share over its own steps, as run_metrics defines a share);
  `throughput_samples_per_s` and `time_per_epoch_s` (one observation per epoch after the first:
  the run's figure is their median). Figures a run measures once (`tta_s`, `comm_overhead_pct`,
  `mfu`) are shown with no interval.
- **two sweeps**: per worker count in both, each figure over the point's finished runs (the
  observations are the runs' summaries: the median over runs, TTA the mean over the runs that
  reached the target, as the report's tables take them).

The interval of a change is a percentile bootstrap (as scaling/analysis/intervals.py's): each
side's observations resampled with replacement `RESAMPLES` times with a fixed seed, the figure
recomputed on each, B's minus A's, relative to A's. Verdict: "within noise" where the interval
holds 0, else "better" or "worse" by the figure's direction (`DIRECTION`; "higher" or "lower" for a
share of the step, which falls when compute grows), "no interval" with fewer than 2 observations
on a side. Every figure counts: `worse_beyond_noise` says whether any
got worse beyond the noise, the exit status a CI job gates on.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scaling.analysis.intervals import CONFIDENCE, RESAMPLES, SEED

# figure -> +1 higher is better, -1 lower is better, 0 neither: a share of the step falls when the
# step's compute grows, so a smaller share is no gain by itself (its verdict says "higher" or "lower")
DIRECTION = {
    "step_s": -1,
    "throughput_samples_per_s": +1,
    "time_per_epoch_s": -1,
    "exposed_comm_pct": 0,
    "allreduce_pct": 0,
    "comm_overhead_pct": 0,
    "tta_s": -1,
    "mfu": +1,
}
BLOCKS = 8  # batch means of a run's steps (fewer where the run has fewer than 5 steps a block)
MIN_BLOCK_STEPS = 5


def time_blocks(frame: pd.DataFrame) -> list[pd.DataFrame]:
    n = min(BLOCKS, len(frame) // MIN_BLOCK_STEPS)
    if n < 2:
        return [frame] if len(frame) else []
    return [frame.iloc[rows] for rows in np.array_split(np.arange(len(frame)), n) if len(rows)]


def run_observations(steps: pd.DataFrame, epochs: pd.DataFrame) -> dict[str, tuple[np.ndarray, str]]:
    """figure -> (observations, statistic over them: "mean" or "median") of one run (module docstring)."""
    out: dict[str, tuple[np.ndarray, str]] = {}
    train = steps[(steps["kind"] == "train") & ~steps["warmup"].astype(bool)] if not steps.empty else steps
    if not train.empty:
        per_step = train.groupby(["epoch", "step"], sort=True).mean(numeric_only=True).reset_index()
        out["step_s"] = (np.array([b["step_s"].mean() for b in time_blocks(per_step)]), "mean")
        for share, column in (("exposed_comm_pct", "exposed_comm_s"), ("allreduce_pct", "allreduce_s")):
            if column not in per_step.columns:
                continue
            timed = per_step[per_step[column].notna()]
            values = [100 * b[column].sum() / b["step_s"].sum() for b in time_blocks(timed) if b["step_s"].sum() > 0]
            if values:
                out[share] = (np.array(values), "mean")
    later = epochs.iloc[1:] if len(epochs) > 1 else epochs
    if not later.empty and "train_s" in later.columns:
        out["time_per_epoch_s"] = (later["train_s"].to_numpy(dtype=float), "median")
        out["throughput_samples_per_s"] = ((later["samples"] / later["train_s"]).to_numpy(dtype=float), "median")
    return out


def _statistic(values: np.ndarray, name: str) -> float:
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan
    return float(np.median(values) if name == "median" else np.mean(values))


def change(a: np.ndarray, b: np.ndarray, statistic: str, direction: int) -> dict:
    """B against A: both figures, the relative change (%), its bootstrap interval and the verdict."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    fa, fb = _statistic(a, statistic), _statistic(b, statistic)
    row = {"a": fa, "b": fb, "change_pct": math.nan, "change_lo_pct": math.nan, "change_hi_pct": math.nan}
    if not (math.isfinite(fa) and math.isfinite(fb)) or fa == 0:
        row["verdict"] = "no interval"
        return row
    row["change_pct"] = 100 * (fb - fa) / abs(fa)
    if len(a) < 2 or len(b) < 2:
        row["verdict"] = "no interval"
        return row
    rng = np.random.default_rng(SEED)
    reduce = np.median if statistic == "median" else np.mean
    sa = reduce(a[rng.integers(0, len(a), (RESAMPLES, len(a)))], axis=1)
    sb = reduce(b[rng.integers(0, len(b), (RESAMPLES, len(b)))], axis=1)
    changes = 100 * (sb - sa) / np.abs(sa)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(changes, [tail, 100 - tail])
    row["change_lo_pct"], row["change_hi_pct"] = float(lo), float(hi)
    if lo <= 0 <= hi:
        row["verdict"] = "within noise"
    elif direction == 0:
        row["verdict"] = "lower" if hi < 0 else "higher"
    else:
        row["verdict"] = "better" if (hi < 0) == (direction < 0) else "worse"
    return row


def compare_runs(a: dict, b: dict) -> pd.DataFrame:
    """Two runs: `a`, `b` each {"summary": summary.json, "observations": run_observations(...)}."""
    rows = []
    for figure, direction in DIRECTION.items():
        if figure in a["observations"] and figure in b["observations"]:
            (va, statistic), (vb, _) = a["observations"][figure], b["observations"][figure]
        else:  # measured once per run: the summaries' figures, no interval
            va, vb, statistic = [a["summary"].get(figure)], [b["summary"].get(figure)], "mean"
            if va[0] is None or vb[0] is None:
                continue
        rows.append({"point": "", "figure": figure, **change(va, vb, statistic, direction)})
    return pd.DataFrame(rows)


def compare_sweeps(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two sweeps' run tables (runs.parquet rows): per worker count in both, over their finished runs."""
    rows = []
    finished = {side: runs[runs["status"] != "failed"] for side, runs in (("a", a), ("b", b))}
    counts = sorted(set(finished["a"]["num_workers"].dropna()) & set(finished["b"]["num_workers"].dropna()))
    for count in counts:
        at = {side: runs[runs["num_workers"] == count] for side, runs in finished.items()}
        for figure, direction in DIRECTION.items():
            if figure not in at["a"].columns or figure not in at["b"].columns:
                continue
            values = {side: pd.to_numeric(runs[figure], errors="coerce").to_numpy() for side, runs in at.items()}
            if all(np.isnan(v).all() for v in values.values()):
                continue
            statistic = "mean" if figure == "tta_s" else "median"
            rows.append(
                {
                    "point": f"{int(count)} workers",
                    "figure": figure,
                    **change(values["a"], values["b"], statistic, direction),
                }
            )
    return pd.DataFrame(rows)


def worse_beyond_noise(table: pd.DataFrame) -> bool:
    return bool((table["verdict"] == "worse").any()) if not table.empty else False
