"""tracklane in place of verl's tracking classes, in one process: ``install()``.

verl's trainers build ``verl.utils.tracking.Tracking`` themselves (``RayPPOTrainer.fit``, the v1 trainer,
the SFT trainers), most of them inside a Ray actor (main_ppo's ``TaskRunner``). ``install()`` puts
tracklane's ``Tracking``, ``ValidationGenerationsLogger`` and ``DapoFilteredRewardTableLogger`` in
``verl.utils.tracking`` and in every verl module that imported them already; when verl is not imported
yet, it does so the moment ``verl.utils.tracking`` is. For the actors of a verl job, name it as Ray's
``worker_process_setup_hook`` on verl's command line, and Ray runs it in every worker before any actor code
(there it also makes the runs an actor method drops finish before the method counts as done: ray_methods.py)::

    python -m verl.trainer.main_ppo ... +trainer.log_async=true \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=pipeline.verl.dropin.install
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from pipeline.tracking import Tracking
from pipeline.verl import ray_methods
from pipeline.verl.dapo_reward_logger import DapoFilteredRewardTableLogger
from pipeline.verl.generations_logger import ValidationGenerationsLogger

VERL_TRACKING = "verl.utils.tracking"
"""The verl module whose classes are replaced."""
REPLACEMENTS: dict[str, type] = {
    "Tracking": Tracking,
    "ValidationGenerationsLogger": ValidationGenerationsLogger,
    "DapoFilteredRewardTableLogger": DapoFilteredRewardTableLogger,
}


def install() -> None:
    """Use tracklane's classes wherever verl names its own, in this process (idempotent). In a Ray worker,
    also finish the runs an actor method drops before Ray reports it done (``ray_methods``)."""
    if "ray" in sys.modules:
        ray_methods.install()
    module = sys.modules.get(VERL_TRACKING)
    if module is not None:
        _swap(module)
    elif not any(isinstance(finder, _SwapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SwapOnImport())


def uninstall() -> None:
    """Put verl's own classes back wherever ours were put (for tests that run both in one process)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _SwapOnImport)]
    _rebind({REPLACEMENTS[name]: original for name, original in _ORIGINALS.items()})


_ORIGINALS: dict[str, type] = {}  # verl's own classes, as first found


def _swap(module: ModuleType) -> None:
    for name, ours in REPLACEMENTS.items():
        original = getattr(module, name, None)
        if original is not None and original is not ours:
            _ORIGINALS.setdefault(name, original)
    # in verl.utils.tracking, and in each verl module that bound a name at import (`from ... import Tracking`)
    _rebind({original: REPLACEMENTS[name] for name, original in _ORIGINALS.items()})


def _rebind(replace: dict[type, type]) -> None:
    """In every loaded verl module, each of the three names bound to a key of ``replace`` gets its value."""
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("verl."):
            for name in REPLACEMENTS:
                bound = getattr(loaded, name, None)
                new = replace.get(bound) if isinstance(bound, type) else None
                if new is not None:
                    setattr(loaded, name, new)


class _SwapOnImport(importlib.abc.MetaPathFinder):
    """Finds ``verl.utils.tracking`` as the other finders would, and swaps its classes once it has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != VERL_TRACKING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _SwappingLoader(spec.loader)
                return spec
        return None


class _SwappingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _swap(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._inner, name)
