"""tracklane in place of verl's tracking classes, in one process: ``install()``.

verl's trainers build ``verl.utils.tracking.Tracking`` themselves (``RayPPOTrainer.fit``, the v1 trainer,
the SFT trainers), most of them inside a Ray actor (main_ppo's ``TaskRunner``). ``install()`` puts
tracklane's ``Tracking``, ``ValidationGenerationsLogger`` and ``DapoFilteredRewardTableLogger`` in
``verl.utils.tracking`` and in every verl module that imported them already; when verl is not imported
yet, it does so the moment ``verl.utils.tracking`` is. For the actors of a verl job, name it as Ray's
``worker_process_setup_hook`` on verl's command line, and Ray runs it in every worker before any actor code
(there it also makes the runs an actor method drops finish before the method counts as done: ray_methods.py, and
routes verl's rollout traces, ``verl.utils.rollout_trace``, through the run: rollout_traces.py)::

    python -m verl.trainer.main_ppo ... +trainer.log_async=true \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracklane.verl.install
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import tracklane.verl.ray_methods as ray_methods
import tracklane.verl.rollout_traces as rollout_traces
from tracklane.tracking import Tracking
from tracklane.verl.dapo_reward_logger import DapoFilteredRewardTableLogger
from tracklane.verl.generations_logger import ValidationGenerationsLogger

VERL_TRACKING = "verl.utils.tracking"
"""The verl module whose classes are replaced."""
REPLACEMENTS: dict[str, type] = {
    "Tracking": Tracking,
    "ValidationGenerationsLogger": ValidationGenerationsLogger,
    "DapoFilteredRewardTableLogger": DapoFilteredRewardTableLogger,
}


def install() -> None:
    """Use tracklane's classes wherever verl names its own, and its rollout traces, in this process (idempotent).
    In a Ray worker, also finish the runs an actor method drops before Ray reports it done (``ray_methods``)."""
    if "ray" in sys.modules:
        ray_methods.install()
    waiting = False
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            waiting = True
    if waiting and not any(isinstance(finder, _SwapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SwapOnImport())


def uninstall() -> None:
    """Put verl's own classes and trace functions back wherever ours were put (tests that run both in one process)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _SwapOnImport)]
    _rebind({REPLACEMENTS[name]: original for name, original in _ORIGINALS.items()})
    traces = sys.modules.get(rollout_traces.TRACE_MODULE)
    if traces is not None:
        rollout_traces.unpatch(traces)


_ORIGINALS: dict[str, type] = {}  # verl's own classes, as first found


def _swap(module: ModuleType) -> None:
    for name, ours in REPLACEMENTS.items():
        original = getattr(module, name, None)
        if original is not None and original is not ours:
            _ORIGINALS.setdefault(name, original)
    # in verl.utils.tracking, and in each verl module that bound a name at import (`from ... import Tracking`)
    _rebind({original: REPLACEMENTS[name] for name, original in _ORIGINALS.items()})
    rl_insight = getattr(module, "RLInsightLogger", None)
    if rl_insight is not None:
        rollout_traces.patch_rl_insight(rl_insight)


def _rebind(replace: dict[type, type]) -> None:
    """In every loaded verl module, each of the three names bound to a key of ``replace`` gets its value."""
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("verl."):
            for name in REPLACEMENTS:
                bound = getattr(loaded, name, None)
                new = replace.get(bound) if isinstance(bound, type) else None
                if new is not None:
                    setattr(loaded, name, new)


_PATCHES: dict[str, Callable[[ModuleType], None]] = {VERL_TRACKING: _swap,
                                                     rollout_traces.TRACE_MODULE: rollout_traces.patch}
"""verl's modules tracklane changes, each with what it does to the module once it has run."""


class _SwapOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules of ``_PATCHES`` as the other finders would, and patches each once it has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _SwappingLoader(spec.loader, patch)
                return spec
        return None


class _SwappingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, patch: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._inner, name)
