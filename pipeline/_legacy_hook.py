"""The verl hook's old names, still accepted for a while: ``pipeline.verl.dropin.install`` and
``pipeline.verl_dropin.install`` (its name is ``tracklane.verl.install`` now).

A hook is a name Ray imports in each worker (``worker_process_setup_hook``), before any code of ours runs, and
tracklane installs one import name only, ``tracklane``. So the wheel carries ``tracklane-legacy-hook.pth``
(the build writes it from this file), which puts ``LegacyHookFinder`` first on ``sys.meta_path`` when Python
starts. The finder answers for four names and nothing else:

- ``pipeline`` and ``pipeline.verl``: empty packages, and only where no other ``pipeline`` can be imported
  (a module or package of the user's by that name comes first) or where the one found is tracklane's own
  folder (a checkout's ``pipeline/``, which would otherwise load a second copy of tracklane);
- ``pipeline.verl.dropin`` and ``pipeline.verl_dropin``: ``tracklane.verl.dropin`` itself (one module under both
  names, never a copy), with a DeprecationWarning.

This module is plain standard library and imports nothing of tracklane's until an old name is imported; its
source runs as it is from the .pth (``install_finder()`` at the end). An editable install (``pip install -e``)
gets the .pth too (the build writes it where setuptools writes a namespace package's, a private hook: should
setuptools rename it, an editable install goes without, and the old names work from the checkout's root only).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

OLD_TOP = "pipeline"
STUBS = ("pipeline", "pipeline.verl")
ALIASES = {"pipeline.verl.dropin": "tracklane.verl.dropin", "pipeline.verl_dropin": "tracklane.verl.dropin"}
NEW_HOOK = "tracklane.verl.install"
FINDER = "LegacyHookFinder"


class LegacyHookFinder(importlib.abc.MetaPathFinder):
    """Finds the verl hook's old module names (``ALIASES``) and the empty packages above them (``STUBS``)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in STUBS and fullname not in ALIASES:
            return None
        if fullname == OLD_TOP:
            if not _no_other_pipeline():
                return None
        elif not _ours(sys.modules.get(OLD_TOP)):
            return None  # the user's own pipeline package: its submodules are its business
        return importlib.machinery.ModuleSpec(fullname, _LegacyLoader(), is_package=fullname in STUBS)


class _LegacyLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a plain module: an empty package, or one replaced by tracklane's own in exec_module

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        if name in ALIASES:
            warnings.warn(f"{name}.install is the verl hook's old name; use {NEW_HOOK} "
                          f"(worker_process_setup_hook={NEW_HOOK})", DeprecationWarning, stacklevel=2)
            sys.modules[name] = importlib.import_module(ALIASES[name])  # the import returns what sys.modules holds


def _ours(module: ModuleType | None) -> bool:
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    return type(loader).__name__ == _LegacyLoader.__name__  # by name: the .pth's copy of this class is another one


def _no_other_pipeline() -> bool:
    """Whether no ``pipeline`` would be imported without us, or only tracklane's own folder under that name."""
    other = importlib.machinery.PathFinder.find_spec(OLD_TOP)
    if other is None:
        return True
    ours = importlib.util.find_spec("tracklane")  # finds, does not import
    if other.origin is None or ours is None or ours.origin is None:
        return False
    try:
        return os.path.samefile(other.origin, ours.origin)  # the same __init__.py (through a link too)
    except OSError:
        return False


def install_finder() -> None:
    """Put the finder first on ``sys.meta_path``, once (the .pth calls this when Python starts)."""
    if not any(type(finder).__name__ == FINDER for finder in sys.meta_path):
        sys.meta_path.insert(0, LegacyHookFinder())


def uninstall_finder() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if type(finder).__name__ != FINDER]
