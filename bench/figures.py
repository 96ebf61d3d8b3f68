"""The benchmarks' figures, kept for the docs: a figure the docs state is never typed.

Each benchmark, run by ``make bench``, keeps its headline figures here (``keep``): one entry per
benchmark in ``bench/figures.json``, with the day, the commit and the cores it ran on. The docs
quote a figure between two marks, ``<!-- bench session.live_local -->2.0 ms<!-- /bench -->``;
``python bench/figures.py`` (the last step of ``make bench``) writes each mark's text from the
file, the docs build (``docs/_ext/hvd_figures.py``) reads the file too, and ``tests/test_docs.py``
fails where a mark's text is not the file's or names no kept figure.

Usage: python bench/figures.py [--check]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "figures.json"
MARK = re.compile(r"<!-- bench (?P<key>[\w-]+\.[\w-]+) -->(?P<text>.*?)<!-- /bench -->", re.S)


def pages() -> list[Path]:
    """Where the docs quote figures: the README and the guide's pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def kept() -> dict[str, dict[str, object]]:
    try:
        return dict(json.loads(FIGURES.read_text()))
    except FileNotFoundError:
        return {}


def texts() -> dict[str, str]:
    """Every kept figure's text, by ``bench.name``."""
    return {
        f"{bench}.{name}": str(text)
        for bench, entry in kept().items()
        for name, text in dict(entry["figures"]).items()  # type: ignore[call-overload]
    }


def keep(bench: str, figures: dict[str, str]) -> None:
    """Keep ``bench``'s figures (their texts as the docs quote them), replacing its last run's."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    entry = {
        "measured": datetime.date.today().isoformat(),
        "commit": commit,
        "cores": os.cpu_count(),
        "figures": figures,
    }
    everything = kept() | {bench: entry}
    FIGURES.write_text(json.dumps(dict(sorted(everything.items())), indent=1, ensure_ascii=False) + "\n")


def filled(text: str, figures: dict[str, str]) -> str:
    """``text`` with each mark's figure the kept one (a mark with no kept figure stays)."""

    def fill(match: re.Match[str]) -> str:
        key = match["key"]
        figure = figures.get(key, match["text"])
        return f"<!-- bench {key} -->{figure}<!-- /bench -->"

    return MARK.sub(fill, text)


def stale() -> list[str]:
    """Each mark whose text is not its kept figure, or that names none: ``page: key: why``."""
    figures, found = texts(), []
    for page in pages():
        for match in MARK.finditer(page.read_text()):
            key, text = match["key"], match["text"]
            if key not in figures:
                found.append(f"{page.relative_to(ROOT)}: {key}: no such figure in bench/figures.json")
            elif text != figures[key]:
                found.append(
                    f"{page.relative_to(ROOT)}: {key}: says {text!r}, the last run measured {figures[key]!r}"
                )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only list the marks that differ")
    args = parser.parse_args()
    if not args.check:
        figures = texts()
        for page in pages():
            text = page.read_text()
            if (new := filled(text, figures)) != text:
                page.write_text(new)
                print(f"figures written into {page.relative_to(ROOT)}")
    wrong = stale()
    for line in wrong:
        print(line)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
