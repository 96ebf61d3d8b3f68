"""A notebook executed headless (nbclient) and exported to HTML keeps the run's final curves."""

from __future__ import annotations

import json
import re

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

CELL = """%%horovod np=-2
import hvd_magic, horovod.torch as hvd
hvd.init()
for step in range(1, 21):
    hvd_magic.report(step=step, total=20, epoch=0, loss=1.0 / (step + hvd.rank()))
print("trained on rank", hvd.rank())
hvd.rank()
"""


def test_executed_notebook_html_has_the_final_curve_data(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%load_ext hvd_magic"), nbformat.v4.new_code_cell(CELL)]
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources).execute()
    outputs = notebook.cells[1].outputs
    assert outputs[-1]["output_type"] == "execute_result" and outputs[-1]["data"]["text/plain"] == "0"
    html, _ = HTMLExporter().from_notebook_node(notebook)
    (tmp_path / "run.html").write_text(html)
    record = html[html.index('class="hvd-final"') :]
    data = json.loads(re.search(r"<script[^>]*hvd-metrics[^>]*>(.*?)</script>", record).group(1))
    assert data["loss"]["rank 0"]["value"] == [1.0 / s for s in range(1, 21)]
    assert data["loss"]["rank 1"]["value"] == [1.0 / (s + 1) for s in range(1, 21)]
    grid = record[: record.index("</table>")]
    assert grid.count('data-progress="100"') == 2  # both bars full in the saved record
    assert "trained on rank 1" in html  # the rank logs are kept too
