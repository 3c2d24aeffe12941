"""Projected figures for a measured sweep: what `scaling report` draws over the measured points.

A sweep whose runs name a cluster description (`workers.cluster`: a preset such as
`p3.16xlarge`, or a cluster YAML; recorded as `cluster` in each summary) gets, per series
(the report's group keys other than `num_workers`), one projection (scaling/projection/project.py)
at the series' measured worker counts:

- compute: the series' run at its smallest worker count with the median step time (its
  one-worker compute, `compute_from_run`: backward compute = backward_s - exposed_comm_s at
  more than one worker), so the projection predicts only what communication adds;
- model, per-worker batch, precision, gradient compression and bucket cap: the run's own;
- cluster: the runs' `cluster` (the most common, if they differ).

Columns added to the report's per-worker-count table, per (series, num_workers):
`projected_step_s`; the three communication figures, as the lab measures them
(scaling/projection/rows.py defines the model's): `projected_allreduce_pct` (time
communicating), `projected_exposed_comm_pct` (exposed) and `projected_comm_overhead_pct` (the
A/B figure: exposed + interference); `projected_speedup_throughput` = projected throughput(N) /
projected throughput(base), rebased to the series' base worker count as the measured speedup
is, and `projected_efficiency_throughput` = that speedup / (N / base).

The projection is `run_projection`, the same model and cluster terms as `scaling project`, with
the runs' backend (DDP, Horovod with its cycle time and fusion threshold, or FSDP/HSDP, whose
model needs a transformer's layer table: gpt2-tiny, gpt2-small, gpt2-medium, llama3-8b; the run's
`fsdp:` settings, reshard after forward and the gathered and reduced dtypes, and no activation
checkpointing, as the lab's loop trains). For an FSDP sweep
the three figures are FSDP's (rows.py): time with an all-gather or reduce-scatter in flight,
compute waiting on a collective, and the A/B without reduce-scatters, as the lab's FSDP adapter
measures them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scaling.errors import UsageError

PROJECTED = (
    "projected_step_s",
    "projected_allreduce_pct",
    "projected_exposed_comm_pct",
    "projected_comm_overhead_pct",
    "projected_speedup_throughput",
    "projected_efficiency_throughput",
)


def _mode(values: pd.Series):
    values = values.dropna()
    values = values[values.astype(str) != ""]
    return values.mode().iloc[0] if not values.empty else None


_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def _fsdp_settings(run) -> dict:
    """The FSDP settings a run trained with (its config's `fsdp:`), as run_projection takes them; the
    lab's loop checkpoints no activations."""
    try:
        fsdp = (run.config or {}).get("fsdp") or {}
    except (OSError, ValueError):
        fsdp = {}
    settings = {"activation_checkpointing": "none"}
    if isinstance(fsdp.get("reshard_after_forward"), bool):
        # the lab's loop: true reshards every block and keeps the root gathered, FSDP2's default
        # for it (scaling/train/backends/fsdp.py), false none
        settings["reshard_after_forward"] = "all" if fsdp["reshard_after_forward"] else "none"
    if fsdp.get("reduce_dtype") in _DTYPES:
        settings["fsdp_reduce_dtype"] = _DTYPES[fsdp["reduce_dtype"]]
    if fsdp.get("param_dtype") in _DTYPES:
        settings["fsdp_param_dtype"] = _DTYPES[fsdp["param_dtype"]]
    return settings


def _base_run(ok: pd.DataFrame) -> pd.Series:
    """The run at the smallest worker count whose step time is the median of that count's runs."""
    base = ok[ok["num_workers"] == ok["num_workers"].min()]
    step = pd.to_numeric(base["step_s"], errors="coerce") if "step_s" in base.columns else None
    if step is None or step.isna().all():
        return base.iloc[0]
    return base.loc[(step - step.median()).abs().idxmin()]


def project_sweep(runs: pd.DataFrame, keys: tuple[str, ...], run_dir_of) -> tuple[pd.DataFrame, list[str], list[str]]:
    """(projected rows, notes, warnings) for a sweep's runs; empty rows when no run names a cluster.

    keys: the report's group keys (with num_workers). run_dir_of(row) -> the run's records (its RunDir).
    Rows: the keys plus PROJECTED and `cluster`. A series whose projection cannot be made (a
    model without a layer table, a failed base run, an unknown cluster) is named in a warning.
    """
    from scaling.projection.project import run_projection

    columns = [*keys, "cluster", *PROJECTED]
    if "cluster" not in runs.columns or _mode(runs["cluster"]) is None:
        return pd.DataFrame(columns=columns), [], []
    others = [k for k in keys if k != "num_workers"]
    ok = runs[runs["status"] != "failed"]
    series = ok.groupby(others, dropna=False, sort=True) if others else [((), ok)]
    rows, notes, warnings = [], [], []
    for values, part in series:
        values = values if isinstance(values, tuple) else (values,)
        label = ", ".join(f"{k.removeprefix('sweep.')} = {v}" for k, v in zip(others, values)) or "the sweep"
        cluster = _mode(part["cluster"]) if "cluster" in part.columns else None
        if cluster is None or part.empty:
            continue
        base = _base_run(part)
        counts = sorted(int(n) for n in part["num_workers"].unique())
        horovod = {}
        if str(base.get("backend")) in ("fsdp", "hsdp"):
            horovod = {"backend": str(base.get("backend")), **_fsdp_settings(run_dir_of(base))}
        if str(base.get("backend")) == "horovod":
            horovod = {"backend": "horovod"}
            for key in ("horovod_cycle_time_ms", "horovod_fusion_threshold_mb"):
                value = pd.to_numeric(base.get(key), errors="coerce")
                if pd.notna(value):
                    horovod[key] = float(value)
        try:
            df = run_projection(str(base["model"]), str(cluster), workers=counts, from_run=run_dir_of(base), **horovod)
        except (UsageError, ValueError, OSError, KeyError) as exc:
            warnings.append(f"no projection for {label} on {cluster}: {exc}")
            continue
        df = df[df["num_workers"].isin(counts)].set_index("num_workers")
        base_workers = counts[0]
        speedup = df["throughput_samples_per_s"] / float(df.loc[base_workers, "throughput_samples_per_s"])
        for n in counts:
            rows.append(
                {
                    **dict(zip(others, values)),
                    "num_workers": n,
                    "cluster": str(cluster),
                    "projected_step_s": float(df.loc[n, "step_s"]),
                    "projected_allreduce_pct": float(df.loc[n, "allreduce_pct"]),
                    "projected_exposed_comm_pct": float(df.loc[n, "exposed_comm_pct"]),
                    "projected_comm_overhead_pct": float(df.loc[n, "comm_overhead_pct"]),
                    "projected_speedup_throughput": float(speedup.loc[n]),
                    "projected_efficiency_throughput": float(speedup.loc[n]) / (n / base_workers),
                }
            )
        notes.append(
            f"{label}: projected on {cluster} from run {run_dir_of(base).name} "
            f"({base_workers} worker{'s' if base_workers > 1 else ''}); " + "; ".join(df.attrs.get("notes", []))
        )
    return pd.DataFrame(rows, columns=columns), notes, warnings


def add_projection(table: pd.DataFrame, projected: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """The report's per-worker-count table with the PROJECTED columns (NaN where nothing was projected)."""
    if projected.empty:
        return table
    merged = table.merge(projected.drop(columns=["cluster"]), on=list(keys), how="left")
    merged.attrs.update(table.attrs)
    for column in PROJECTED:
        merged[column] = merged[column].astype(float).replace({np.inf: np.nan})
    return merged
