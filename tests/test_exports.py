"""The public surface: what ``hvd_magic`` exports, and what ``import hvd_magic`` costs."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import hvd_magic
import hvd_magic.errors
import hvd_magic.timeline

PUBLIC = [
    "CaptureError",
    "CheckpointError",
    "DataError",
    "FailureClass",
    "HorovodMagicError",
    "HorovodRunner",
    "LaunchError",
    "LiveCallback",
    "RankFailedError",
    "RunError",
    "RunInterrupted",
    "RunTimeout",
    "Session",
    "SessionEnded",
    "TorchDistributor",
    "checkpoint",
    "load_ipython_extension",
    "progress",
    "report",
    "resized",
    "resume",
    "shard",
    "stopping",
    "timeline",
]

ERRORS = [
    "CaptureError",
    "CheckpointError",
    "DataError",
    "HorovodMagicError",
    "InstallError",
    "LaunchError",
    "RankFailedError",
    "RunError",
    "RunInterrupted",
    "RunTimeout",
    "SessionEnded",
    "TimelineError",
    "TrainerError",
]

TIMELINE = ["Analysis", "Timeline", "TimelineError", "analyze", "export_slice", "read", "spans"]


def test_all_is_exactly_the_documented_set() -> None:
    assert sorted(hvd_magic.__all__) == PUBLIC
    assert len(hvd_magic.__all__) == len(set(hvd_magic.__all__))


@pytest.mark.parametrize("name", [n for n in PUBLIC if n != "LiveCallback"])
def test_every_public_name_resolves(name: str) -> None:
    value = getattr(hvd_magic, name)
    assert value is not None


def test_live_callback_resolves_to_a_keras_callback() -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("LiveCallback needs TensorFlow, which is not installed")
    import tensorflow as tf

    callback = hvd_magic.LiveCallback
    assert inspect.isclass(callback)
    assert issubclass(callback, tf.keras.callbacks.Callback)


def test_public_names_are_the_real_objects() -> None:
    from hvd_magic import errors
    from hvd_magic.notebook import distributor, runner
    from hvd_magic.rank import progress as loops
    from hvd_magic.rank import reporting

    assert hvd_magic.report is reporting.report
    assert hvd_magic.progress is loops.progress
    assert hvd_magic.HorovodRunner is runner.HorovodRunner
    from hvd_magic.rank import checkpoints

    assert (hvd_magic.checkpoint, hvd_magic.resume) == (checkpoints.checkpoint, checkpoints.resume)
    assert hvd_magic.stopping is checkpoints.stopping
    outside_a_run = (hvd_magic.checkpoint({}, step=1), hvd_magic.resume(), hvd_magic.stopping())
    assert outside_a_run == (False, None, False)
    assert hvd_magic.Session is __import__("hvd_magic.session.api").session.api.Session
    assert hvd_magic.TorchDistributor is distributor.TorchDistributor
    assert isinstance(hvd_magic.timeline, types.ModuleType)
    assert hvd_magic.timeline.__name__ == "hvd_magic.timeline"
    for name in ERRORS:
        if name in PUBLIC:
            assert getattr(hvd_magic, name) is getattr(errors, name)
    assert callable(hvd_magic.load_ipython_extension)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        hvd_magic.no_such_thing  # noqa: B018
    assert not hasattr(hvd_magic, "no_such_thing")


def test_errors_all_is_one_exception_tree() -> None:
    assert sorted(hvd_magic.errors.__all__) == ERRORS
    base = hvd_magic.errors.HorovodMagicError
    for name in hvd_magic.errors.__all__:
        cls = getattr(hvd_magic.errors, name)
        assert inspect.isclass(cls) and issubclass(cls, Exception), name
        assert issubclass(cls, base), f"{name} is outside the HorovodMagicError tree"


def test_errors_tree_shape() -> None:
    errors = hvd_magic.errors
    for name in ("RankFailedError", "RunInterrupted", "RunTimeout"):
        assert issubclass(getattr(errors, name), errors.RunError), name
    for name in (
        "CaptureError",
        "CheckpointError",
        "DataError",
        "InstallError",
        "LaunchError",
        "TimelineError",
        "TrainerError",
        "RunError",
    ):
        assert getattr(errors, name).__bases__[0] is errors.HorovodMagicError, name
    assert issubclass(errors.TimelineError, ValueError) and issubclass(errors.TrainerError, ValueError)


def test_timeline_all_names_resolve() -> None:
    assert sorted(hvd_magic.timeline.__all__) == TIMELINE
    for name in hvd_magic.timeline.__all__:
        assert getattr(hvd_magic.timeline, name) is not None, name
    assert hvd_magic.timeline.TimelineError is hvd_magic.errors.TimelineError
    assert callable(hvd_magic.timeline.read) and callable(hvd_magic.timeline.analyze)


HEAVY = ("torch", "tensorflow", "keras", "pyspark", "ipywidgets", "anywidget")


def _python_here(code: str, *args: str) -> list[str]:
    """The lines ``code`` printed, run by a fresh interpreter in this checkout."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


def test_import_is_cheap() -> None:
    code = (
        "import json, sys\n"
        "import hvd_magic\n"
        "heavy = tuple(sys.argv[1:])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('hvd_magic', 'zmq'))))\n"
        "print(json.dumps(hvd_magic.__file__))\n"
    )
    lines = _python_here(code, *HEAVY)
    repo = Path(__file__).resolve().parents[1]
    assert Path(json.loads(lines[-1])).resolve().is_relative_to(repo)  # this checkout's package
    assert json.loads(lines[-3]) == []
    assert json.loads(lines[-2]) == ["hvd_magic", "hvd_magic.errors"]  # the rest on first use


# In a subprocess: the third-party modules ``%load_ext hvd_magic`` loads whose distribution is
# not among pyproject's dependencies or theirs (what Python's start loaded left out)
UNDECLARED = """
import sys
started = {m.split(".")[0] for m in sys.modules}
import json, re, tomllib
from importlib import metadata
from IPython.core.interactiveshell import InteractiveShell

InteractiveShell.instance().run_line_magic("load_ext", "hvd_magic")
def named(requirement):
    return re.split(r"[ <>=!~;\\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")
with open("pyproject.toml", "rb") as file:
    todo = [named(r) for r in tomllib.load(file)["project"]["dependencies"]]
allowed = set()
while todo:
    name = todo.pop()
    if name not in allowed:
        allowed.add(name)
        try:
            todo += [named(r) for r in metadata.requires(name) or [] if "extra ==" not in r]
        except metadata.PackageNotFoundError:
            pass
owners = metadata.packages_distributions()
loaded = {m.split(".")[0] for m in sys.modules} - started - set(sys.stdlib_module_names) - {"hvd_magic"}
print(json.dumps(sorted(m for m in loaded if m in owners
                        and not {d.lower().replace("_", "-") for d in owners[m]} & allowed)))
"""


def test_loading_the_extension_needs_only_the_declared_dependencies() -> None:
    """A plain ``pip install hvd_magic`` loads the extension: numpy, imported by the live
    view's model at ``%load_ext``, was in no dependency but an extra's."""
    assert json.loads(_python_here(UNDECLARED)[-1]) == []


def test_dir_lists_every_public_name_before_its_first_use() -> None:
    code = "import json, hvd_magic\nprint(json.dumps(sorted(set(hvd_magic.__all__) - set(dir(hvd_magic)))))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
