"""The house rules, checked: short modules and functions, and no import cycle in the package."""

from __future__ import annotations

import ast
import pathlib

import hvd_magic

PACKAGE = pathlib.Path(hvd_magic.__file__).parent
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def modules() -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name (compiled ones by their ``.pyi`` stub)."""
    found = {}
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]:
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Package modules ``name`` imports anywhere in its file (function-level imports too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            # `from X import a`: the module X.a if there is one, else X (a is defined in X).
            candidates = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names
            ]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in known and c != name}
    return found


def test_no_module_is_longer_than_300_lines():
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_longer_than_50_lines():
    long = []
    for name, path in modules().items():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == []


def test_the_package_has_no_import_cycle():
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in trail:
                cycles.append(trail[trail.index(target) :] + [target])
            elif target not in done:
                visit(target, [*trail, target])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert cycles == []
