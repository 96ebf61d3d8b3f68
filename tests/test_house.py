"""The house's folders say where code runs, and the imports keep to it.

- ``hvd_magic.rank``: all that runs inside a rank; it imports only ``rank``, ``protocol``,
  ``errors`` and ``data``.
- ``hvd_magic.protocol``: what every hop speaks; it imports none of ours.
- ``hvd_magic.server``: the Jupyter server's extension; it imports only ``protocol``, and
  nothing imports it.
- Every folder has its floor (``FLOORS``): imports go down, never up or sideways.
- ``hvd_magic.launch.task``: what runs inside Spark tasks; never the notebook's side.
- The notebook's side (everything else) never imports ``rank`` (a rank's code) nor
  ``notebook`` (the user's entry points, which sit on top of it all).

A rank process is checked for real too: what a rank has loaded once its cell ran (here, and
on Spark in ``test_launch_spark.py``).
"""

from __future__ import annotations

import json
import re

from .test_layout import PACKAGE, imports_of, modules

# warm: a warm rank is forked from a server that loaded it (and Spark tasks keep those servers)
RANK_SIDE = ("hvd_magic.rank", "hvd_magic.warm", "hvd_magic.protocol", "hvd_magic.errors", "hvd_magic.data")
NEVER_IN_A_RANK = ("IPython", "ipykernel", "ipywidgets", "pyspark", "plotly", "anywidget")
# The package's face hands out the rank's API (report, progress, checkpoint, ...); the others ship
# rank functions by reference (TorchDistributor's; the estimators' training, in hvd_magic.spark).
MAY_IMPORT_RANK = ("hvd_magic", "hvd_magic.integrations", "hvd_magic.spark", "hvd_magic.notebook.distributor")

LOADED_CELL = """
import json, sys
import hvd_magic
hvd_magic.report(step=1)
json.dumps([
    sorted(m for m in sys.modules if m.startswith("hvd_magic")),
    sorted({m.split(".")[0] for m in sys.modules} & set(NEVER)),
])
"""


def within(name: str, *folders: str) -> bool:
    return any(name == folder or name.startswith(folder + ".") for folder in folders)


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def crossings(source: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    """Imports from modules under ``source`` to package modules outside ``allowed``."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        if within(name, *source)
        for target in targets
        if not within(target, *allowed)
    )


def test_protocol_imports_none_of_ours():
    assert crossings(("hvd_magic.protocol",), ("hvd_magic.protocol",)) == []
    assert crossings(("hvd_magic.errors",), ()) == []


def test_a_ranks_code_imports_only_the_rank_side():
    assert crossings(("hvd_magic.rank",), RANK_SIDE) == []
    assert crossings(("hvd_magic.warm",), ("hvd_magic.warm", "hvd_magic.protocol")) == []
    assert crossings(("hvd_magic.data",), ("hvd_magic.data", "hvd_magic.protocol", "hvd_magic.errors")) == []


def test_spark_tasks_import_no_notebook_side():
    allowed = (*RANK_SIDE, "hvd_magic.launch", "hvd_magic.hub")
    assert crossings(("hvd_magic.launch.task",), allowed) == []
    notebook = [edge for edge in crossings(("hvd_magic.launch",), ("hvd_magic.launch",)) if "run." in edge]
    assert notebook == []  # launchers are used by the run's supervision, never the other way


def test_the_notebook_side_imports_no_rank_code_and_nothing_imports_the_entry_points():
    notebook_side = tuple(
        name
        for name in modules()
        if not within(name, *RANK_SIDE, "hvd_magic.launch.task", *MAY_IMPORT_RANK[1:]) and name != "hvd_magic"
    )
    into_rank = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        if name in notebook_side
        for target in targets
        if within(target, "hvd_magic.rank")
    ]
    assert into_rank == []
    into_entry_points = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        if not within(name, "hvd_magic.notebook") and name != "hvd_magic"
        for target in targets
        if within(target, "hvd_magic.notebook")
    ]
    assert into_entry_points == []


def test_the_server_extension_imports_only_the_protocol_and_nothing_imports_it():
    assert crossings(("hvd_magic.server",), ("hvd_magic.server", "hvd_magic.protocol")) == []
    into_server = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        if not within(name, "hvd_magic.server")
        for target in targets
        if within(target, "hvd_magic.server")
    ]
    assert into_server == []


# Each folder (or top-level module) on its floor: an import goes to a lower floor or within its own
# folder, never up or sideways, TYPE_CHECKING imports included (docs/architecture.md draws it)
FLOORS = {
    "protocol": 0, "errors": 0,
    "data": 1, "hub": 1, "install": 1, "rank": 1, "server": 1, "warm": 1, "widgets": 1,
    "options": 2, "timeline": 2, "integrations": 2,
    "sinks": 3, "launch": 3,
    "run": 4, "doctor": 4,
    "session": 5, "spark": 5, "__main__": 5,
    "notebook": 6,
    "hvd_magic": 7,
}  # fmt: skip


def floor_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_import_goes_down_a_floor_or_stays_in_its_folder():
    uphill = sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if floor_of(name) != floor_of(target) and FLOORS[floor_of(target)] >= FLOORS[floor_of(name)]
    )
    assert uphill == []
    assert {floor_of(name) for name in modules()} == set(FLOORS)  # a new folder gets its floor here


def test_at_most_eight_modules_at_the_top():
    top = [name for name, path in modules().items() if name.count(".") == 1 and path.name != "__init__.py"]
    assert len(top) <= 8, top


def test_a_local_rank_loads_only_the_rank_side(ip):
    ip.user_ns["NEVER"] = list(NEVER_IN_A_RANK)
    loaded, heavy = json.loads(ip.run_cell_magic("horovod", "np=-1 launcher=gloo", LOADED_CELL))
    assert [name for name in loaded if name != "hvd_magic" and not within(name, *RANK_SIDE)] == []
    assert "hvd_magic.rank.payload" in loaded  # it is a rank's list (the worker is __main__)
    assert heavy == []


def mapped_paths() -> set[str]:
    """The files docs/architecture.md's map names: a row's first path, and the names after it
    (in any column) in that path's folder."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    named = set()
    for row in page.splitlines():
        cells = row.split(" | ")
        first = re.findall(r"`(hvd_magic/[\w/.]*)`", cells[0])
        if not row.startswith("| `hvd_magic/") or not first:
            continue
        folder = first[0] if first[0].endswith("/") else first[0].rsplit("/", 1)[0] + "/"
        named |= {path for path in first if not path.endswith("/")}
        named |= {folder + name for name in re.findall(r"`(\w+\.(?:py|c))`", row)}
    return named


def test_the_architecture_map_names_every_module_and_only_real_ones():
    modules_here = {
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or len(path.read_text().splitlines()) > 10  # an __init__ with code
    }
    named = mapped_paths()
    assert sorted(modules_here - named) == []  # unmapped: say in the map what it is for
    assert sorted(path for path in named if not (PACKAGE.parent / path).exists()) == []
