"""Run a function on a verl module right after it is first imported, in whichever process imports it.

The fixtures here are loaded by verl's ``VERL_USE_EXTERNAL_MODULES`` while ``import verl`` runs, before the modules
they adjust can be imported (importing them then would be circular): they wait for the import instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders find it; this runs once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` once ``name`` is imported: now if it is, else right after its first import."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(finder, _AfterImport) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))
