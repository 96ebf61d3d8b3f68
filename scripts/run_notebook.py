"""Executes a notebook headless (nbclient) and prints what its cells printed and returned.

Usage: python scripts/run_notebook.py NOTEBOOK [--output EXECUTED.ipynb] [--html REPORT.html]

With --html, the executed notebook is also exported to HTML: the run's final progress grid,
curves, logs and timeline analysis, readable without Jupyter.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config


class ReportClient(NotebookClient):
    """Saves the state of the widgets still open when the notebook ends, as JupyterLab does.

    nbclient keeps the state of every widget the kernel ever opened, closed or not: a live view
    closed at the end of its run (replaced by its static record) would stay in the saved
    notebook and in its HTML export, with plotly's 5 MB script in each figure's state.
    """

    def handle_comm_msg(self, outs: list[Any], msg: dict[str, Any], cell_index: int) -> None:
        super().handle_comm_msg(outs, msg, cell_index)
        if msg["msg_type"] == "comm_close":
            comm_id = msg["content"]["comm_id"]
            self.widget_state.pop(comm_id, None)
            self.widget_buffers.pop(comm_id, None)


def printed(notebook: nbformat.NotebookNode) -> str:
    """What the cells printed and returned, as text: streams, displays' text forms, Out[n]."""
    pieces = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            text = output.get("data", {}).get("text/plain", "")
            if kind == "stream":
                pieces.append(output["text"])
            elif kind == "display_data" and text:  # an emptied live display has none
                pieces.append(f"{text}\n")
            elif kind == "execute_result":
                pieces.append(f"Out[{output.get('execution_count')}]: {text}\n")
    return "".join(pieces)


def execute(notebook: nbformat.NotebookNode, folder: Path, cwd: Path, timeout: int) -> bool:
    """Runs every cell in a new kernel started in ``cwd``; whether a cell failed.

    The kernel's own stderr (what its libraries write below Python, such as TensorFlow's notices
    on import) goes to a log in ``folder``, as under JupyterLab it goes to the server's log and
    not into the notebook; its last lines are shown when the run fails.
    """
    # Unix sockets in a folder of this user's, not TCP on 127.0.0.1: no other user reaches
    # the kernel, and ipykernel has no unencrypted TCP to warn about
    transport = Config({"KernelManager": {"transport": "ipc", "ip": str(folder / "kernel")}})
    client = ReportClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
        config=transport,
    )
    with open(folder / "kernel.log", "w+b") as kernel_log:
        try:
            client.execute(stderr=kernel_log)
        except CellExecutionError as err:
            print(f"a cell failed:\n{err}", file=sys.stderr)
        except BaseException:  # the kernel died, did not start, or Ctrl-C: raised again
            show_tail(kernel_log)
            raise
        else:
            return False
        show_tail(kernel_log)
        return True


def show_tail(log: BinaryIO, lines: int = 30) -> None:
    log.seek(0)
    tail = log.read().decode(errors="replace").splitlines()[-lines:]
    if tail:
        print("the kernel's own stderr ended with:", *tail, sep="\n", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--output", type=Path, help="where to save the executed notebook")
    parser.add_argument("--html", type=Path, help="where to write the executed notebook as an HTML report")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = parser.parse_args()
    notebook = nbformat.read(args.notebook, as_version=4)
    with tempfile.TemporaryDirectory(prefix="run_notebook-") as folder:
        failed = execute(notebook, Path(folder), args.notebook.parent, args.timeout)
    print(printed(notebook), end="")
    if args.output:
        nbformat.write(notebook, args.output)
    if args.html:
        from nbconvert import HTMLExporter

        html, _ = HTMLExporter().from_notebook_node(notebook)
        args.html.write_text(html)
        print(f"report: {args.html.resolve()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
