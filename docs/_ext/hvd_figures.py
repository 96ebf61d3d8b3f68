"""Figures the benchmarks measured, in the pages as the last ``make bench`` kept them.

A page quotes a figure between two marks, ``<!-- bench session.live_local -->2.0 ms<!-- /bench -->``
(``bench/figures.py``, whose file and marks this reads); as it reads each page, the build puts
the figure kept in ``bench/figures.json`` there and drops the marks. A mark that names no kept
figure is a warning, so ``make docs`` (warnings as errors) fails on it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
import figures  # noqa: E402 - bench/figures.py, the one reader of the kept figures

logger = logging.getLogger(__name__)


def fill(app: Sphinx, docname: str, source: list[str]) -> None:
    kept = figures.texts()

    def figure(match: re.Match[str]) -> str:
        key = match["key"]
        if key not in kept:
            logger.warning("%s: no figure %r in bench/figures.json (run make bench)", docname, key)
            return match["text"]
        return kept[key]

    source[0] = figures.MARK.sub(figure, source[0])


def fill_included(app: Sphinx, path: Path, docname: str, content: list[str]) -> None:
    fill(app, docname, content)  # the parts of README.md that index.md includes


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", fill)
    app.connect("include-read", fill_included)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
