"""``{hvd-options}``: the table of a run's options, made from ``hvd_magic.options.OPTIONS``.

That table is also what the ``%%horovod`` parser, ``%%horovod?`` and the keyword APIs' checks are
made from, so this page cannot drift from them: each option as the line spells it, and as Python
takes it (its keyword, type and default, which tests hold the keyword APIs to). In docs/options.md::

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


def in_python(entry: Any, keyword: Any) -> str:
    """``min_np: int | None = None``: how a keyword API takes the option."""
    from hvd_magic.options.option import REQUIRED

    kind = keyword.kind.__name__ if isinstance(keyword.kind, type) else str(keyword.kind)
    default = "" if keyword.default is REQUIRED else f" = {keyword.default!r}"
    return f"{keyword.name or entry.key}: {kind.replace('typing.', '')}{default}"


def keyword_cell(entry: Any, short: dict[str, str]) -> list[nodes.Node]:
    """The option as Python takes it where a keyword API does (else its keyword, if not its name),
    and where one takes it otherwise (Session's ``timeline``, the estimators' ``num_proc``)."""
    from hvd_magic.options.option import ESTIMATORS, RUNNER, SESSION, SESSION_RUN

    if not entry.where & {RUNNER, SESSION, SESSION_RUN, ESTIMATORS}:
        if not entry.keyword:
            return []
        return [nodes.Text(" (keyword "), nodes.literal(entry.key, entry.key), nodes.Text(")")]
    said = [nodes.Text(" (Python "), nodes.literal("", in_python(entry, entry.python))]
    for place, keyword in (entry.python_at or {}).items():
        said += [nodes.Text(f"; {short[place]}: "), nodes.literal("", in_python(entry, keyword))]
    return [*said, nodes.Text(")")]


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
        where = ", ".join(label for place, label in short.items() if place in entry.where)
        body += row(
            cell(nodes.literal(spelled, spelled), *keyword_cell(entry, short)),
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
