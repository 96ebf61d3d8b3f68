from __future__ import annotations

import threading

import cloudpickle
import pytest

from hvd_magic.errors import CaptureError
from hvd_magic.protocol import CellPayload
from hvd_magic.run.packing import names_read, pack_cell, pack_function


def test_names_read_covers_functions_and_comprehensions():
    source = "def f():\n    return a + g(b)\n[x * c for x in d]\nglobal e\n"
    assert {"a", "b", "c", "d", "e", "g", "x"} <= names_read(source)


def test_only_names_the_cell_reads_are_shipped():
    ns = {"used": 1, "unused": 2, "helper": lambda: 3, "In": [], "__name__": "__main__"}
    packed = pack_cell("used + helper()\nIn", ns, hidden={"In"})
    payload = cloudpickle.loads(packed.blob)
    assert isinstance(payload, CellPayload)
    assert set(payload.namespace) == {"used", "helper"}
    assert payload.namespace["helper"]() == 3


def test_unpicklable_name_reassigned_by_the_cell_is_not_needed():
    ns = {"lock": threading.Lock()}
    payload = cloudpickle.loads(pack_cell("import threading\nlock = threading.Lock()\nlock", ns).blob)
    assert "lock" not in payload.namespace


def test_ipython_syntax_is_refused_with_advice():
    with pytest.raises(CaptureError, match="cell of its own"):
        pack_cell("get_ipython().run_line_magic('time', 'x')\n", {})


def test_large_payload_gets_a_notice():
    big = bytes(60 * 1024 * 1024)
    packed = pack_cell("len(big)", {"big": big})
    assert packed.notices and "big 60 MB" in packed.notices[0]


def test_function_payload_needs_a_callable():
    with pytest.raises(CaptureError, match="needs a function"):
        pack_function(42, {})  # type: ignore[arg-type]


def test_functions_from_local_modules_travel_by_value(tmp_path, monkeypatch):
    """A helper module next to the notebook is not on the ranks' path (never on Spark executors)."""
    import subprocess
    import sys

    (tmp_path / "helpers_for_capture.py").write_text("SCALE = 3\ndef triple(x):\n    return SCALE * x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import helpers_for_capture

    packed = pack_cell("triple(14)", {"triple": helpers_for_capture.triple})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    loader = (
        "import sys, cloudpickle\nprint(cloudpickle.loads(sys.stdin.buffer.read()).namespace['triple'](14))"
    )
    done = subprocess.run(
        [sys.executable, "-c", loader], input=packed.blob, capture_output=True, cwd=elsewhere, timeout=60
    )
    assert done.stdout.strip() == b"42", done.stderr
