"""`scaling why RUN_DIR | SWEEP_DIR`: the causes that cost a job its scaling, ranked, each with its
figure, its fix and the gain the fix would bring. Reads the run (results.py), asks the pure
analysis for the causes (scaling/analysis/why.py), prices each fix with the lab's own projection
(scaling/projection/), and prints one screen (or JSON).

    verdict = explain("results/demo")          # a run or a sweep directory
    print("\\n".join(render(verdict)))

The price: the run is projected onto a cluster fitted to itself (`self_cluster`: the link
bandwidth at which a ring all-reduce of the run's gradients takes the time the run's all-reduces
were in flight, less the wait for the slowest rank; the run's own compute and straggler wait,
`from_run.project_run` with `same_device`; the overlap slowdown at which the projection's
interference is the run's own, `_reproducing_interference`), once as measured and once with the
fix applied (a doubled per-worker batch, no straggler wait, no interference). A doubled
batch is priced in time per sample: the step's collectives carry the same bytes over twice the samples.
The gain is the projected step's fall at the measured worker count, with the interval of the
projection's compute ends (the run's 2.5th and 97.5th percentile steps) widened by the measured
figure's own interval, and the projected scaling efficiency at twice the workers before and
after. A fix the projection has no term for (the data wait, the syncs of accumulation, compute
slowing, the per-worker batch, start-up) is priced by removing its measured share, and says so.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from scaling.analysis import why
from scaling.analysis.attribution import largest_run
from scaling.errors import UsageError
from scaling.results import RunDir, SweepDir, resolve_sweep_dir

STEP_COLUMNS = ["epoch", "step", "kind", "warmup", "rank", "pair", *why.SHARE_COLUMNS]
WIDTH = 100  # one screen: 100 columns
# A run the projection cannot take (a figure it needs absent or odd in the records) loses the price,
# never the verdict: each is said in a note and the gain is then the measured share removed
PRICING_ERRORS = (UsageError, KeyError, ValueError, TypeError, ZeroDivisionError)


def _load_run(run: RunDir) -> why.Evidence:
    try:
        summary = run.summary()
    except (OSError, ValueError):
        raise UsageError(f"{run.path}: no readable summary.json (give a finished run or sweep directory)") from None
    batches = list(run.step_batches(STEP_COLUMNS))
    steps = pd.concat(batches, ignore_index=True) if batches else pd.DataFrame(columns=STEP_COLUMNS)
    telemetry = run.telemetry() if (summary.get("hardware") or {}).get("gpu_name") else None
    return why.run_evidence(summary, steps, run.ranks(), run.epochs(), telemetry, run.job())


def self_cluster(summary: dict, profile: dict | None):
    """A cluster whose link reproduces the run's own all-reduce time (module docstring); None where the
    run cannot give one (one worker, no FLOP profile, no all-reduce timed)."""
    from scaling.projection.cluster import cluster_from_alpha_beta

    n = int(summary.get("num_workers") or 1)
    params = (profile or {}).get("parameters")
    busy = (summary.get("allreduce_s") or 0.0) - (summary.get("waiting_s") or 0.0)
    if n < 2 or not params or not busy > 0 or not (profile or {}).get("train_flops"):
        return None
    # the bytes the run's all-reduces carried: its gradients, at 2 bytes each where it compressed them
    wire = 2 if summary.get("grad_compression") in ("bf16", "fp16") else 4
    bandwidth = 2 * (n - 1) / n * wire * float(params) / busy
    return cluster_from_alpha_beta(0.0, bandwidth, gpus_per_node=4 * n, name="this run's own links (fitted)")


def _project(run: RunDir, cluster, n: int, kwargs: dict) -> pd.DataFrame:
    from scaling.projection.from_run import project_run

    return project_run(run, cluster, [n, 2 * n], same_device=True, **kwargs).set_index("num_workers")


def price(findings: list[why.Finding], run: RunDir | None) -> tuple[list[str], dict]:
    """Fill each finding's `gain` (module docstring). Returns the notes, which say what the projection
    could not do, and what the projection assumed of the run (`pricing`: its fitted link, straggler
    wait and overlap slowdown, and the interference it projects at the run's worker count; {} unused)."""
    summary = run.summary() if run is not None else {}
    n = int(summary.get("num_workers") or 1)
    cluster, base, notes, pricing = None, None, [], {}
    needs = any(f.price for f in findings if f.decided)
    if run is not None and needs:
        from scaling.projection.compute import measured_overlap_slowdown

        cluster = self_cluster(summary, run.compute_profile())
        if cluster is None:
            notes.append("no projection: the run has one worker, no FLOP profile or no timed all-reduce")
        else:
            try:
                slowdown = measured_overlap_slowdown(run)
            except UsageError:
                slowdown = 0.0
            baseline = {
                "straggler_s": float(summary.get("waiting_s") or 0.0),
                "overlap_slowdown": slowdown,
            }
            try:
                base = _project(run, cluster, n, baseline)
                base = _reproducing_interference(run, cluster, n, baseline, base)
                pricing = {
                    "link_bandwidth_bytes_per_s": cluster.intra_node.bandwidth_bytes_per_s,
                    **baseline,
                    "interference_s": float(base.loc[n, "interference_s"]),
                }
            except PRICING_ERRORS as exc:
                notes.append(f"no projection: {exc}")
    for finding in findings:
        if not finding.decided:
            continue
        if finding.price and base is not None:
            try:
                finding.gain = _projected_gain(run, cluster, n, baseline, base, finding)
            except PRICING_ERRORS as exc:  # the verdict stands without the price: the share removed instead
                notes.append(f"{finding.title}: not projected ({exc})")
        if not finding.gain:
            finding.gain = {
                "how": f"estimated: {finding.estimate}",
                "step_pct": finding.cost.pct,
                "step_pct_lo": finding.cost.lo,
                "step_pct_hi": finding.cost.hi,
                "at_workers": n,
            }
    return notes, pricing


def _reproducing_interference(run, cluster, n: int, baseline: dict, base: pd.DataFrame) -> pd.DataFrame:
    """The base projection with the overlap slowdown at which it reproduces the run's own interference at
    `n` (module docstring); `baseline` is updated in place. The measured slowdown is per second of the
    run's overlap; the projection's overlap (its buckets' hand-overs, its link) is not the run's, and a
    slowed backward overlaps longer, so the slowdown is searched for (secant steps, at most 8) until
    the two agree within 2%; the closest tried is kept."""
    measured = float(run.summary().get("interference_s") or 0.0)
    tried = [(baseline["overlap_slowdown"], float(base.loc[n, "interference_s"]), base)]
    for _ in range(8):
        slowdown, projected, _ = tried[-1]
        if not (measured > 0 and projected > 0) or abs(projected / measured - 1) < 0.02:
            break
        if len(tried) > 1 and tried[-1][1] != tried[-2][1]:
            (s0, p0, _), (s1, p1, _) = tried[-2], tried[-1]
            slowdown = s1 + (measured - p1) * (s1 - s0) / (p1 - p0)
        else:
            slowdown *= measured / projected
        baseline["overlap_slowdown"] = max(0.0, slowdown)
        base = _project(run, cluster, n, baseline)
        tried.append((baseline["overlap_slowdown"], float(base.loc[n, "interference_s"]), base))
    if measured > 0:
        slowdown, _, base = min(tried, key=lambda t: abs(t[1] - measured))
        baseline["overlap_slowdown"] = slowdown
    return base


def _projected_gain(run, cluster, n: int, baseline: dict, base: pd.DataFrame, finding: why.Finding) -> dict:
    kwargs = dict(baseline)
    fix = dict(finding.price)
    plus = fix.pop("plus_pct", 0.0)  # a part of the cost the projection's compute holds (the straggler's own)
    # A larger batch per worker: the same collectives per step over more samples, so the gain is in the time
    # per sample (the projection's compute grows with the batch, its all-reduce keeps the run's bytes)
    per_step = fix.pop("per_gpu_batch_factor", 1)
    if per_step != 1:
        kwargs["per_gpu_batch"] = int(run.summary()["per_worker_batch"]) * per_step
    kwargs.update(fix)
    fixed = _project(run, cluster, n, kwargs)
    ends = []
    for suffix in ("", "_lo", "_hi"):
        before, after = base.loc[n, f"step_s{suffix}"], fixed.loc[n, f"step_s{suffix}"] / per_step
        ends.append(100 * (before - after) / before + plus)
    estimate = ends[0]
    if estimate <= plus:
        return {}  # the projection prices nothing here (its term is 0 for this run): estimated instead
    # the projection's compute ends, widened by the measured figure's own interval
    relative = [finding.cost.lo / finding.cost.pct, finding.cost.hi / finding.cost.pct] if finding.cost.pct else []
    spread = ends[1:] + [estimate * r for r in relative if math.isfinite(r)]
    described = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k not in baseline or baseline[k] != v)
    if plus:
        described += f", plus the slow rank's own excess ({plus:.1f}% of step, estimated)"
    return {
        "how": f"projected: the run's own projection with {described}"
        + ("; exposed time read as bytes over bandwidth" if "grad_compression" in fix else ""),
        "per": "sample" if per_step != 1 else "step",
        "step_pct": estimate,
        "step_pct_lo": min(spread + [estimate]),
        "step_pct_hi": min(100.0, max(spread + [estimate])),  # a fix removes at most the whole step
        "at_workers": n,
        "step_s": float(base.loc[n, "step_s"]),
        "fixed_step_s": float(fixed.loc[n, "step_s"]) / per_step,
        "projected_workers": 2 * n,
        "efficiency": float(base.loc[2 * n, "efficiency_throughput"]),
        "fixed_efficiency": float(fixed.loc[2 * n, "efficiency_throughput"]),
    }


def explain(path: str | Path) -> dict:
    """The verdict for a run or a sweep directory: what was read, the ranked findings (dicts), notes."""
    path = resolve_sweep_dir(path)
    run = RunDir(path)
    if run.summary_path.exists():
        return verdict(None, run, path)
    if not path.is_dir():
        said = "not a directory" if path.exists() else "not found"
        raise UsageError(f"{said}: {path} (give a run directory or a sweep directory)")
    sweep = SweepDir(path)  # reading it says, in one line, where it is no sweep
    row = largest_run(sweep.runs) if not sweep.runs.empty else None
    if row is None:
        raise UsageError(f"{path}: no finished run with more than one worker to explain")
    return verdict(sweep.runs, sweep.run(row["run_key"]), path)


def verdict(runs: pd.DataFrame | None, run: RunDir, path: str | Path | None = None) -> dict:
    """The verdict for one run, or for a sweep (`runs`: its runs.parquet rows) and its largest run `run`
    (`attribution.largest_run`'s)."""
    ev = _load_run(run)
    if runs is not None:
        ev = why.sweep_evidence(runs, ev, largest_run(runs))
    findings = why.diagnose(ev)
    notes, pricing = price(findings, run)
    return {
        "path": str(path or run.path),
        "kind": "run" if runs is None else "sweep",
        "run": str(run.path),
        "num_workers": ev.summary.get("num_workers"),
        "step_s": ev.summary.get("step_s"),
        "findings": [asdict(f) for f in findings],
        "notes": notes,
        "pricing": pricing,
    }


# Each gain is priced with its own fix alone, and two causes can have one root: other work on a worker's
# cores both slows its compute and makes it the straggler (`make demo` on 2 shared cores shows both)
GAINS_DO_NOT_ADD = "Each gain is its own fix's alone; causes can share a root (other work on the cores slows "
GAINS_DO_NOT_ADD += "compute and makes a straggler), so the gains do not add."


def _gain_text(gain: dict) -> str:
    if not gain or not math.isfinite(gain.get("step_pct", math.nan)):
        return "-"
    lo, hi = gain.get("step_pct_lo", math.nan), gain.get("step_pct_hi", math.nan)
    interval = f" [{lo:.1f}, {hi:.1f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    per = "time per sample" if gain.get("per") == "sample" else "step"
    text = f"{per} -{gain['step_pct']:.1f}%{interval} at {gain['at_workers']} workers"
    if "fixed_efficiency" in gain:
        text += (
            f"; efficiency {gain['efficiency']:.2f} -> {gain['fixed_efficiency']:.2f} at {gain['projected_workers']}"
        )
    return text


def _wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ") or [indent]


def render(verdict: dict) -> list[str]:
    """The verdict as lines of at most WIDTH columns: the ranked causes (3 lines each), the undecided
    ones with the run that decides them, what lies outside the steps."""
    step = verdict.get("step_s")
    head = f"Why it scales as it does: {verdict['path']} ({verdict['kind']}"
    head += f"; {verdict['num_workers']} workers" if verdict.get("num_workers") else ""
    head += f", step {1e3 * step:.1f} ms)" if step else ")"
    lines = _wrapped(head, "")
    findings = verdict["findings"]
    ranked = [f for f in findings if f["decided"] and f["of"] == "step"]
    undecided = [f for f in findings if not f["decided"]]
    job = [f for f in findings if f["decided"] and f["of"] != "step"]
    if not ranked:
        lines.append("No cause is shown to cost this job 2% of its step or more.")
    else:
        lines.append(f"{'#':>2}  {'cause':<44} cost: share of step [95%]")
    for i, f in enumerate(ranked, 1):
        lines.append(f"{i:>2}  {f['title'][:44]:<44} {why.Share(**f['cost']).text()}")
        lines += _wrapped(f"measured: {f['figure']}", "    ")
        lines += _wrapped(f"fix: {f['fix']}", "    ")
        lines += _wrapped(f"gain: {_gain_text(f['gain'])} ({f['gain'].get('how', '')})", "    ")
    if len(ranked) > 1:
        lines += _wrapped(GAINS_DO_NOT_ADD, "")
    if undecided:
        lines.append("Undecided (the data cannot tell):")
        for f in undecided:
            cost = why.Share(**f["cost"]).text()
            said = f"{f['title']}: {f['figure']}" + (
                f", {cost} of step" if cost != "-" and cost not in f["figure"] else ""
            )
            lines += _wrapped(f"- {said}; decides: {f['decides']}" + (f"; fix: {f['fix']}" if f["fix"] else ""), "")
    for f in job:
        lines += _wrapped(f"Outside the steps: {f['title']} {f['cost']['pct']:.0f}% of the job: {f['figure']}", "")
        lines += _wrapped(f"fix: {f['fix']}", "    ")
    for note in verdict.get("notes", []):
        lines += _wrapped(f"note: {note}", "")
    return lines
