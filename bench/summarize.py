"""Render the benchmark results (bench/results/*.json) into one markdown table, bench/results/README.md.

    .venv/bin/python bench/summarize.py            # bench/results/*.json -> bench/results/README.md
    .venv/bin/python bench/summarize.py --quick    # bench/results/quick/ -> bench/results/quick/README.md

One row per comparison of every result file that has them (the `comparisons` of bench/benchlib.py): benchmark,
A and B with their medians, the median ratio, the budget, pass/miss, the date and the machine.
Below the table: what each ratio is, each row's note, and the command that produced each file.
The table is also printed, and (full runs only) written into the top-level README between the
markers BEGIN and END below, so the README's table is always the committed results'.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402

ORDER = ("instrumentation_overhead", "instrumentation_overhead_own_job", "ray_overhead", "ray_overhead_w1", "ray_overhead_w1_pinned", "cpu_scaling", "allreduce", "analysis_speed")


def value(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s/step":
        return f"{v * 1e3:.1f} ms/step"
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "ms":
        return f"{v:.3f} ms"
    if unit == "samples/s":
        return f"{v:,.0f} samples/s"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    return f"{v:.4g} {unit}"


def arm(name: str, v, unit: str) -> str:
    if not name:
        return "—"
    return f"{name}: {value(v, unit)}" if v is not None else name


def budget(c: dict) -> str:
    if c.get("budget") is None:
        return "—"
    if c.get("budget_on", "ratio") == "ratio":
        return f"≤ {c['budget']:g}"
    return f"≤ {c['budget']:g} {c['unit']} (A)"


def verdict(c: dict) -> str:
    return {True: "pass", False: "**miss**", None: "—"}[c.get("pass")]


def machine(record: dict) -> str:
    hw = record["machine"]["hardware"]
    text = f"{hw.get('cpu_model', '?')}, {hw.get('cpu_count', '?')} CPUs"
    if hw.get("gpu_count"):
        text += f", {hw['gpu_count']}× {hw.get('gpu_name')}"
    return text


def escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def table(records: list[dict]) -> list[str]:
    """The comparison table alone (what the top-level README shows)."""
    return render(records).split("\n\n")[2].splitlines()


README = bl.REPO / "README.md"
BEGIN, END = "<!-- bench-table:begin (bench/summarize.py writes this) -->", "<!-- bench-table:end -->"


def update_readme(records: list[dict]) -> bool:
    """Replace the table between BEGIN and END in the top-level README; False if the markers are missing."""
    text = README.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + BEGIN + "\n" + "\n".join(table(records)) + "\n" + END + tail)
    return True


def render(records: list[dict]) -> str:
    header = ["benchmark", "A", "B", "median ratio [95% interval]", "budget", "pass/miss", "date", "machine"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---:|---:|---|---|---|"]
    notes, commands = [], []
    for record in records:
        for c in record["comparisons"]:
            ratio = f"{c['ratio']:.3f}" if c.get("ratio") is not None else "—"
            if c.get("ratio_lo") is not None:  # the 95% interval of the median over pairs
                ratio += f" [{c['ratio_lo']:.3f}, {c['ratio_hi']:.3f}]" + (" within noise" if c.get("within_noise") else "")
            cells = [c["name"], arm(c["a"], c["a_median"], c["unit"]), arm(c["b"], c["b_median"], c["unit"]), ratio,
                     budget(c), verdict(c), record["date"][:10], machine(record)]
            lines.append("| " + " | ".join(escape(x) for x in cells) + " |")
            detail = "; ".join(filter(None, [f"ratio = {c['ratio_definition']}" if c.get("ratio_definition") else "",
                                             c.get("note", "")]))
            notes.append(f"- **{c['name']}**: {detail}")
        quick = " (quick)" if record.get("quick") else ""
        load = record["machine"].get("load_avg_start"), record["machine"].get("load_avg_end")
        load_text = f"; 1-min load average {load[0][0]:.2f} at start, {load[1][0]:.2f} at end" if all(load) else ""
        versions = ", ".join(f"{k} {v}" for k, v in record["machine"]["versions"].items())
        commands.append(f"- `{record['benchmark']}`{quick}: `{record['command']}` ({record['wall_s']:.0f} s; "
                        f"{versions}{load_text})")
    return "\n".join([
        "# Benchmarks of the lab's own cost",
        "",
        "Written by `bench/summarize.py` from `bench/results/*.json` (`make bench`). A and B ran in the same "
        "benchmark, alternating (A B B A ...); values are medians. Definitions: each script's docstring in `bench/`.",
        "",
        *lines,
        "",
        "## What each row measures",
        "",
        *notes,
        "",
        "## Commands",
        "",
        *commands,
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="summarize bench/results/quick/")
    args = parser.parse_args()
    folder = bl.results_dir(args.quick)
    paths = sorted(folder.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    if not paths:
        sys.exit(f"no results in {folder}; run `make bench` first")
    records, skipped = [], []
    for path in paths:
        record = json.loads(path.read_text())
        # results of other shapes (e.g. minicluster_bandwidth.json) have no comparison rows
        ok = isinstance(record.get("comparisons"), list) and isinstance(record.get("machine"), dict) \
            and "hardware" in record["machine"]
        (records if ok else skipped).append(record if ok else path.name)
    if not records:
        sys.exit(f"no benchmark results with comparisons in {folder}")
    text = render(records)
    if skipped:
        text += f"\nNot in the table (no `comparisons`): {', '.join(skipped)}.\n"
    out = folder / "README.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out.relative_to(bl.REPO)}")
    if not args.quick and update_readme(records):
        print(f"updated the table in {README.relative_to(bl.REPO)}")


if __name__ == "__main__":
    main()
