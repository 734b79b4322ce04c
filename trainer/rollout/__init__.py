"""Rollout engines behind one interface: ``generate(prompts, n, max_new_tokens, temperature) -> Rollout``.

``torch`` (default) samples from the policy in-process with a KV cache, on CPU or CUDA.
``vllm`` (optional, GPU only) hands the policy to a vLLM engine and syncs weights each step.
"""

from __future__ import annotations

from typing import Any

from .base import Rollout, RolloutEngine, RolloutUnavailable, left_pad


def make_engine(name: str, model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """The engine called ``name``; vllm's module is imported only when asked for."""
    if name == "torch":
        from .torch_engine import TorchRollout

        return TorchRollout(model, tokenizer)
    if name == "vllm":
        from .vllm_engine import VllmRollout

        return VllmRollout(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}")


__all__ = ["Rollout", "RolloutEngine", "RolloutUnavailable", "left_pad", "make_engine"]
