"""scripts/mypy_check.py: a fresh clone's mypy starts from the cache the last clean check kept,
checks cold where mypy crashes on it, and keeps only a cache that a clean check left."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import mypy_check  # noqa: E402


def a_cache(folder: Path, text: str) -> Path:
    (folder / "3.11" / "pkg").mkdir(parents=True)
    (folder / "3.11" / "pkg" / "mod.meta.json").write_text(text)
    return folder


def test_a_clean_check_keeps_its_cache_and_a_fresh_clone_takes_it(tmp_path):
    kept = tmp_path / "kept" / "pins.tar"
    first = a_cache(tmp_path / "first" / ".mypy_cache", "first clone")
    seen = []
    assert mypy_check.main(kept, first, check=lambda: seen.append("checked") or 0) == 0
    assert kept.is_file()
    fresh = tmp_path / "fresh" / ".mypy_cache"
    fresh.parent.mkdir()

    def check() -> int:  # what mypy finds when it starts
        seen.append((fresh / "3.11" / "pkg" / "mod.meta.json").read_text())
        return 0

    assert mypy_check.main(kept, fresh, check=check) == 0
    assert seen == ["checked", "first clone"]
    assert not list(fresh.parent.glob("*.part"))


def test_a_clone_with_its_own_cache_keeps_it(tmp_path):
    kept = tmp_path / "pins.tar"
    mypy_check.keep(kept, a_cache(tmp_path / "other", "another clone's"))
    own = a_cache(tmp_path / "own" / ".mypy_cache", "its own")
    assert not mypy_check.take(kept, own)
    assert (own / "3.11" / "pkg" / "mod.meta.json").read_text() == "its own"


def test_a_crash_on_the_kept_cache_checks_again_cold_and_a_failed_check_keeps_nothing(tmp_path):
    kept = tmp_path / "pins.tar"
    mypy_check.keep(kept, a_cache(tmp_path / "old", "stale"))
    fresh = tmp_path / "fresh" / ".mypy_cache"
    fresh.parent.mkdir()
    statuses = iter([2, 1])  # crashed on the kept cache; then, cold, a type error

    def check() -> int:
        status = next(statuses)
        if status == 1:
            assert not fresh.exists()  # the second check started cold
            a_cache(fresh, "with a type error")
        return status

    before = kept.read_bytes()
    assert mypy_check.main(kept, fresh, check=check) == 1
    assert kept.read_bytes() == before  # not replaced by a failed check's cache


def test_only_the_newest_pins_caches_are_kept(tmp_path):
    """The kept bytecode's rule (``bytecode.prune``): a third pins' cache removes the oldest."""
    for age, name in enumerate(("pins-a", "pins-b", "pins-c")):
        kept = tmp_path / "kept" / f"{name}.tar"
        mypy_check.keep(kept, a_cache(tmp_path / name, name))
        os.utime(kept, (1_700_000_000 + age, 1_700_000_000 + age))
    mypy_check.keep(tmp_path / "kept" / "pins-c.tar", tmp_path / "pins-c")
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == ["pins-b.tar", "pins-c.tar"]
