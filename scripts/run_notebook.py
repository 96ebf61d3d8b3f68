"""Executes a notebook headless (nbclient) and prints what its cells printed and returned.

Usage: python scripts/run_notebook.py NOTEBOOK [--output EXECUTED.ipynb] [--html REPORT.html]

With --html, the executed notebook is also exported to HTML: the run's final progress grid,
curves, logs and timeline analysis, readable without Jupyter.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--output", type=Path, help="where to save the executed notebook")
    parser.add_argument("--html", type=Path, help="where to write the executed notebook as an HTML report")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = parser.parse_args()
    notebook = nbformat.read(args.notebook, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(args.notebook.parent)}},
    )
    try:
        client.execute()
        failed = False
    except CellExecutionError as err:
        print(f"a cell failed:\n{err}", file=sys.stderr)
        failed = True
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                print(output["text"], end="")
            elif output.get("output_type") == "display_data" and "text/plain" in output["data"]:
                print(output["data"]["text/plain"])
            elif output.get("output_type") == "execute_result":
                print(f"Out[{output.get('execution_count')}]: {output['data'].get('text/plain', '')}")
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
