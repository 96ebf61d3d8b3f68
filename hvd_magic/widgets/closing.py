"""Closing a widget with everything its state holds (children, layout, style).

ipywidgets' ``Widget.close()`` closes one model: a closed box leaves its children, and every
widget its ``layout`` and ``style`` models, open in the kernel, where they are kept (and saved
into the notebook's widget state) as long as the kernel lives. A live view closes its whole tree
once its static record has taken its place.
"""

from __future__ import annotations

from typing import Any

from ipywidgets import Widget

__all__ = ["close_tree"]


def close_tree(root: Widget) -> int:
    """Close ``root`` and every widget reachable from its synced traits; returns how many
    were open.

    >>> close_tree(ipywidgets.VBox([ipywidgets.HTML("a")]))   # doctest: +SKIP
    5
    """
    closed = 0
    seen: set[int] = set()
    pending = [root]
    while pending:
        widget = pending.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        pending.extend(_referred(widget))
        if widget.comm is not None:
            closed += 1
        widget.close()
    return closed


def _referred(widget: Widget) -> list[Widget]:
    found: list[Widget] = []
    for name in widget.keys:
        value: Any = getattr(widget, name, None)
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Widget):
                found.append(item)
    return found
