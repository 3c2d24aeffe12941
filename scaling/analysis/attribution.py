"""Why communication costs what it does, across a sweep: the three parts per worker count, and
"who waits for whom" per rank of the largest run. Pure pandas: tables in, tables out.

- `parts_per_worker_count`: per group (the report's group keys), the medians over its runs of
  `waiting_pct`, `transfer_pct` and `interference_pct` (each run's summary: the exposed
  communication spent waiting for the slowest rank, the exposed transfer once all ranks were
  ready, and the A/B cost beyond the exposed time, as % of the step; definitions in
  scaling/analysis/run_metrics.py), with the run's straggler and how often it was last.
- `who_waits`: one row per rank of one run (its ranks.parquet): mean waiting and transfer
  per step, and the share of steps it was the straggler.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scaling.analysis.scaling_tables import in_fixed_count_figures

PARTS = ("waiting_pct", "transfer_pct", "interference_pct")


def parts_per_worker_count(runs: pd.DataFrame, keys: tuple[str, ...] | list[str]) -> pd.DataFrame:
    ok = runs[in_fixed_count_figures(runs)] if "status" in runs.columns else runs
    ok = ok[pd.to_numeric(ok["num_workers"], errors="coerce") > 1]
    columns = list(keys) + [*PARTS, "straggler_rank", "straggler_share", "n_runs"]
    if ok.empty or not any(p in ok.columns for p in PARTS):
        return pd.DataFrame(columns=columns)
    rows = []
    for values, group in ok.groupby(list(keys), dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        row = dict(zip(keys, values))
        for part in PARTS:
            row[part] = float(pd.to_numeric(group[part], errors="coerce").median()) if part in group.columns else np.nan
        named = pd.to_numeric(group.get("straggler_rank", pd.Series(dtype=float)), errors="coerce").dropna()
        row["straggler_rank"] = int(named.mode().iloc[0]) if not named.empty else np.nan
        share = pd.to_numeric(group.get("straggler_share", pd.Series(dtype=float)), errors="coerce")
        row["straggler_share"] = float(share.median()) if share.notna().any() else np.nan
        row["n_runs"] = len(group)
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def largest_run(runs: pd.DataFrame) -> pd.Series | None:
    """The non-failed run with the most workers (the first by run key among those): the one drawn per rank."""
    ok = runs[in_fixed_count_figures(runs)] if "status" in runs.columns else runs
    ok = ok[pd.to_numeric(ok["num_workers"], errors="coerce") > 1]
    if ok.empty:
        return None
    most = ok["num_workers"].max()
    return ok[ok["num_workers"] == most].sort_values("run_key").iloc[0]


def who_waits(ranks: pd.DataFrame) -> pd.DataFrame:
    """A run's ranks.parquet, ordered by rank, with the parts in the columns the report prints."""
    wanted = ["rank", "step_s", "exposed_comm_s", "waiting_s", "transfer_s", "straggler_share"]
    if ranks.empty or "waiting_s" not in ranks.columns:
        return pd.DataFrame(columns=wanted)
    return ranks[[c for c in wanted if c in ranks.columns]].sort_values("rank", ignore_index=True)
