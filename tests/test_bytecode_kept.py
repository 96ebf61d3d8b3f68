"""scripts/bytecode.py keeps a venv's bytecode for the next venv of the same pins: taken where
Python accepts it (the same source size and time, as uv's links give every venv), recompiled by
Python where not, and the kept copy never written into."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bytecode  # noqa: E402

SOURCE = "ANSWER = {}\n"


def venv_site(root: Path, answer: int, mtime: int) -> Path:
    """A site folder with one package whose module says ``answer`` (the same size whatever the
    digit), its files' modification time ``mtime`` (the package's too: two venvs made more than a
    second apart would otherwise differ in it, and its bytecode be stale in the later one)."""
    site = root / "site-packages"
    module = site / "pinned" / "module.py"
    module.parent.mkdir(parents=True)
    (site / "pinned" / "__init__.py").write_text("")
    module.write_text(SOURCE.format(answer))
    for source in (module, site / "pinned" / "__init__.py"):
        os.utime(source, (mtime, mtime))
    return site


def answer_in(site: Path) -> int:
    """What ``pinned.module`` says when a fresh Python imports it from ``site``."""
    code = "import pinned.module as m; print(m.ANSWER)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(site)}
    return int(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
    )


def compiled(site: Path) -> Path:
    source = site / "pinned" / "module.py"
    cfile = importlib.util.cache_from_source(str(source))
    mode = py_compile.PycInvalidationMode.TIMESTAMP  # as Python writes it on import
    return Path(py_compile.compile(str(source), cfile=cfile, invalidation_mode=mode))


def test_a_venv_takes_the_kept_bytecode_where_python_accepts_it_and_recompiles_where_not(tmp_path):
    kept = tmp_path / "cache" / "bytecode" / "pins-a"
    first = venv_site(tmp_path / "first", answer=1, mtime=1_700_000_000)
    pyc = compiled(first)
    first_bytes = pyc.read_bytes()
    rewritten = pyc.with_name(f"module.{sys.implementation.cache_tag}-pytest-9.2.0.pyc")  # pytest's: not kept
    rewritten.write_bytes(first_bytes)
    assert bytecode.keep(kept, first) == 1
    assert (kept / pyc.relative_to(first)).samefile(pyc)
    assert not (kept / rewritten.relative_to(first)).exists()

    # The same size and time (as a link from uv's cache has): Python runs the kept bytecode. The
    # source here says 2, so the answer 1 can only have come from the bytecode of the first venv.
    second = venv_site(tmp_path / "second", answer=2, mtime=1_700_000_000)
    assert bytecode.take_kept(kept, second) == (1, set())  # taken, and nothing stale
    assert answer_in(second) == 1

    # Another time: not taken by Python, which compiles the source anew and replaces the link;
    # the kept file is still the first venv's, and a second take adds nothing
    third = venv_site(tmp_path / "third", answer=3, mtime=1_800_000_000)
    assert bytecode.take_kept(kept, third) == (1, {third / "pinned"})  # the package to compile anew
    assert answer_in(third) == 3
    assert (kept / pyc.relative_to(first)).read_bytes() == first_bytes  # never written into
    assert bytecode.take_kept(kept, third) == (0, set())  # Python's own now, fresh

    # Kept again from the third venv: its fresh bytecode replaces the kept one, which was stale
    # there (and its package's, which the imports compiled, is new)
    assert bytecode.keep(kept, third) == 2
    assert not (kept / pyc.relative_to(first)).samefile(pyc)
    fourth = venv_site(tmp_path / "fourth", answer=4, mtime=1_800_000_000)
    assert bytecode.take_kept(kept, fourth) == (2, set())
    assert answer_in(fourth) == 3


def test_only_the_newest_pins_are_kept(tmp_path):
    site = venv_site(tmp_path / "venv", answer=1, mtime=1_700_000_000)
    compiled(site)
    folders = [tmp_path / "bytecode" / name for name in ("pins-a", "pins-b", "pins-c")]
    for age, folder in enumerate(folders):
        bytecode.keep(folder, site)
        os.utime(folder, (1_700_000_000 + age, 1_700_000_000 + age))
    bytecode.keep(folders[2], site)
    assert sorted(path.name for path in (tmp_path / "bytecode").iterdir()) == ["pins-b", "pins-c"]
