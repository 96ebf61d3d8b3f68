"""Packs a notebook cell (or a function) into a payload the ranks can run (as ipyparallel packs
an apply request; IPython's ``%%capture``, which captures output, is another thing).

A cell travels as its source (after IPython's own transforms) plus the notebook names it reads,
pickled with cloudpickle: functions and classes defined in the notebook go by value, modules by
name (the ranks import them again), plain values as they are. On the ranks the cell runs as a
module body, so its last expression is the value of the cell, as in IPython.
"""

from __future__ import annotations

import ast
import dis
import os
import pickle
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hvd_magic.errors import CaptureError
from hvd_magic.protocol import CELL_FILENAME, CellPayload, FunctionPayload

__all__ = ["Packed", "pack_cell", "pack_function", "names_read"]

LARGE_PAYLOAD_BYTES = 50 * 1024 * 1024


@dataclass
class Packed:
    blob: bytes
    notices: list[str]
    imports: frozenset[str] = frozenset()  # the modules its code imports, dotted (warm.choice reads them)


def imports_of(tree: ast.AST) -> set[str]:
    """The modules a cell's code imports anywhere (``from horovod import torch``: horovod.torch)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _code_imports(code: types.CodeType, names: dict[str, Any]) -> set[str]:
    """The modules a function's code imports, and the modules among the globals it reads."""
    found: set[str] = set()
    last = ""
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME":
            last = str(instruction.argval)
            found.add(last)
        elif instruction.opname == "IMPORT_FROM" and last:
            found.add(f"{last}.{instruction.argval}")
    found.update(
        value.__name__ for name in code.co_names if isinstance(value := names.get(name), types.ModuleType)
    )
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found |= _code_imports(constant, names)
    return found


def _modules_in(namespace: dict[str, Any]) -> set[str]:
    return {value.__name__ for value in namespace.values() if isinstance(value, types.ModuleType)}


def names_read(source: str | ast.Module) -> set[str]:
    """Names the code loads anywhere (module level, functions, comprehensions)."""
    tree = ast.parse(source) if isinstance(source, str) else source
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            found.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            found.update(node.names)
    return found


def _names_assigned_at_top(tree: ast.Module) -> set[str]:
    assigned: set[str] = set()
    for statement in tree.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                assigned.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assigned.add(node.name)
            elif isinstance(node, ast.alias):
                assigned.add((node.asname or node.name).split(".")[0])
    return assigned


def _parse(source: str) -> ast.Module:
    """The cell's syntax tree; a syntax error becomes a CaptureError showing the line."""
    try:
        tree = ast.parse(source, CELL_FILENAME)
        compile(tree, CELL_FILENAME, "exec")  # errors only the compiler sees ('return' outside def)
        return tree
    except SyntaxError as err:
        if err.lineno is None:  # not of a line: a null byte, say
            raise CaptureError(
                f"the cell cannot be compiled: {err.msg}\n"
                "Fix the cell and run it again; nothing was launched."
            ) from None
        line = (err.text or "").rstrip("\n")
        pointer = " " * max((err.offset or 1) - 1, 0) + "^"
        raise CaptureError(
            f"the cell has a syntax error on line {err.lineno}: {err.msg}\n    {line}\n    {pointer}\n"
            "Fix the cell and run it again; nothing was launched."
        ) from None


def _unpicklable(name: str, value: object) -> str | None:
    try:
        cloudpickle.dumps(value)
    except Exception as err:  # noqa: BLE001 - any pickling failure is reported by name
        return f"  {name} ({type(value).__module__}.{type(value).__qualname__}): {type(err).__name__}: {err}"
    return None


def local_modules(values: list[Any], root: str | None = None) -> list[types.ModuleType]:
    """Modules of these functions/classes whose files live under ``root`` (the notebook's folder).

    The ranks may not have them (on Spark they never do), so they travel by value.
    """
    base = os.path.realpath(root or os.getcwd()) + os.sep
    found = {}
    for value in values:
        module = sys.modules.get(getattr(value, "__module__", None) or "")
        path = getattr(module, "__file__", None)
        if module is None or not path or module.__name__ == "__main__":
            continue
        real = os.path.realpath(path)
        if real.startswith(base) and "site-packages" not in real:
            found[module.__name__] = module
    return list(found.values())


def _dump(obj: object, what: str, namespace: dict[str, Any]) -> bytes:
    by_value = local_modules(list(namespace.values()))
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as err:  # noqa: BLE001
        problems = [p for n, v in namespace.items() if (p := _unpicklable(n, v))]
        if not problems:
            raise CaptureError(f"{what} cannot be pickled: {type(err).__name__}: {err}") from None
        raise CaptureError(
            f"{what} uses notebook names that cannot be sent to the ranks:\n"
            + "\n".join(problems)
            + "\nCreate these objects inside the cell (or the function) instead, so each rank "
            "builds its own, or pass what they are built from (paths, settings)."
        ) from None
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _size_notice(blob: bytes, namespace: dict[str, Any]) -> list[str]:
    if len(blob) < LARGE_PAYLOAD_BYTES:
        return []
    sizes = sorted(((len(cloudpickle.dumps(v)), n) for n, v in namespace.items()), reverse=True)
    biggest = ", ".join(f"{n} {s / 2**20:.0f} MB" for s, n in sizes[:3])
    return [
        f"hvd_magic: the payload is {len(blob) / 2**20:.0f} MB and goes to every rank "
        f"(largest: {biggest}); load large data inside the cell instead."
    ]


def pack_cell(
    source: str,
    user_ns: dict[str, Any],
    hidden: set[str] | frozenset[str] = frozenset(),
    return_names: list[str] | None = None,
) -> Packed:
    """Payload for a cell whose ``source`` already went through IPython's transforms."""
    tree = _parse(source)
    if "get_ipython()" in source:
        raise CaptureError(
            "the cell uses IPython syntax (a %magic, !command or ?help) that the ranks cannot "
            "run, since they are plain Python processes. Move it to a cell of its own."
        )
    assigned = _names_assigned_at_top(tree)
    namespace: dict[str, Any] = {}
    for name in sorted(names_read(tree)):
        if name not in user_ns or name in hidden or name.startswith("__"):
            continue
        value = user_ns[name]
        # The cell assigns this name itself before/after using it: ship it only if it pickles.
        if name in assigned and _unpicklable(name, value):
            continue
        namespace[name] = value
    silent = source.rstrip().endswith(";")
    payload = CellPayload(source, namespace, list(return_names or []), silent)
    blob = _dump(payload, "the cell", namespace)
    return Packed(blob, _size_notice(blob, namespace), frozenset(imports_of(tree) | _modules_in(namespace)))


def pack_function(function: Callable[..., Any], kwargs: dict[str, Any]) -> Packed:
    """Payload for ``HorovodRunner.run(function, **kwargs)``."""
    if not callable(function):
        raise CaptureError(f"HorovodRunner.run needs a function, got {type(function).__name__}")
    namespace = {"function": function, **kwargs}
    blob = _dump(
        FunctionPayload(function, kwargs), f"function {getattr(function, '__name__', '?')}", namespace
    )
    code = getattr(function, "__code__", None)
    imports = _code_imports(code, getattr(function, "__globals__", {})) if code is not None else set()
    return Packed(blob, _size_notice(blob, namespace), frozenset(imports | _modules_in(kwargs)))
