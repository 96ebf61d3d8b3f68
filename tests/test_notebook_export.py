"""A notebook executed headless by scripts/run_notebook.py (as `make demo` runs one): what it
prints reads as results, and the saved notebook and its HTML export keep the run's final record
but none of the live widgets the run closed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "run_notebook.py"
CELL = """%%horovod np=-2 timeline=on
import hvd_magic, horovod.torch as hvd, torch
hvd.init()
for step in range(1, 21):
    hvd.allreduce(torch.ones(4), name="gradient")
    hvd_magic.report(step=step, total=20, epoch=0, loss=1.0 / (step + hvd.rank()))
print("trained on rank", hvd.rank())
hvd.rank()
"""
# what a user would read as a problem: the repr of an object where a picture was meant, the
# kernel's warning about its transport, TensorFlow's notices
NOISE = re.compile(r"object at 0x|<IPython\.core\.display|without encryption|oneDNN|WARNING")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def run_notebook(tmp_path: Path, cells: list[str]) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    import nbformat  # here: its jsonschema builds a grammar at import (1.7 CPU-s a collecting worker)

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    source, saved, report = tmp_path / "run.ipynb", tmp_path / "saved.ipynb", tmp_path / "run.html"
    nbformat.write(notebook, source)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(source), "--output", str(saved), "--html", str(report)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, saved, report


def test_a_headless_run_prints_results_and_saves_only_its_final_record(tmp_path):
    done, saved, report = run_notebook(tmp_path, ["%load_ext hvd_magic", CELL])
    assert not NOISE.search(done.stdout + done.stderr), done.stdout + done.stderr
    assert done.stderr == ""  # nothing from the kernel process itself
    printed = done.stdout
    assert "hvd_magic: 2 ranks" in printed and "[1] trained on rank 1" in printed  # the run's record
    assert re.search(r"Horovod Timeline viewer: 1 tensor, [\d,]+ spans", printed)  # the viewer, as text
    assert "Horovod Timeline: " in printed and "communication" in printed  # the analysis's summary
    assert "Out[2]: 0" in printed

    import nbformat

    notebook = nbformat.read(saved, as_version=4)
    shown = [
        output.data[WIDGET_VIEW]["model_id"]
        for output in notebook.cells[1].outputs
        if WIDGET_VIEW in output.get("data", {})
    ]
    state = notebook.metadata["widgets"][WIDGET_STATE]["state"]
    # the live view and the viewer shown while the run wrote its timeline were closed: only the
    # final viewer (and its layout) stays in the saved state, which is then small
    assert len(shown) == 1 and shown[0] in state
    assert sorted(model["model_name"] for model in state.values()) == ["AnyModel", "LayoutModel"]
    assert saved.stat().st_size < 200_000 and report.stat().st_size < 1_000_000

    html = report.read_text()
    record = html[html.index('class="hvd-final"') :]
    data = json.loads(re.search(r"<script[^>]*hvd-metrics[^>]*>(.*?)</script>", record).group(1))
    assert data["loss"]["rank 0"]["value"] == [1.0 / s for s in range(1, 21)]
    assert data["loss"]["rank 1"]["value"] == [1.0 / (s + 1) for s in range(1, 21)]
    grid = record[: record.index("</table>")]
    assert grid.count('data-progress="100"') == 2  # both bars full in the saved record
    assert "trained on rank 1" in html  # the rank logs are kept too
    assert "time per activity" in html  # and the timeline's analysis
