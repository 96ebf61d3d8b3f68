"""``{hvd-options}``: the table of a run's options, made from ``hvd_magic.options.OPTIONS``.

That table is also what the ``%%horovod`` parser, ``%%horovod?`` and the keyword APIs' checks are
made from, so this page cannot drift from them. Used in docs/options.md::

    ```{hvd-options}
    ```
"""

from __future__ import annotations

import sys
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

HEADER = ("option", "what it does", "default", "where it applies")
WIDTHS = (18, 44, 14, 24)


def cell(*children: nodes.Node) -> nodes.entry:
    entry = nodes.entry()
    entry += nodes.paragraph("", "", *children)
    return entry


def row(*cells: nodes.entry) -> nodes.row:
    found = nodes.row()
    found.extend(cells)
    return found


def options_table() -> nodes.table:
    from hvd_magic.options import OPTIONS
    from hvd_magic.options.option import CELL, ESTIMATORS, RUNNER, SESSION, SESSION_CELL, SESSION_RUN, START

    short = {  # the places in the order of the page's legend
        CELL: "cell",
        START: "start",
        SESSION_CELL: "session cell",
        RUNNER: "Runner",
        SESSION: "Session",
        SESSION_RUN: "Session.run",
        ESTIMATORS: "estimators",
    }

    table = nodes.table(classes=["hvd-options", "colwidths-given"])
    group = nodes.tgroup(cols=len(HEADER))
    table += group
    group.extend(nodes.colspec(colwidth=width) for width in WIDTHS)
    head = nodes.thead()
    head += row(*(cell(nodes.Text(title)) for title in HEADER))
    body = nodes.tbody()
    for entry in OPTIONS:
        spelled = f"{entry.name}={entry.value}"
        keyword = [nodes.Text(" (keyword "), nodes.literal(entry.key, entry.key), nodes.Text(")")]
        where = ", ".join(label for place, label in short.items() if place in entry.where)
        body += row(
            cell(nodes.literal(spelled, spelled), *(keyword if entry.keyword else [])),
            cell(nodes.Text(entry.help)),
            cell(nodes.Text(entry.default or "—")),
            cell(nodes.Text(where)),
        )
    group += head
    group += body
    return table


class HorovodOptions(SphinxDirective):
    """The table of a run's options."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        table = options_table()
        self.env.note_dependency(__file__)
        for name, module in list(sys.modules.items()):  # a changed option rebuilds the page
            if name.startswith("hvd_magic.options"):
                self.env.note_dependency(str(module.__file__))
        return [table]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("hvd-options", HorovodOptions)
    return {"version": "2", "parallel_read_safe": True, "parallel_write_safe": True}
