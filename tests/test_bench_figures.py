"""The docs' measured figures are the benchmarks' (``bench/figures.py``): a mark's text is what
the last ``make bench`` kept, and every mark names a kept figure; the docs build fills them too."""

from __future__ import annotations

import json
from pathlib import Path

from .guards import bench

figures = bench("figures")


def test_every_figure_the_docs_quote_is_the_last_runs():
    assert figures.stale() == [], "run `python bench/figures.py` (or make bench) and commit the docs"


def test_the_docs_quote_figures_of_each_headline_benchmark():
    marks = [match for page in figures.pages() for match in figures.MARK.finditer(page.read_text())]
    quoted = {match["key"].split(".")[0] for match in marks}
    assert {"session", "launch", "timeline_parse", "stragglers", "live_view"} <= quoted


def test_filling_puts_the_kept_figure_in_each_mark_and_leaves_unknown_ones():
    text = "a <!-- bench a.x -->1 ms<!-- /bench --> and <!-- bench a.y -->2 s<!-- /bench -->."
    assert figures.filled(text, {"a.x": "0.5 ms"}) == (
        "a <!-- bench a.x -->0.5 ms<!-- /bench --> and <!-- bench a.y -->2 s<!-- /bench -->."
    )


def test_keep_replaces_one_benchmarks_entry_and_keeps_the_others(tmp_path: Path, monkeypatch):
    kept = tmp_path / "figures.json"
    kept.write_text(json.dumps({"other": {"figures": {"z": "9 s"}}, "mine": {"figures": {"old": "1 s"}}}))
    monkeypatch.setattr(figures, "FIGURES", kept)
    figures.keep("mine", {"new": "2 ms"})
    assert figures.texts() == {"other.z": "9 s", "mine.new": "2 ms"}
    entry = json.loads(kept.read_text())["mine"]
    assert entry["cores"] and entry["measured"] and entry["commit"]
