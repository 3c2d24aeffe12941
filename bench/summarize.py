"""Render the committed benchmark results (bench/results/*.json) into the documentation pages.

    .venv/bin/python bench/summarize.py            # bench/results/*.json -> the blocks in docs/*.md
    .venv/bin/python bench/summarize.py --check    # exit 1 if a docs block or quoted figure differs from the results
    .venv/bin/python bench/summarize.py --quick    # bench/results/quick/ -> bench/results/quick/README.md

A docs page asks for a block with a pair of markers, and everything between them is rewritten
from the results (nothing else in the page is touched):

    <!-- begin bench/summarize.py: table ray_overhead ray_overhead_w1 -->
    <!-- end bench/summarize.py: table ray_overhead ray_overhead_w1 -->

Blocks: `table NAME...` (the comparison rows of those result files: A and B with their medians,
the median ratio with its 95% interval, the budget and the verdict, what each row measures, and
under the table each file's date, machine, command and wall time), `make-bench` (what `make
bench` runs and what each of those benchmarks took), `anchors` (the projection against
published measurements), `torchtitan [short]` (the FSDP projection against torchtitan's Llama
3.1 8B weak scaling; `short`: the table alone), `projection-vs-minicluster`,
`projection-own-jobs` (`scaling project` from the user's own 1-worker runs against their
2-worker runs), `minicluster-bandwidth`, `interference`, `figure NAME` (bench/results/NAME.png
copied to docs/figures/bench/, so that the site, which only sees docs/, shows the committed figure).
README.md is rendered as the docs pages are. So every number of a benchmark is written once, by
this script, from its results file, with the machine and the date beside it; `make bench` ends
by running it.

The verdict of a row with a budget is the results file's own (`verdict`) where it has one;
otherwise it is read from the file's fields: "pass" or "miss" by the median ratio, and
"undecided" where the 95% interval of that median straddles the budget (`budget_within_noise`),
so a row never says "pass" while its interval reaches past the budget.
`--quick` renders every quick result into one page, bench/results/quick/README.md (not committed).

A figure quoted in prose is written the same way, inline: a marker naming the results file, the
path to the value inside it and how to print it, around the number, which this script rewrites
(and `--check` compares) like a block:

    the step took <!-- quote instrumentation_overhead comparisons/0/a_median *1000 .1f -->77.7<!-- /quote --> ms

`quote FILE PATH [*SCALE] [+-OFFSET] [SPEC]`: FILE is `bench/results/FILE.json`; PATH walks it
by `/` (dict keys, list indexes); `*SCALE` multiplies the value (`*1000`: seconds to ms) and
`-1` subtracts 1 (a ratio as a cost: `-1 .1%` prints 1.008 as 0.8%), in the order written; SPEC
is a Python format spec (`.1f`, `,.0f`, `.1%`; default `g`). Three PATHs print where the value comes
from: `@date` (YYYY-MM-DD), `@machine` (CPU, CPUs, GPUs) and `@source` (the file, its date and
its machine). A quote never opens a line (Markdown would read the line as raw HTML). So a number
in a sentence cannot drift from its result: `--check` fails when it differs, and a PATH that
names nothing fails with the page and the marker.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402

DOCS = bl.REPO / "docs"
FIGURES = DOCS / "figures" / "bench"
MARKER = re.compile(
    r"<!-- begin bench/summarize\.py: (?P<key>[^>]*?) -->\n.*?<!-- end bench/summarize\.py: (?P=key) -->", re.DOTALL
)


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
    """The row's verdict against its budget (module docstring): the file's own, or read from its fields."""
    if c.get("verdict"):
        text = str(c["verdict"])
        return f"**{text}**" if text.lower().startswith("miss") else text
    if c.get("pass") is None:
        return "—"
    if c.get("budget_within_noise"):
        return "undecided: the interval straddles the budget"
    return "pass" if c["pass"] else "**miss**"


def ratio_cell(c: dict) -> str:
    if c.get("ratio") is None:
        return "—"
    text = f"{c['ratio']:.3f}"
    if c.get("ratio_lo") is not None:  # the 95% interval of the median over pairs
        text += f" [{c['ratio_lo']:.3f}, {c['ratio_hi']:.3f}]"
        if c.get("within_noise"):
            text += "; includes 1"
    return text


def machine(record: dict) -> str:
    hw = record["machine"].get("hardware", record["machine"])
    text = f"{hw.get('cpu_model', '?')}, {hw.get('cpu_count', '?')} CPUs"
    if hw.get("gpu_count"):
        text += f", {hw['gpu_count']}× {hw.get('gpu_name')}"
    return text


def provenance(record: dict, name: str, load: bool = True) -> str:
    """Where a result comes from: file, date, machine, command, wall time and (`load`) the machine's load."""
    parts = [f"`bench/results/{name}.json`: {record['date'][:10]}, {machine(record)}", f"`{record['command']}`"]
    if record.get("wall_s") is not None:
        parts[-1] += f" ({minutes(record['wall_s'])})"
    averages = record["machine"].get("load_avg_start"), record["machine"].get("load_avg_end")
    if load and all(averages):
        parts.append(f"1-minute load average {averages[0][0]:.2f} at the start, {averages[1][0]:.2f} at the end")
    return "; ".join(parts)


def minutes(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


def escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def load(folder: Path, name: str) -> dict:
    path = folder / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"summarize: {path.relative_to(bl.REPO)} is missing (a docs block asks for it)")
    return json.loads(path.read_text())


def comparison_table(records: list[tuple[str, dict]]) -> list[str]:
    """The comparison rows of these results, what each row measures, and where each file comes from."""
    lines = ["| comparison | A | B | median ratio [95% interval] | budget | verdict |", "|---|---|---|---:|---:|---|"]
    notes, sources = [], []
    for name, record in records:
        for c in record["comparisons"]:
            cells = [
                c["name"],
                arm(c["a"], c["a_median"], c["unit"]),
                arm(c["b"], c["b_median"], c["unit"]),
                ratio_cell(c),
                budget(c),
                verdict(c),
            ]
            lines.append("| " + " | ".join(escape(x) for x in cells) + " |")
            detail = "; ".join(
                filter(
                    None,
                    [
                        f"ratio = {c['ratio_definition']}" if c.get("ratio_definition") else "",
                        f"budget: {c['budget_definition']}" if c.get("budget_definition") else "",
                        c.get("note", ""),
                    ],
                )
            )
            if detail:
                notes.append(f"- *{c['name']}*: {detail}")
        sources.append(f"- {provenance(record, name)}")
    return [*lines, "", "What each row measures:", "", *notes, "", "Measured:", "", *sources]


def block_table(folder: Path, names: list[str]) -> list[str]:
    return comparison_table([(name, load(folder, name)) for name in names])


def block_make_bench(folder: Path, names: list[str]) -> list[str]:
    """What `make bench` runs (bench/run_all.py), and what each of those benchmarks took when its result was made."""
    import run_all

    lines = ["| benchmark | script | committed result: date, machine |", "|---|---|---|"]
    total, measured = 0.0, 0
    for name in run_all.BENCHMARKS:
        script, extra = run_all.VARIANTS.get(name, (name, []))
        command = f"`bench/{script}.py{''.join(' ' + a for a in extra)}`"
        if not (folder / f"{name}.json").exists():
            # a benchmark registered before its first measurement: its row says so (a docs table that
            # asks for its result still fails until the result is committed)
            lines.append(f"| {name} | {command} | not yet measured |")
            continue
        record = load(folder, name)
        total += record.get("wall_s") or 0.0
        measured += 1
        lines.append(f"| {name} | {command} | {record['date'][:10]}, {machine(record)} |")
    others = sorted(p.stem for p in folder.glob("*.json") if p.stem not in run_all.BENCHMARKS)
    results = (
        "their committed results took"
        if measured == len(run_all.BENCHMARKS)
        else f"the committed results of {measured} of them took"
    )
    return [
        *lines,
        "",
        f"`make bench` runs these {len(run_all.BENCHMARKS)} benchmarks; {results} "
        f"{minutes(total)} together (each on the machine and date in its row, its own time under its table; the "
        f"first `make bench` also builds Horovod). The other committed results are run one by one, each with the "
        f"command under its table: " + ", ".join(f"`{n}`" for n in others) + ".",
    ]


def block_anchors(folder: Path, names: list[str]) -> list[str]:
    import projection_anchors

    record = load(folder, "projection_anchors")
    return [
        *projection_anchors.markdown(record["anchors"]).splitlines(),
        "",
        f"- {provenance(record, 'projection_anchors')}",
    ]


def block_torchtitan(folder: Path, names: list[str]) -> list[str]:
    import projection_torchtitan

    record = load(folder, "projection_torchtitan")
    short = names == ["short"]  # the README's: the table, the count and where it comes from
    return [
        *projection_torchtitan.markdown(record, short=short).splitlines(),
        "",
        f"- {provenance(record, 'projection_torchtitan', load=not short)}",
    ]


def block_projection_vs_minicluster(folder: Path, names: list[str]) -> list[str]:
    record = load(folder, "projection_vs_minicluster")
    headline = record["goal"]["judged_on"]
    lines = [
        "| cap | all-reduce of the gradients: fitted / in the run | step: predicted / measured (error) | "
        "A/B overhead: predicted / measured (error) | measured step per repeat |",
        "|---|---:|---:|---:|---|",
    ]
    for row in record["comparison"]:
        cap, fit, measured = row["cap"], record["fits"][row["cap"]], record["measured"].get(row["cap"]) or {}
        repeats = ", ".join(f"{1e3 * r['step_s']:.1f}" for r in measured.get("per_repeat", []))
        in_run = (measured.get("diagnosis") or {}).get("allreduce_in_run_s")
        in_run_text = f"{1e3 * in_run:.1f}" if in_run is not None else "—"
        lines.append(
            f"| {cap} | {1e3 * fit['gradient_allreduce_fitted_s']:.1f} / {in_run_text} ms "
            f"| {1e3 * row[f'predicted_step_s[{headline}]']:.1f} / {1e3 * row['measured_step_s']:.1f} ms "
            f"({row[f'step_error_pct[{headline}]']:+.1f}%{'' if row['step_pass'] else ', **misses**'}) "
            f"| {row[f'predicted_comm_overhead_pct[{headline}]']:.1f} / {row['measured_comm_overhead_pct']:.1f}% "
            f"({row[f'overhead_error_pp[{headline}]']:+.1f} pp{'' if row['overhead_pass'] else ', **misses**'}) "
            f"| {repeats} ms |"
        )
    goal = record["goal"]
    return [
        *lines,
        "",
        f"Goal: step time within {100 * goal['step_time_relative']:.0f}% and A/B overhead within "
        f"{goal['comm_overhead_pp']:g} pp at every cap: **{'met' if record['goal_met'] else 'not met'}**. "
        f"Predictions written {record['predicted_at'][:16].replace('T', ' ')} UTC, before the first 2-worker run; "
        f"{record['repeats_per_cap']} runs per cap, compared by their median.",
        "",
        f"- {provenance(record, 'projection_vs_minicluster')}",
    ]


def block_projection_own_jobs(folder: Path, names: list[str]) -> list[str]:
    """`scaling project` from the user's own 1-worker runs against their 2-worker runs on the minicluster."""
    name = "projection_own_jobs"
    record = load(folder, name)
    head = record["goal"]["judged_on"]
    lines = [
        "| job | cap | pace | step: predicted [interval] / measured (error) | exposed communication: predicted / "
        "measured (error) | unpaced baseline's step error | step error per round |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for job, rows in record["comparison"].items():
        for row in rows:
            cap = row["cap"]
            pace = record["paced_baselines"][job][cap]["pace_s"]
            low, high = row["predicted_step_interval_s"]
            predicted = f"{1e3 * row[f'predicted_step_s[{head}]']:.1f} [{1e3 * low:.1f}, {1e3 * high:.1f}]"
            if row.get("measured_step_s") is None:
                lines.append(f"| {job} | {cap} | {1e3 * pace:.1f} ms | {predicted} / — ms | — | — | — |")
                continue
            by_round = ", ".join(f"{e:+.1f}" for e in row.get("step_error_pct_by_round", []))
            lines.append(
                f"| {job} | {cap} | {1e3 * pace:.1f} ms | {predicted} / {1e3 * row['measured_step_s']:.1f} ms "
                f"({row[f'step_error_pct[{head}]']:+.1f}%{'' if row['step_pass'] else ', **misses**'}) "
                f"| {row[f'predicted_exposed_comm_pct[{head}]']:.1f} / {row['measured_exposed_comm_pct']:.1f}% "
                f"({row[f'exposed_error_pp[{head}]']:+.1f} pp{'' if row['exposed_pass'] else ', **misses**'}) "
                f"| {row['step_error_pct[unpaced]']:+.1f}% | {by_round} % |"
            )
    goal = record["goal"]
    return [
        *lines,
        "",
        f"Goal: step time within {100 * goal['step_time_relative']:.0f}% and exposed communication within "
        f"{goal['exposed_comm_pp']:g} pp at every cap, both jobs: **{'met' if record['goal_met'] else 'not met'}**. "
        f"{record['rounds_per_cap']} rounds per job and cap, each a paced pair of 1-worker runs, its prediction "
        "written, then a 2-worker run; the headline compares the medians over rounds. Pace: each paced 1-worker "
        "run's idle per collective point.",
        "",
        f"- {provenance(record, name)}",
        "",
        *block_figure(folder, [name]),
    ]


def block_minicluster_bandwidth(folder: Path, names: list[str]) -> list[str]:
    record = load(folder, "minicluster_bandwidth")
    lines = [
        "| link cap | A/B overhead | all-reduce in the run | idle all-reduce probe | bandwidth bound | step |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in record["rows"]:
        bound = f"{row['bandwidth_bound_ms']:.1f} ms" if row.get("bandwidth_bound_ms") else "—"
        lines.append(
            f"| {row['link_bandwidth']} | {row['comm_overhead_pct']:.1f}% | {row['allreduce_ms']:.1f} ms | "
            f"{row['probe_allreduce_ms']:.1f} ms | {bound} | {row['step_ms']:.1f} ms |"
        )
    hw = record["machine"]
    return [
        *lines,
        "",
        f"{record['what']}; {record['gradient_bytes'] / 1e6:.2f} MB of gradients per step.",
        "",
        f"- `bench/results/minicluster_bandwidth.json`: {record['date'][:10]}, {hw['cpu_model']}, "
        f"{hw['cpu_count']} CPUs; `{record['command']}`",
    ]


def block_interference(folder: Path, names: list[str]) -> list[str]:
    """Per arm of the interference ground truth: the three communication figures and the measured slowdown."""
    import interference_ground_truth as igt

    record = load(folder, "interference_ground_truth")
    lines = [
        "| arm | bucket cap | step | communicating | exposed | A/B overhead | interference | overlap slowdown | runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, arm_figures in record["by_arm"].items():
        runs = [r for r in record["runs"] if r["arm"] == name]
        slowdowns = ", ".join(f"{r['overlap_slowdown']:.2f}" for r in runs if r.get("overlap_slowdown") is not None)
        lines.append(
            f"| {name} | {igt.CAPS_MB[name]:g} MB | {1e3 * arm_figures['step_s']:.1f} ms | "
            f"{arm_figures['allreduce_pct']:.1f}% | {arm_figures['exposed_comm_pct']:.1f}% | "
            f"{arm_figures['comm_overhead_pct']:.1f}% | {1e3 * arm_figures['interference_s']:.1f} ms | "
            f"{arm_figures['overlap_slowdown']:.2f} ({slowdowns}) | {len(runs)} |"
        )
    return [
        *lines,
        "",
        "Medians per arm; the slowdown per run in brackets.",
        "",
        *comparison_table([("interference_ground_truth", record)]),
    ]


def block_figure(folder: Path, names: list[str]) -> list[str]:
    (name,) = names
    source = folder / f"{name}.png"
    if not source.exists():
        raise SystemExit(f"summarize: {source.relative_to(bl.REPO)} is missing (a docs block asks for it)")
    copy = FIGURES / source.name
    if not copy.exists() or copy.read_bytes() != source.read_bytes():
        STALE_FIGURES.append(copy.relative_to(bl.REPO).as_posix())
        if WRITE:
            FIGURES.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
    return [f"![{name}](figures/bench/{source.name})"]


WRITE = True  # False under --check: nothing is written
STALE_FIGURES: list[str] = []  # figure copies that differed from bench/results/

BLOCKS = {
    "table": block_table,
    "make-bench": block_make_bench,
    "anchors": block_anchors,
    "torchtitan": block_torchtitan,
    "projection-vs-minicluster": block_projection_vs_minicluster,
    "projection-own-jobs": block_projection_own_jobs,
    "minicluster-bandwidth": block_minicluster_bandwidth,
    "interference": block_interference,
    "figure": block_figure,
}


def render_page(text: str, folder: Path, page: Path) -> str:
    def replace(match: re.Match) -> str:
        kind, *names = match["key"].split()
        if kind not in BLOCKS:
            raise SystemExit(
                f"summarize: {page.relative_to(bl.REPO)} asks for an unknown block {kind!r}; known: {', '.join(BLOCKS)}"
            )
        body = "\n".join(BLOCKS[kind](folder, names))
        key = match["key"]
        return f"<!-- begin bench/summarize.py: {key} -->\n{body}\n<!-- end bench/summarize.py: {key} -->"

    return MARKER.sub(replace, text)


QUOTE = re.compile(r"<!-- quote (?P<key>[^>]*?) -->(?P<text>[^\n]*?)<!-- /quote -->")


def quoted(folder: Path, key: str) -> str:
    """The text of one inline quote (module docstring): `FILE PATH [*SCALE] [+-OFFSET] [SPEC]` from FILE's result."""
    name, path, *rest = key.split()
    record = load(folder, name)
    if path == "@date":
        return record["date"][:10]
    if path == "@machine":
        return machine(record)
    if path == "@source":
        return f"`bench/results/{name}.json`, {record['date'][:10]}, {machine(record)}"
    v = record
    for part in path.split("/"):
        try:
            v = v[int(part)] if isinstance(v, list) else v[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise KeyError(f"{name}.json has no {path!r} (at {part!r})") from None
    spec = "g"
    for token in rest:  # arithmetic in the order written, then the format
        if token[0] == "*":
            v = v * float(token[1:])
        elif token[0] in "+-" and token[1:2].isdigit():
            v = v + float(token)
        else:
            spec = token
    return format(v, spec)


OPENED = re.compile(r"<!-- (?:quote |begin bench/summarize\.py: )[^>]*?-->")


def unclosed_markers(text: str) -> list[str]:
    """The quote and block markers of a page that have no closing marker: each opening marker is counted
    against the ones `QUOTE` and `MARKER` match whole, so a page whose quote lost its `<!-- /quote -->`
    fails the check instead of being skipped."""
    closed = {m.start() for m in QUOTE.finditer(text)} | {m.start() for m in MARKER.finditer(text)}
    return [m.group(0) for m in OPENED.finditer(text) if m.start() not in closed]


def markdown_pages() -> list[Path]:
    """Every Markdown page of the repository (docs, the README, the folders' READMEs, the committed results'
    README): what the quote check reads. Generated folders (a venv, the built site, runs) are not walked."""
    skip = {".venv", "build", ".git", ".pytest_cache", "node_modules", "site"}
    pages = []
    for folder, subfolders, files in os.walk(bl.REPO):
        subfolders[:] = sorted(d for d in subfolders if d not in skip and not d.startswith("."))
        if Path(folder) == bl.REPO:
            subfolders[:] = [d for d in subfolders if d != "results"]  # runs and sweeps (make demo's)
        pages += [Path(folder) / f for f in sorted(files) if f.endswith(".md")]
    return pages


def render_quotes(text: str, folder: Path, page: Path) -> str:
    """Every inline quote of the page rewritten from its result."""
    if unclosed := unclosed_markers(text):
        raise SystemExit(f"summarize: {page.name}: a marker without its closing marker: {unclosed[0]}")

    def replace(match: re.Match) -> str:
        if match.start() == 0 or text[match.start() - 1] == "\n":
            # Markdown reads a line that opens with `<!--` as a raw HTML block, not as prose
            raise SystemExit(
                f"summarize: {page.name}: <!-- quote {match['key']} --> opens a line; put a word before it"
            )
        try:
            return f"<!-- quote {match['key']} -->{quoted(folder, match['key'])}<!-- /quote -->"
        except (KeyError, ValueError) as e:
            raise SystemExit(f"summarize: {page.name}: bad quote <!-- quote {match['key']} -->: {e}") from None

    return QUOTE.sub(replace, text)


def stale_pages(pages: list[Path], folder: Path, write: bool) -> list[Path]:
    """The pages whose blocks or quotes differ from the results in `folder`; rewritten where `write`."""
    stale = []
    for page in pages:
        text = page.read_text()
        new = render_quotes(render_page(text, folder, page), folder, page)
        if new != text:
            stale.append(page)
            if write:
                page.write_text(new)
    return stale


def quick_page(folder: Path) -> str:
    names = sorted(p.stem for p in folder.glob("*.json"))
    records = [
        (n, r)
        for n in names
        if isinstance((r := json.loads((folder / f"{n}.json").read_text())).get("comparisons"), list)
        and r["comparisons"]
    ]
    if not records:
        raise SystemExit(
            f"no benchmark results with comparisons in {folder.relative_to(bl.REPO)}; run `make bench QUICK=1` first"
        )
    return "\n".join(
        [
            "# Quick benchmarks (not committed)",
            "",
            "`make bench QUICK=1`: a check that every benchmark runs, too short to be a measurement.",
            "",
            *comparison_table(records),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="render bench/results/quick/ into bench/results/quick/README.md"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a docs block or quoted figure differs from the results",
    )
    args = parser.parse_args(argv)
    folder = bl.results_dir(args.quick)
    if args.quick:
        out = folder / "README.md"
        out.write_text(quick_page(folder))
        print(f"wrote {out.relative_to(bl.REPO)}")
        return 0
    global WRITE
    WRITE = not args.check
    stale = [
        page.relative_to(bl.REPO).as_posix() for page in stale_pages(markdown_pages(), folder, write=not args.check)
    ]
    stale += STALE_FIGURES
    if args.check:
        if stale:
            print(
                f"summarize: out of date with bench/results/: {', '.join(stale)} (run bench/summarize.py)",
                file=sys.stderr,
            )
            return 1
        print("summarize: every docs block and quoted figure matches bench/results/")
        return 0
    print(f"updated {', '.join(stale)}" if stale else "every docs block already matched bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
