"""Figures quoted in the docs' prose are checked against their results (bench/summarize.py's inline
quotes): a wrong number planted in a copy of a page makes `--check`'s comparison fail, and the
right one passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import summarize  # noqa: E402

RESULTS = REPO / "bench" / "results"
MARK = "<!-- quote instrumentation_overhead comparisons/0/a_median *1000 .1f -->"


SOURCE = summarize.quoted(RESULTS, "instrumentation_overhead @source")


def _page(tmp_path: Path, figure: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(
        f"The instrumented step took {MARK}{figure}<!-- /quote --> ms "
        f"(<!-- quote instrumentation_overhead @source -->{SOURCE}<!-- /quote -->).\n"
    )
    return page


def test_a_wrong_quoted_figure_fails_the_check(tmp_path):
    right = summarize.quoted(RESULTS, "instrumentation_overhead comparisons/0/a_median *1000 .1f")
    wrong = f"{float(right) + 5.0:.1f}"
    assert summarize.stale_pages([_page(tmp_path, right)], RESULTS, write=False) == []
    page = _page(tmp_path, wrong)
    assert summarize.stale_pages([page], RESULTS, write=False) == [page]
    assert wrong in page.read_text()  # --check writes nothing
    summarize.stale_pages([page], RESULTS, write=True)  # a run without --check rewrites it from the result
    assert f"{MARK}{right}<!-- /quote --> ms" in page.read_text()
    assert summarize.stale_pages([page], RESULTS, write=False) == []


def test_the_readme_and_docs_quotes_match_their_results():
    # each real page that quotes a figure matches its results, and with its first quote made wrong
    # it no longer does: the quote is rewritten from the result (what --check compares)
    pages = [p for p in summarize.markdown_pages() if "<!-- quote " in p.read_text()]
    assert pages, "no page quotes a figure"
    for page in pages:
        text = page.read_text()
        match = summarize.QUOTE.search(text)
        assert summarize.render_quotes(text, RESULTS, page) == text, f"{page.name}: a quote differs from its result"
        wrong = text[: match.start("text")] + "-1" + text[match.end("text") :]
        assert summarize.render_quotes(wrong, RESULTS, page) == text, page.name


def test_a_quote_naming_nothing_fails_with_its_marker(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- quote instrumentation_overhead comparisons/9/ratio .3f -->1.0<!-- /quote -->\n")
    with pytest.raises(SystemExit, match="comparisons/9/ratio"):
        summarize.stale_pages([page], RESULTS, write=False)


def test_every_markdown_page_of_the_repository_is_read():
    pages = {p.relative_to(REPO).as_posix() for p in summarize.markdown_pages()}
    assert {"README.md", "scaling/projection/README.md", "cluster/README.md", "docs/method.md"} <= pages


@pytest.mark.parametrize(
    "text",
    [
        "The step took <!-- quote instrumentation_overhead comparisons/0/a_median *1000 .1f -->77.7 ms.\n",
        "<!-- begin bench/summarize.py: table ray_overhead -->\n| a |\n",
    ],
)
def test_a_marker_without_its_closing_marker_fails(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(SystemExit, match="without its closing marker"):
        summarize.stale_pages([page], RESULTS, write=False)
