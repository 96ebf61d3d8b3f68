"""hvd_magic's Jupyter server extension: what the JupyterLab extension's Horovod panel reads.

It runs in the Jupyter server (not in a kernel, not in a rank). It finds the run endpoints of
this server's kernels (``protocol.panel``'s files in Jupyter's runtime directory), asks each
with its token, and serves what they say behind Jupyter's own authentication
(``handlers``): the runs at ``GET /hvd-magic/runs``, one at ``GET /hvd-magic/runs/KERNEL/N``,
``POST .../stop`` and ``.../stacks``, and the list again every second on the websocket
``/hvd-magic/updates``. Enabled by the wheel's ``jupyter_server_config.d/hvd_magic.json``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "hvd_magic.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from hvd_magic.server.handlers import add_handlers

    add_handlers(serverapp)
