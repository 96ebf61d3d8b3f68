"""The documentation's whole examples run: each code block in README.md or docs/*.md marked with
``<!-- example: runs in tests/test_docs.py -->`` on the line above its opening fence, Python and
IPython blocks in a real IPython shell with the extension loaded, shell blocks in bash."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from IPython.core.interactiveshell import InteractiveShell

ROOT = Path(__file__).parent.parent
MARKER = "<!-- example: runs in tests/test_docs.py -->"
FENCE = re.compile(r"(`{3,}|~{3,})\s*([\w+-]*)")
PYTHON = {"python", "python3", "py", "ipython", "ipython3"}
SHELL = {"bash", "sh", "console", "shell"}


class Example(NamedTuple):
    where: str  # "docs/page.md:LINE", the marker's line
    language: str
    source: str


def marked_examples() -> list[Example]:
    examples = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if line.strip() != MARKER:
                continue
            where = f"{page.relative_to(ROOT)}:{number}"
            opening = FENCE.fullmatch(lines[number].strip()) if number < len(lines) else None
            assert opening, f"{where}: the marker is not directly above a code fence"
            fence, language = opening.groups()
            body = lines[number + 1 :]
            end = next((i for i, text in enumerate(body) if text.strip() == fence), None)
            assert end is not None, f"{where}: the block is never closed"
            examples.append(Example(where, language.lower(), "\n".join(body[:end]) + "\n"))
    return examples


EXAMPLES = marked_examples()


def test_the_docs_keep_their_examples_marked() -> None:
    assert len(EXAMPLES) >= 6, [example.where for example in EXAMPLES]
    unknown = [example.where for example in EXAMPLES if example.language not in PYTHON | SHELL]
    assert not unknown, f"marked blocks whose fence names no language this test runs: {unknown}"


def run_shell(example: Example, folder: Path) -> None:
    """In bash, strict, with the venv's ``python`` first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", example.source],
        cwd=folder,
        env=os.environ | {"PATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{example.where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.where for example in EXAMPLES])
def test_example_runs(
    example: Example, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # what an example writes lands in a folder of its own
    if example.language in SHELL:
        run_shell(example, tmp_path)
        return
    ip: InteractiveShell = request.getfixturevalue("ip")  # the extension loaded, processes checked
    result = ip.run_cell(example.source)  # type: ignore[no-untyped-call]
    error = result.error_before_exec or result.error_in_exec
    assert error is None, f"{example.where} raised {type(error).__name__}: {error}"
