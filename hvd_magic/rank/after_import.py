"""Run a function on a module once it is imported, whoever imports it (rank side)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` now if ``name`` is imported, else as soon as it is. A failure of ``then``
    never fails the import (what it adds is worth less than the user's import)."""
    module = sys.modules.get(name)
    if module is not None:
        _quietly(then, module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport:
    """A finder that lets the other finders find module ``name``, then hands the loaded module
    to ``then``."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then, self.asked = name, then, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.asked:
            return None
        self.asked = True
        others = sys.meta_path[sys.meta_path.index(self) + 1 :]
        spec = next((found for f in others if (found := _find(f, fullname, path, target)) is not None), None)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _quietly(then, module)

        loader.exec_module = exec_then
        return spec


def _find(finder: Any, fullname: str, path: Any, target: Any) -> Any:
    find_spec = getattr(finder, "find_spec", None)
    return None if find_spec is None else find_spec(fullname, path, target)


def _quietly(then: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        then(module)
    except Exception:  # noqa: BLE001 - without it is better than a failed import
        pass
