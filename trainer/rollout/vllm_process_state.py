"""What vLLM changes in the process it runs in, kept apart from the trainer's (used by vllm_engine.py).

vLLM's in-process engine sets environment variables (LD_PRELOAD, thread settings), patches torch functions for its
CPU backend (``torch.set_num_threads`` among them) and the exception hooks (torch.distributed's "[rank0]:" prefix),
changes torch's thread count and the global random generators, and calls ``gc.freeze()``. ``ProcessState.engine()``
around every vLLM call puts the engine's versions in place while it runs and the trainer's at every other moment.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

_MISSING = object()


def _patchable() -> list[tuple[Any, tuple[str, ...] | None]]:
    """Where vLLM patches the process it runs in, and which names (None: any): torch's (its CPU worker replaces
    torch.set_num_threads, torch.Event, torch.cuda's streams and events, torch.accelerator's synchronize and memory
    figures, Tensor.pin_memory) and the exception hooks (torch.distributed's process group prefixes "[rank0]:")."""
    spaces: list[tuple[Any, tuple[str, ...] | None]] = [(torch, None), (torch.cuda, None), (torch.Tensor, None),
                                                        (sys, ("excepthook",)), (threading, ("excepthook",))]
    if hasattr(torch, "accelerator"):
        spaces.append((torch.accelerator, None))
    return spaces


def _attrs(space: Any, names: tuple[str, ...] | None) -> dict[str, Any]:
    found = vars(space)
    return dict(found) if names is None else {name: found[name] for name in names if name in found}


def _is_patch(before: Any, after: Any) -> bool:
    """An attribute vLLM replaced: not a module, nor a wrapper of what was there (torch's own lazy wrapping, e.g.
    torch._dynamo's of torch.manual_seed)."""
    if after is before or isinstance(after, types.ModuleType) or isinstance(before, types.ModuleType):
        return False
    if isinstance(before, (bool, int, float, str, bytes)) and type(after) is type(before) and after == before:
        return False
    return before is _MISSING or getattr(after, "__wrapped__", _MISSING) is not before


class ProcessState:
    """The trainer's and the engine's versions of what vLLM changes in its process: os.environ, the torch
    functions and exception hooks it replaces, torch's thread count, the random generators (torch, CUDA, numpy,
    random) and gc's frozen set. ``with state.engine():`` around every vLLM call puts the engine's in place and, after it,
    keeps what vLLM changed as the engine's and puts the trainer's back. The engine runs with the trainer's
    thread count."""

    def __init__(self) -> None:
        self._env: dict[str, str | None] = {}
        self._attrs: dict[tuple[int, str], Any] = {}
        self._rng: dict[str, Any] | None = None

    @contextlib.contextmanager
    def engine(self) -> Iterator[None]:
        spaces = _patchable()
        env = dict(os.environ)
        attrs = [_attrs(space, names) for space, names in spaces]
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        rng = _rng_state()
        frozen = gc.get_freeze_count()
        _apply_env(self._env)
        for (i, name), value in self._attrs.items():
            _set_attr(spaces[i][0], name, value)
        if self._rng is not None:
            _set_rng_state(self._rng)
        try:
            yield
        finally:
            now = dict(os.environ)
            self._env = {k: v for k, v in now.items() if env.get(k) != v}
            self._env.update({k: None for k in env.keys() - now.keys()})
            _apply_env({k: env.get(k) for k in self._env})
            for i, (space, names) in enumerate(spaces):
                current = _attrs(space, names)
                for name in current.keys() | attrs[i].keys():
                    before, after = attrs[i].get(name, _MISSING), current.get(name, _MISSING)
                    if _is_patch(before, after):
                        self._attrs[(i, name)] = after
                        _set_attr(space, name, before)
            if torch.set_num_threads is not set_threads:  # still patched: one vLLM did not make through vars()
                torch.set_num_threads = set_threads
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            self._rng = _rng_state()
            _set_rng_state(rng)
            if frozen == 0 and gc.get_freeze_count():
                gc.unfreeze()  # vLLM's engine freezes the heap after it starts: the trainer's objects too


def _apply_env(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        elif os.environ.get(key) != value:
            os.environ[key] = value


def _set_attr(space: Any, name: str, value: Any) -> None:
    if value is _MISSING:
        with contextlib.suppress(AttributeError):
            delattr(space, name)
    else:
        setattr(space, name, value)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state["cuda"])
