"""Running a payload inside a rank: a cell in the process's ``__main__`` namespace (kept
across a live session's cells) or a function, and reporting its value or its error. Used by the
worker for a run and by a live session's rank loop for each cell. It must not import IPython.
"""

from __future__ import annotations

import ast
import bdb
import linecache
import os
import runpy
import sys
import traceback
import types
from typing import Any

import cloudpickle

from hvd_magic.protocol import CELL_FILENAME, CellPayload, FunctionPayload, RankError, Result
from hvd_magic.rank import debugger
from hvd_magic.rank.hub_client import HubClient

__all__ = ["load_payload", "report_error", "run_payload", "user_call"]


def _run_cell(payload: CellPayload) -> tuple[Any, dict[str, Any]]:
    # The cell runs as this process's __main__, like a notebook cell in the kernel's.
    namespace = sys.modules["__main__"].__dict__
    namespace.update(payload.namespace)
    lines = payload.source.splitlines(keepends=True)
    linecache.cache[CELL_FILENAME] = (len(payload.source), None, lines, CELL_FILENAME)
    tree = ast.parse(payload.source, CELL_FILENAME)
    last: ast.expr | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop().value  # type: ignore[attr-defined]
    exec(compile(tree, CELL_FILENAME, "exec"), namespace)
    value = None
    if last is not None:
        value = eval(compile(ast.Expression(last), CELL_FILENAME, "eval"), namespace)
    if payload.silent:
        value = None
    missing = [n for n in payload.return_names if n not in namespace]
    if missing:
        raise NameError(f"return= names not defined by the cell on rank 0: {', '.join(missing)}")
    return value, {n: namespace[n] for n in payload.return_names}


def load_payload(blob: bytes) -> CellPayload | FunctionPayload:
    try:
        payload: CellPayload | FunctionPayload = cloudpickle.loads(blob)
    except ImportError as err:
        raise ImportError(
            f"the payload needs module {err.name!r}, which this rank cannot import ({err}). Install it "
            "where the ranks run (on Spark: on every executor), or define the code in the notebook."
        ) from None
    return payload


# Frames before the user's: this module's, TorchDistributor's calls of a function or a script
# (rank/distributor.py), and runpy's, which runs a script
_OURS = {
    __file__,
    os.path.join(os.path.dirname(__file__), "distributor.py"),
    runpy.__file__,
    "<frozen runpy>",
}


def _user_frames(err: BaseException) -> types.TracebackType | None:
    """The traceback without the worker's own frames: the user's story starts in their code."""
    tb: types.TracebackType | None = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OURS:
        tb = tb.tb_next
    return tb


def _user_traceback(err: BaseException) -> str:
    tb = _user_frames(err)
    if isinstance(err, bdb.BdbQuit):  # where the person quit, not the debugger's own frames
        frames = [frame for frame in traceback.extract_tb(tb) if frame.filename != bdb.__file__]
        return "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    return "".join(traceback.format_exception(type(err), err, tb))


def _send_result(client: HubClient, value: Any, returned: dict[str, Any]) -> None:
    try:
        blob = cloudpickle.dumps((value, returned))
    except Exception as err:  # noqa: BLE001
        raise TypeError(
            f"rank 0's result (a {type(value).__name__}) cannot be pickled back to the notebook: "
            f"{err}. Return plain data (numbers, lists, dicts, arrays, state_dicts)."
        ) from None
    client.send(Result(), blob)


def user_call(payload: CellPayload | FunctionPayload) -> tuple[Any, dict[str, Any]]:
    """The user's code runs inside this frame (a live session's interrupt looks for it)."""
    if isinstance(payload, FunctionPayload):
        return payload.function(**payload.kwargs), {}
    return _run_cell(payload)


def run_payload(client: HubClient, payload: CellPayload | FunctionPayload, host: str, reply: bool) -> int:
    """Run the payload; if ``reply``, send its value. Returns the rank's exit code; an exception
    (or a non-zero sys.exit) is reported with its traceback. sys.exit(0) is a normal end."""
    try:
        value, returned = user_call(payload)
    except SystemExit as err:
        if err.code not in (None, 0):
            report_error(client, host, err)
            return err.code if isinstance(err.code, int) else 1
        value, returned = None, {}
    except BaseException as err:  # noqa: BLE001 - every failure is reported, then we exit
        debugger.failed(err, _user_frames(err))
        report_error(client, host, err)
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    if reply:
        try:
            _send_result(client, value, returned)
        except TypeError as err:
            report_error(client, host, err)
            return 1
    return 0


def report_error(client: HubClient, host: str, err: BaseException) -> None:
    sys.stderr.flush()
    said = "quit in the debugger (q)" if isinstance(err, bdb.BdbQuit) else str(err)
    client.send(RankError(host, type(err).__name__, said, _user_traceback(err)))
