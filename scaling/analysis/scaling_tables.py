"""A sweep's figures across worker counts: pure pandas, tables in, tables out.

Input is a sweep's run table (`runs.parquet`: one row per run, its summary.json flattened
with `pandas.json_normalize(sep=".")`, plus `run_key`, `run_dir`, `repeat` and one
`sweep.<dotted.key>` column per extra sweep axis) and, for the accuracy curves, the runs'
`epochs.parquet` rows concatenated with `run_id`, `num_workers` and `seed` columns.
No Ray, no torch, no files: `scaling.results.SweepDir` reads the sweep, `scaling.plots` draws.

Every figure below is defined here, once. A *group* is one combination of the group keys
(`num_workers`, plus any sweep axis that varies; see `default_group_by`, and `group_keys`, the
report's and the notebooks' rule for merged sweeps); its *repeats* are its runs with different seeds.

- Failed runs (`status == "failed"`) are counted (`n_failed`) and left out of every figure;
  so are runs whose worker count changed mid-way (`worker_count_changed`, an elastic run that
  lost a node and went on with fewer workers: `n_resized`), as they belong to no fixed-count
  point (`in_fixed_count_figures`; `left_out_of_figures` names them for the report); `n_runs` counts all
  runs, `n_ok` those in the figures. A run that never reached the target
  (`status == "max_epochs"`) counts in every figure except the TTA ones.
- `time_per_epoch_s`, `throughput_samples_per_s`, and the three communication figures
  `allreduce_pct` (time communicating: all-reduce in flight, % of step), `exposed_comm_pct`
  (exposed) and `comm_overhead_pct` (A/B): the **median** over the group's runs of the run's
  figure (defined once in scaling/analysis/run_metrics.py; docs/results.md).
- Per collective kind, where a backend has several (FSDP2): `comm_pct` (any collective in flight),
  `allgather_pct`, `regather_pct` (the backward re-gathers among them), `reducescatter_pct`,
  `exposed_allgather_pct`, `exposed_reducescatter_pct`: the median over the group's runs of the
  run's figure (run_metrics.py); NaN for DDP and Horovod, whose one kind is `allreduce_pct`; 0 by
  definition at one worker in a series that has that kind at another count.
- `peak_memory_bytes`, `peak_memory_min_bytes`: the median over the group's runs of the run's
  largest and smallest rank's peak memory (run_metrics.py `peak_memory`): what sharding saves.
- `reached_fraction` = n_reached / n_ok: the fraction of (non-failed) repeats that reached
  the target accuracy.
- `tta_mean_s`, `tta_std_s`: mean and sample standard deviation (ddof=1) of `tta_s` over the
  repeats that reached the target; `tta_cv` = tta_std_s / tta_mean_s, the coefficient of
  variation (NaN with fewer than 2 such repeats). `tta_wall_mean_s`: the same mean of `tta_wall_s`.
- `epochs_to_target`: median over the repeats that reached the target.
- `epochs_cv`, `time_per_epoch_cv`: CV (std/mean, ddof=1) of `epochs_to_target` and of
  `time_per_epoch_s` over the repeats that reached the target.
- `tta_cv_ratio` = epochs_cv / time_per_epoch_cv: where the variation of TTA comes from.
  TTA ~ epochs_to_target x time_per_epoch, so for small variations
  CV(TTA)^2 ~ CV(epochs)^2 + CV(time per epoch)^2; a ratio above 1 says the spread of TTA
  comes mostly from the number of epochs (optimisation), below 1 from the speed of the
  epochs (the machine). The ratio of CVs rather than of standard deviations, because the two
  standard deviations have different units (epochs vs seconds); NaN when either CV is
  undefined or time_per_epoch_cv is 0.
- Step breakdown, **means** over the group's runs of the run's mean step phases (seconds per
  step): `data_s`, `forward_compute_s` = forward_s - exposed_forward_comm_s (FSDP's forward
  all-gathers compute waited for; 0 for DDP and Horovod, whose exposed time is all in backward),
  `backward_compute_s` = backward_s - (exposed_comm_s - exposed_forward_comm_s),
  `exposed_comm_s`, `optimizer_s`; they add up to `step_s`. `forward_s` (the whole phase) is
  there too. At one worker exposed_comm_s is 0 by definition.
- `cost_to_accuracy_usd` = tta_s / 3600 x num_nodes x node_price_per_hour per run (DAWNBench's
  cost at the price paid, the time lost to restarts included: `run_metrics.node_cost_usd`), mean
  over the repeats that reached the target; NaN when the price is unknown (0).
- Speedup over the baseline, the smallest worker count with a non-failed run among the
  groups that share the other group keys (`base_workers`):
  `speedup_time_per_epoch` = time_per_epoch_s(base) / time_per_epoch_s(N),
  `speedup_throughput` = throughput(N) / throughput(base),
  `speedup_tta` = tta_mean_s(base) / tta_mean_s(N) (means over the repeats that reached the target).
  `efficiency_<same>` = speedup / (N / base_workers): 1.0 is linear scaling.
  `gap_tta_model`: the TTA-to-throughput speedup ratio the samples-to-target model expects from
  the global batch alone, 1 / samples_growth(B_N, B_base, B_noise) (scaling/noise_scale.py), B_noise
  the baseline's `noise_scale` (median over its runs; NaN where none was measured): a measured
  ratio below it says TTA lost more than samples-to-target growth explains.
- Utilisation, **medians** over the group's runs of the run's figure (docs/results.md):
  `mfu`, `achieved_flops_per_s` (per worker), `arithmetic_intensity`, and the device roofs
  `peak_flops_per_s` and `mem_bytes_per_s` they are taken against.
- `link_bandwidth_bits_per_s`: the minicluster link cap the group's runs ran under (median;
  NaN when uncapped). A sweep with the axis `workers.link_bandwidth` gives comm overhead
  against bandwidth (`bandwidth_series`).
- `batch_tradeoff`: per (global_batch, num_workers): epochs_to_target, throughput and TTA,
  the minibatch trade-off of DAWNBench (Coleman et al. 2017): a larger batch trains more
  samples per second but may need more epochs to reach the same accuracy.
- `accuracy_curves`: per (num_workers, epoch), mean, std (ddof=1), min, max and count of
  `val_accuracy` over the non-failed repeats. Runs stop at the target, so the count falls
  with the epoch and the later epochs hold only the slower repeats.
- `tta_spread`: one row per non-failed run with its TTA and its parts, for plotting the
  spread over repeats.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scaling.analysis.run_metrics import node_cost_usd
from scaling.noise_scale import samples_growth
from scaling.schema import KIND_FIELDS

# Columns that may join `num_workers` as group keys when present (besides `sweep.*`).
# `sweep` is the source directory of a merged report of several sweeps (`group_keys`).
EXTRA_KEYS = ("backend", "global_batch", "num_nodes", "sweep")
SPEEDUP_METRICS = ("time_per_epoch", "throughput", "tta")
# Per collective kind (scaling.schema.KIND_FIELDS as % of step): a sharded backend's all-gathers and reduce-scatters
KIND_PCTS = tuple(kind.removesuffix("_s") + "_pct" for kind in KIND_FIELDS)
_NUMERIC = (
    "noise_scale",
    "num_workers",
    "num_nodes",
    "global_batch",
    "per_worker_batch",
    "seed",
    "repeat",
    "target_accuracy",
    "epochs_run",
    "epochs_to_target",
    "tta_s",
    "tta_wall_s",
    "time_per_epoch_s",
    "throughput_samples_per_s",
    "step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "exposed_comm_s",
    "exposed_comm_pct",
    "comm_overhead_pct",
    "allreduce_s",
    "allreduce_pct",
    "node_price_per_hour",
    "mfu",
    "achieved_flops_per_s",
    "arithmetic_intensity",
    "peak_flops_per_s",
    "mem_bytes_per_s",
    "link_bandwidth_bits_per_s",
    *KIND_PCTS,
    "peak_memory_bytes",
    "peak_memory_min_bytes",
)


_INTEGER = ("num_workers", "num_nodes", "global_batch", "per_worker_batch", "seed", "repeat", "epochs_run")


def default_group_by(runs: pd.DataFrame) -> tuple[str, ...]:
    """`num_workers`, then every sweep axis and backend that takes more than one value.

    global_batch and num_nodes follow from the worker count in an ordinary sweep, so they
    are not added here; pass them explicitly to split by them.
    """
    keys = ["num_workers"]
    for column in runs.columns:
        if (column.startswith("sweep.") or column == "backend") and runs[column].nunique(dropna=True) > 1:
            keys.append(column)
    if "backend" in keys and "sweep.backend" in keys:
        keys.remove("sweep.backend")  # the axis and the summary's resolved backend name the same split
    return tuple(keys)


def group_keys(runs: pd.DataFrame) -> tuple[str, ...]:
    """The report's (and the notebooks') group keys: `default_group_by`, plus `sweep` (the source
    directory of several merged sweeps) where the other keys leave runs of different sweeps together."""
    keys = default_group_by(runs)
    if "sweep" in runs.columns and runs["sweep"].nunique() > 1:
        others = [k for k in keys if k != "num_workers"]
        mixed = runs.groupby(others, dropna=False)["sweep"].nunique().gt(1).any() if others else True
        if mixed:
            keys = (*keys, "sweep")
    return keys


def group_columns(table: pd.DataFrame) -> list[str]:
    """The group keys of an output table other than num_workers (for plotting one series each)."""
    return [c for c in table.columns if c in EXTRA_KEYS or c.startswith("sweep.")]


def prepare_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """A copy with the numeric summary fields as floats (JSON nulls become NaN)."""
    out = runs.copy()
    for column in _NUMERIC:
        if column in out.columns:
            values = pd.to_numeric(out[column], errors="coerce").astype(float)
            integral = column in _INTEGER and values.notna().all() and (values == values.round()).all()
            out[column] = values.astype(int) if integral else values
    if "status" not in out.columns:
        out["status"] = "failed"
    return out


def resized(runs: pd.DataFrame) -> pd.Series:
    """Runs whose worker count changed mid-way (run_metrics.worker_counts); False where unknown."""
    if "worker_count_changed" not in runs.columns:
        return pd.Series(False, index=runs.index)
    return runs["worker_count_changed"].map(lambda v: v is True or v == 1.0)


def in_fixed_count_figures(runs: pd.DataFrame) -> pd.Series:
    """The runs every figure is made of: not failed, and at one worker count from start to end."""
    return (runs["status"] != "failed") & ~resized(runs)


def left_out_of_figures(runs: pd.DataFrame) -> list[str]:
    """One warning per kind of run the figures leave out (`in_fixed_count_figures`), naming each:
    failed runs with their error, elastic runs with their worker counts. The report prints them
    beside the sweep reader's own warnings (`scaling.results.SweepDir.warnings`)."""
    warnings = []
    failed = runs[runs["status"] == "failed"]
    if not failed.empty:
        named = ", ".join(f"{row.run_key} ({_short_error(row)})" for row in failed.itertuples())
        warnings.append(f"failed runs, counted but left out of the figures: {named}")
    changed = runs[resized(runs) & (runs["status"] != "failed")]
    if not changed.empty:
        named = ", ".join(
            f"{row.run_key} ({row.workers_first_attempt:.0f} -> {row.workers_last_attempt:.0f} workers)"
            for row in changed.itertuples()
        )
        warnings.append(
            f"runs whose worker count changed mid-way (elastic), counted but left out of the fixed-count "
            f"figures: {named}"
        )
    return warnings


def measurement_caveats(runs: pd.DataFrame) -> list[str]:
    """One warning per kind of doubt a run's own records raise about its communication figures (each
    run's summary, scaling.analysis.run_metrics): timing its collectives slowed the steps it timed
    (`timing_perturbs_steps`), or PyTorch DDP's own timers disagree with the lab's (`ddp_disagrees`)."""
    warnings = []

    def flagged(column: str) -> pd.DataFrame:
        if column not in runs.columns:
            return runs.iloc[0:0]
        return runs[runs[column].map(lambda value: value is True or value == 1.0)]

    perturbed = flagged("timing_perturbs_steps")
    if not perturbed.empty:
        named = ", ".join(
            f"{row.run_key} (+{1e3 * row.timing_effect_s:.2f} ± {1e3 * row.timing_effect_half_width_s:.2f} ms)"
            for row in perturbed.itertuples()
        )
        warnings.append(
            "the steps whose collectives were timed are slower than the others beyond the noise, so the "
            f"communication figures describe a perturbed step: {named}"
        )
    disagree = flagged("ddp_disagrees")
    if not disagree.empty:
        named = ", ".join(f"{row.run_key} (lab / DDP {row.ddp_comm_ratio:.2f})" for row in disagree.itertuples())
        warnings.append(f"PyTorch DDP's own timers disagree with the lab's on the same steps: {named}")
    return warnings


def _short_error(row) -> str:
    error = getattr(row, "error", None)
    if not isinstance(error, str) or not error:
        return "no error recorded"
    return error if len(error) <= 100 else error[:97] + "..."


def _cv(values: pd.Series) -> float:
    values = values.dropna()
    if len(values) < 2:
        return np.nan
    mean = values.mean()
    return float(values.std(ddof=1) / mean) if mean else np.nan


def _ratio(numerator: float, denominator: float) -> float:
    if pd.isna(numerator) or pd.isna(denominator) or denominator == 0:
        return np.nan
    return float(numerator / denominator)


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame.columns else pd.Series(np.nan, index=frame.index, dtype=float)


def _cost_usd(ok: pd.DataFrame) -> pd.Series:
    return node_cost_usd(_col(ok, "tta_s"), _col(ok, "num_nodes"), _col(ok, "node_price_per_hour"))


def _allreduce_pct(ok: pd.DataFrame) -> pd.Series:
    """Each run's time communicating (% of step): its `allreduce_pct`, or from `allreduce_s` /
    `step_s` for summaries written before the field existed; 0 by definition at one worker."""
    pct = _col(ok, "allreduce_pct")
    pct = pct.where(pct.notna(), 100.0 * _col(ok, "allreduce_s") / _col(ok, "step_s"))
    return pct.where(pct.notna() | (_col(ok, "num_workers") != 1), 0.0)


def _group_figures(group: pd.DataFrame) -> dict:
    """The figures of one group of runs (all statuses; failed ones are only counted)."""
    failed = group["status"] == "failed"
    ok = group[in_fixed_count_figures(group)]
    reached = ok[ok["tta_s"].notna()] if "tta_s" in ok.columns else ok.iloc[0:0]
    exposed = _col(ok, "exposed_comm_s")
    exposed = exposed.where(exposed.notna() | (_col(ok, "num_workers") != 1), 0.0)  # 0 by definition at 1 worker
    exposed_forward = _col(ok, "exposed_forward_comm_s").fillna(0.0)  # FSDP's forward all-gathers; none for DDP
    epochs_cv = _cv(_col(reached, "epochs_to_target"))
    time_cv = _cv(_col(reached, "time_per_epoch_s"))
    out = {
        "n_runs": len(group),
        "n_failed": int(failed.sum()),
        "n_resized": int((resized(group) & ~failed).sum()),
        "n_ok": len(ok),
        "n_reached": len(reached),
        "reached_fraction": len(reached) / len(ok) if len(ok) else np.nan,
        "time_per_epoch_s": _col(ok, "time_per_epoch_s").median(),
        "throughput_samples_per_s": _col(ok, "throughput_samples_per_s").median(),
        "tta_mean_s": _col(reached, "tta_s").mean(),
        "tta_std_s": _col(reached, "tta_s").std(ddof=1) if len(reached) >= 2 else np.nan,
        "tta_cv": _cv(_col(reached, "tta_s")),
        "tta_wall_mean_s": _col(reached, "tta_wall_s").mean(),
        "epochs_to_target": _col(reached, "epochs_to_target").median(),
        "epochs_cv": epochs_cv,
        "time_per_epoch_cv": time_cv,
        "tta_cv_ratio": _ratio(epochs_cv, time_cv),
        "comm_overhead_pct": _col(ok, "comm_overhead_pct").median(),
        "exposed_comm_pct": _col(ok, "exposed_comm_pct").median(),
        "allreduce_pct": _allreduce_pct(ok).median(),
        **{pct: _col(ok, pct).median() for pct in KIND_PCTS},
        # the largest rank's peak memory (and the smallest rank's), median over the runs
        "peak_memory_bytes": _col(ok, "peak_memory_bytes").median(),
        "peak_memory_min_bytes": _col(ok, "peak_memory_min_bytes").median(),
        "step_s": _col(ok, "step_s").mean(),
        "data_s": _col(ok, "data_s").mean(),
        "forward_s": _col(ok, "forward_s").mean(),
        "forward_compute_s": (_col(ok, "forward_s") - exposed_forward).mean(),
        "backward_compute_s": (_col(ok, "backward_s") - (exposed - exposed_forward)).mean(),
        "exposed_comm_s": exposed.mean(),
        "optimizer_s": _col(ok, "optimizer_s").mean(),
        "cost_to_accuracy_usd": _cost_usd(reached).mean(),
        "mfu": _col(ok, "mfu").median(),
        "achieved_flops_per_s": _col(ok, "achieved_flops_per_s").median(),
        "arithmetic_intensity": _col(ok, "arithmetic_intensity").median(),
        "peak_flops_per_s": _col(ok, "peak_flops_per_s").median(),
        "mem_bytes_per_s": _col(ok, "mem_bytes_per_s").median(),
        # minicluster runs: each node's link cap (NaN = uncapped or not a minicluster run)
        "link_bandwidth_bits_per_s": _col(ok, "link_bandwidth_bits_per_s").median(),
        # the gradient noise scale (run_metrics.noise_scale_figures) and the global batch it was measured at
        "noise_scale": _col(ok, "noise_scale").median(),
        "global_batch_median": _col(ok, "global_batch").median(),
    }
    return {
        k: (float(v) if k not in ("n_runs", "n_failed", "n_resized", "n_ok", "n_reached") else int(v))
        for k, v in out.items()
    }


def _aggregate(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    rows = []
    for values, group in runs.groupby(keys, dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        rows.append({**dict(zip(keys, values)), **_group_figures(group)})
    columns = keys + list(_group_figures(runs.iloc[0:0]).keys())
    return pd.DataFrame(rows, columns=columns)


def per_worker_count(runs: pd.DataFrame, group_by: tuple[str, ...] | list[str] = ("num_workers",)) -> pd.DataFrame:
    """One row per group (see the module docstring), with speedups over the smallest worker count."""
    keys = list(group_by)
    if "num_workers" not in keys:
        raise ValueError("group_by must include 'num_workers'")
    missing = [k for k in keys if k not in runs.columns]
    if missing:
        raise ValueError(f"group_by columns not in the run table: {missing}")
    table = _aggregate(prepare_runs(runs), keys)
    table = _kinds_zero_at_one_worker(table, keys)
    table = add_speedup(table, keys)
    table.attrs["group_by"] = tuple(keys)
    return table


def _kinds_zero_at_one_worker(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """A collective kind's share is 0 by definition at one worker (the plain module: nothing communicated),
    said in the series that have that kind at another count (an FSDP series' all-gathers, not DDP's)."""
    table = table.copy()
    others = [k for k in keys if k != "num_workers"]
    parts = [part.index for _, part in table.groupby(others, dropna=False, sort=False)] if others else [table.index]
    for index in parts:
        one = index[(table.loc[index, "num_workers"] == 1).to_numpy()]
        for pct in KIND_PCTS:
            if table.loc[index, pct].notna().any():
                table.loc[one, pct] = table.loc[one, pct].fillna(0.0)
    return table


def add_speedup(table: pd.DataFrame, group_by: tuple[str, ...] | list[str] = ("num_workers",)) -> pd.DataFrame:
    """`base_workers`, `speedup_*` and `efficiency_*` columns (module docstring) on a per_worker_count table."""
    table = table.copy()
    others = [k for k in group_by if k != "num_workers"]
    for column in ["base_workers"] + [f"{p}_{m}" for p in ("speedup", "efficiency") for m in SPEEDUP_METRICS]:
        table[column] = np.nan
    series = [part.index for _, part in table.groupby(others, dropna=False, sort=False)] if others else [table.index]
    for index in series:
        part = table.loc[index]
        candidates = part[part["n_ok"] > 0]
        if candidates.empty:
            continue
        base = candidates.loc[candidates["num_workers"].idxmin()]
        scale = part["num_workers"] / base["num_workers"]
        speedup = {
            "time_per_epoch": base["time_per_epoch_s"] / part["time_per_epoch_s"],
            "throughput": part["throughput_samples_per_s"] / base["throughput_samples_per_s"],
            "tta": base["tta_mean_s"] / part["tta_mean_s"],
        }
        table.loc[index, "base_workers"] = base["num_workers"]
        for metric, values in speedup.items():
            table.loc[index, f"speedup_{metric}"] = values
            table.loc[index, f"efficiency_{metric}"] = values / scale
        noise, base_batch = base.get("noise_scale", np.nan), base.get("global_batch_median", np.nan)
        if noise > 0 and base_batch > 0:
            table.loc[index, "gap_tta_model"] = [
                1.0 / samples_growth(b, base_batch, noise) if b > 0 else np.nan for b in part["global_batch_median"]
            ]
    if "gap_tta_model" not in table.columns:
        table["gap_tta_model"] = np.nan
    return table


def batch_tradeoff(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (global_batch, num_workers): epochs to target, throughput and TTA; empty unless global_batch varies."""
    runs = prepare_runs(runs)
    keys = ["global_batch", "num_workers"]
    columns = keys + [
        "per_worker_batch",
        "n_runs",
        "n_failed",
        "n_resized",
        "n_ok",
        "n_reached",
        "reached_fraction",
        "epochs_to_target",
        "time_per_epoch_s",
        "throughput_samples_per_s",
        "tta_mean_s",
        "tta_std_s",
    ]
    ok = runs[in_fixed_count_figures(runs)] if "global_batch" in runs.columns else runs.iloc[0:0]
    if "global_batch" not in runs.columns or ok["global_batch"].nunique() < 2:
        return pd.DataFrame(columns=columns)
    table = _aggregate(runs, keys)
    per_worker = ok.groupby(keys)["per_worker_batch"].median() if "per_worker_batch" in ok.columns else None
    table["per_worker_batch"] = (
        [per_worker.get(tuple(k), np.nan) for k in table[keys].itertuples(index=False)]
        if per_worker is not None
        else np.nan
    )
    return table[columns].sort_values(keys, ignore_index=True)


def accuracy_curves(epochs: pd.DataFrame, group_by: tuple[str, ...] | list[str] = ("num_workers",)) -> pd.DataFrame:
    """Per (group, epoch): val_accuracy mean, std, min, max and count over the non-failed repeats."""
    keys = list(group_by) + ["epoch"]
    stats = ["val_accuracy_mean", "val_accuracy_std", "val_accuracy_min", "val_accuracy_max", "n_runs"]
    if epochs.empty or "val_accuracy" not in epochs.columns:
        return pd.DataFrame(columns=keys + stats)
    frame = epochs
    if "status" in frame.columns:
        frame = frame[frame["status"] != "failed"]
    frame = frame.assign(val_accuracy=pd.to_numeric(frame["val_accuracy"], errors="coerce").astype(float))
    frame = frame[frame["val_accuracy"].notna()]
    if frame.empty:
        return pd.DataFrame(columns=keys + stats)
    grouped = frame.groupby(keys, dropna=False, sort=True)["val_accuracy"]
    table = grouped.agg(["mean", "std", "min", "max", "count"]).reset_index()
    table.columns = keys + stats
    table["n_runs"] = table["n_runs"].astype(int)
    return table


def tta_spread(runs: pd.DataFrame, group_by: tuple[str, ...] | list[str] = ("num_workers",)) -> pd.DataFrame:
    """One row per non-failed run: group keys, repeat, seed, status, tta_s, epochs_to_target, time_per_epoch_s."""
    runs = prepare_runs(runs)
    wanted = list(group_by) + ["repeat", "seed", "run_key", "status", "tta_s", "epochs_to_target", "time_per_epoch_s"]
    ok = runs[in_fixed_count_figures(runs)]
    out = pd.DataFrame({c: (ok[c] if c in ok.columns else np.nan) for c in wanted}, index=ok.index)
    return out.sort_values(list(group_by) + (["repeat"] if "repeat" in ok.columns else []), ignore_index=True)


def target_accuracy(runs: pd.DataFrame) -> float | None:
    """The sweep's target accuracy (the most common one), None if unknown."""
    if "target_accuracy" not in runs.columns:
        return None
    values = pd.to_numeric(runs["target_accuracy"], errors="coerce").dropna()
    return float(values.mode().iloc[0]) if not values.empty else None


def bandwidth_series(table: pd.DataFrame) -> pd.DataFrame:
    """Rows of a per_worker_count table that ran under different link caps (empty if only one).

    Columns: num_workers, link_bandwidth (the cap as written: a tc rate or "uncapped"),
    link_bandwidth_bits_per_s (NaN for uncapped), allreduce_pct, exposed_comm_pct,
    comm_overhead_pct, time_per_epoch_s, step_s.
    """
    axis = "sweep.workers.link_bandwidth"
    if axis not in table.columns or table[axis].nunique(dropna=True) < 2:
        return pd.DataFrame()
    columns = [
        "num_workers",
        axis,
        "link_bandwidth_bits_per_s",
        "allreduce_pct",
        "exposed_comm_pct",
        "comm_overhead_pct",
        "time_per_epoch_s",
        "step_s",
    ]
    out = table[[c for c in columns if c in table.columns]].rename(columns={axis: "link_bandwidth"})
    return out.sort_values(["num_workers", "link_bandwidth_bits_per_s"], na_position="last").reset_index(drop=True)
