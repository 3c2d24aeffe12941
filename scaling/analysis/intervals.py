"""95% intervals over repeats for a sweep's derived figures, the "within noise" call, and the
repeats a claim needs. Pure numpy/pandas: runs in, tables out.

Method (stated once, here): a **percentile bootstrap over runs**. For a series (the groups
that share every group key but `num_workers`), the runs of the base group (the smallest
worker count, as in `scaling_tables.add_speedup`) and of the group at N workers are each
resampled with replacement, `RESAMPLES` times with a fixed seed (so a report is
reproducible), and every figure is recomputed on each resample with the very statistic the
tables use: the median over runs for time per epoch, throughput and the communication
overheads, the mean over the runs that reached the target for TTA. The interval is the
2.5th to 97.5th percentile of the resampled figure. Runs are resampled as wholes, so a
figure that combines two measurements of the same runs (the throughput-vs-TTA gap) keeps
their correlation.

- Speedup (time per epoch, throughput, TTA) and efficiency (= speedup / (N / base)) get
  `<figure>_lo` / `<figure>_hi` columns.
- `gap_tta_vs_throughput` = speedup_tta / speedup_throughput: below 1, TTA scales worse than
  throughput (larger global batches need more epochs, the effect the lab exists to show).
- `comm_overhead_pct` and `exposed_comm_pct` of each group (medians over its runs).
- A group with fewer than `MIN_REPEATS` runs gets no interval (NaN): one run has no spread
  to resample, and the figure is then printed as "1 repeat: no interval". With 2 or 3
  runs the percentile bootstrap is narrower than the true 95% (it cannot go beyond the
  observed range): `repeats_needed` says how many would make the claim.
- Verdicts (`verdict_<figure>`): "within noise" where the interval includes the comparison
  (a speedup or a gap of 1.0, an overhead of 0), else "above" / "below" it; "no interval"
  where there is none. The report says "within noise" instead of drawing a conclusion.
- `repeats_needed_<figure>`: repeats per worker count that would bring the interval to
  ±`width` (relative, default 5%) of the figure, assuming the half-width falls as 1/sqrt(n)
  from the n measured: ceil(n x (half-width / (width x figure))^2), at least n.

`group_interval` gives the same for one group's own figure (its median throughput, its mean
TTA), which `scaling sweep --repeats auto` uses to decide whether a point needs another repeat.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scaling.analysis.scaling_tables import in_fixed_count_figures

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
MIN_REPEATS = 2
DEFAULT_WIDTH = 0.05  # ±5%, relative

SPEEDUPS = ("time_per_epoch", "throughput", "tta")
# figure -> the value that means "no effect"
COMPARISONS = {
    **{f"speedup_{m}": 1.0 for m in SPEEDUPS},
    "gap_tta_vs_throughput": 1.0,
    "comm_overhead_pct": 0.0,
    "exposed_comm_pct": 0.0,
}


def _values(runs: pd.DataFrame, column: str) -> np.ndarray:
    if column not in runs.columns:
        return np.full(len(runs), np.nan)
    return pd.to_numeric(runs[column], errors="coerce").astype(float).to_numpy()


def _resample(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    return values[indices]  # (RESAMPLES, n)


def _nan_reduce(samples: np.ndarray, reduce) -> np.ndarray:
    """`reduce` (np.nanmedian, np.nanmean) of each resample's row; NaN where a row has no finite value."""
    with np.errstate(all="ignore"):
        out = np.full(samples.shape[0], np.nan)
        finite = np.isfinite(samples).any(axis=1)
        out[finite] = reduce(samples[finite], axis=1)
        return out


def _nanmedian(samples: np.ndarray) -> np.ndarray:
    return _nan_reduce(samples, np.nanmedian)


def _nanmean(samples: np.ndarray) -> np.ndarray:
    return _nan_reduce(samples, np.nanmean)


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    """The central CONFIDENCE interval of the finite resampled values; NaN if most are undefined."""
    finite = samples[np.isfinite(samples)]
    if len(finite) < len(samples) / 2:
        return math.nan, math.nan
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


def _group_statistics(runs: pd.DataFrame, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Each group figure on every resample of `runs` (rows picked by `indices`)."""
    tta = _resample(_values(runs, "tta_s"), indices)
    return {
        "time_per_epoch_s": _nanmedian(_resample(_values(runs, "time_per_epoch_s"), indices)),
        "throughput_samples_per_s": _nanmedian(_resample(_values(runs, "throughput_samples_per_s"), indices)),
        "tta_mean_s": _nanmean(tta),
        "comm_overhead_pct": _nanmedian(_resample(_values(runs, "comm_overhead_pct"), indices)),
        "exposed_comm_pct": _nanmedian(_resample(_values(runs, "exposed_comm_pct"), indices)),
    }


def _indices(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, n, size=(RESAMPLES, n))


def verdict(lo: float, hi: float, comparison: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval"
    if lo <= comparison <= hi:
        return "within noise"
    return "above" if lo > comparison else "below"


def repeats_needed(estimate: float, lo: float, hi: float, n: int, width: float = DEFAULT_WIDTH) -> float:
    """Repeats per group for a ±`width` (relative) interval, from the half-width measured with n."""
    if not all(math.isfinite(v) for v in (estimate, lo, hi)) or estimate == 0 or n < MIN_REPEATS:
        return math.nan
    half = (hi - lo) / 2
    return float(max(n, math.ceil(n * (half / (width * abs(estimate))) ** 2)))


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[in_fixed_count_figures(runs)] if "status" in runs.columns else runs


def scaling_intervals(runs: pd.DataFrame, table: pd.DataFrame, width: float = DEFAULT_WIDTH) -> pd.DataFrame:
    """Intervals, verdicts and repeats needed per group of a `per_worker_count` table (module docstring).

    `runs` is the run table the `table` was made from (the same group keys); one row out per
    row of `table`, with the group keys, `n_ok`, and for each figure in COMPARISONS (plus the
    efficiencies): the estimate, `_lo`, `_hi`, `verdict_` and `repeats_needed_` columns.
    """
    keys = list(table.attrs.get("group_by", ("num_workers",)))
    others = [k for k in keys if k != "num_workers"]
    ok = _ok(runs)
    rng = np.random.default_rng(SEED)
    rows = []
    for _, row in table.iterrows():
        match = np.ones(len(ok), dtype=bool)
        for key in keys:
            match &= (ok[key] == row[key]).to_numpy() if pd.notna(row[key]) else ok[key].isna().to_numpy()
        group = ok[match]
        base_match = np.ones(len(ok), dtype=bool)
        for key in others:
            base_match &= (ok[key] == row[key]).to_numpy() if pd.notna(row[key]) else ok[key].isna().to_numpy()
        base_workers = row.get("base_workers")
        base = (
            ok[base_match & (ok["num_workers"] == base_workers).to_numpy()] if pd.notna(base_workers) else ok.iloc[0:0]
        )
        out = {k: row[k] for k in keys}
        out["n_ok"] = len(group)
        out["base_workers"] = base_workers
        out["gap_tta_model"] = row.get("gap_tta_model", math.nan)  # the noise-scale model's (scaling_tables)
        n_min = min(len(group), len(base)) if len(base) else len(group)
        if len(group) >= MIN_REPEATS:
            g = _group_statistics(group, _indices(len(group), rng))
        else:
            g = None
        if len(group) >= MIN_REPEATS and len(base) >= MIN_REPEATS:
            b = _group_statistics(base, _indices(len(base), rng))
        else:
            b = None
        scale = row["num_workers"] / base_workers if pd.notna(base_workers) else math.nan
        resampled = {}
        if g is not None and b is not None:
            with np.errstate(all="ignore"):
                resampled["speedup_time_per_epoch"] = b["time_per_epoch_s"] / g["time_per_epoch_s"]
                resampled["speedup_throughput"] = g["throughput_samples_per_s"] / b["throughput_samples_per_s"]
                resampled["speedup_tta"] = b["tta_mean_s"] / g["tta_mean_s"]
                resampled["gap_tta_vs_throughput"] = resampled["speedup_tta"] / resampled["speedup_throughput"]
        if g is not None:
            resampled["comm_overhead_pct"] = g["comm_overhead_pct"]
            resampled["exposed_comm_pct"] = g["exposed_comm_pct"]
        estimates = {
            **{f"speedup_{m}": row.get(f"speedup_{m}", math.nan) for m in SPEEDUPS},
            "gap_tta_vs_throughput": (
                row.get("speedup_tta", math.nan) / row.get("speedup_throughput", math.nan)
                if row.get("speedup_throughput")
                else math.nan
            ),
            "comm_overhead_pct": row.get("comm_overhead_pct", math.nan),
            "exposed_comm_pct": row.get("exposed_comm_pct", math.nan),
        }
        for figure, comparison in COMPARISONS.items():
            estimate = float(estimates[figure]) if pd.notna(estimates[figure]) else math.nan
            lo, hi = _percentiles(resampled[figure]) if figure in resampled else (math.nan, math.nan)
            if figure.startswith("speedup_") and row["num_workers"] == base_workers:
                lo = hi = math.nan  # the base itself: 1.0 by definition
            out[figure], out[f"{figure}_lo"], out[f"{figure}_hi"] = estimate, lo, hi
            out[f"verdict_{figure}"] = verdict(lo, hi, comparison)
            n = n_min if figure.startswith(("speedup_", "gap_")) else len(group)
            out[f"repeats_needed_{figure}"] = repeats_needed(estimate, lo, hi, n, width)
            if figure.startswith("speedup_"):
                metric = figure.removeprefix("speedup_")
                out[f"efficiency_{metric}"] = estimate / scale if math.isfinite(scale) else math.nan
                out[f"efficiency_{metric}_lo"] = lo / scale if math.isfinite(scale) else math.nan
                out[f"efficiency_{metric}_hi"] = hi / scale if math.isfinite(scale) else math.nan
        rows.append(out)
    result = pd.DataFrame(rows)
    result.attrs["group_by"] = tuple(keys)
    result.attrs["width"] = width
    return result


def group_interval(runs: pd.DataFrame, statistic: str = "throughput_samples_per_s") -> tuple[float, float, float, int]:
    """(estimate, lo, hi, n) of one group's own figure over its non-failed runs (module docstring)."""
    ok = _ok(runs)
    n = len(ok)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    full = _group_statistics(ok, np.arange(n)[None, :])[statistic][0]
    if n < MIN_REPEATS:
        return float(full), math.nan, math.nan, n
    lo, hi = _percentiles(_group_statistics(ok, _indices(n, np.random.default_rng(SEED)))[statistic])
    return float(full), lo, hi, n


def median_interval(values) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of `values` (e.g. a benchmark's pair ratios); NaN below 2."""
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(values) < MIN_REPEATS:
        return math.nan, math.nan
    return _percentiles(_nanmedian(values[_indices(len(values), np.random.default_rng(SEED))]))


def format_interval(estimate: float, lo: float, hi: float, spec: str = ".2f", suffix: str = "") -> str:
    """'1.53× [1.41, 1.66]'; '1.53× (1 repeat: no interval)' where there is none; '-' with no estimate."""
    if estimate is None or not math.isfinite(estimate):
        return "-"
    text = f"{estimate:{spec}}{suffix}"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return text + " (no interval)"
    return f"{text} [{lo:{spec}}, {hi:{spec}}]"
