"""Turning what a trainer passes to ``log()`` into plain numbers.

Two halves, on two threads:

* ``capture`` runs on the caller's thread and must cost microseconds. When every
  value is an immutable scalar (the verl case: floats, ints, numpy scalars) it is a
  shallow dict copy; only mutable values (nested dicts, tensors, arrays) are
  converted there, because the caller may change them after ``log()`` returns.
* ``clean_metrics`` runs on the shipper thread: numpy -> Python, bools -> ints,
  non-numeric values skipped with one warning per key, counted.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, Callable

import numpy as np

log = logging.getLogger("tracklane")

_NUMPY_SCALARS = (
    np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
    np.uint64, np.uint32, np.uint16, np.uint8, np.bool_,
)
# Values the caller cannot mutate after log() returns: safe to convert later.
_DEFERRABLE = frozenset((float, int, bool, str, type(None), *_NUMPY_SCALARS))
_BYTES_PER_ENTRY = 64  # rough msgpack + dict overhead of one key/value, for the byte bound
_INT64_MAX = 2**63 - 1


def capture(data: dict) -> tuple[dict, int]:
    """Copy ``data`` so the caller may reuse it; return the copy and an estimate of its bytes."""
    types = set(map(type, data.values()))
    if types <= _DEFERRABLE:
        size = len(data) * _BYTES_PER_ENTRY
        if str in types:
            size += sum(len(v) for v in data.values() if type(v) is str)
        return data.copy(), size
    flat: dict = {}
    _flatten_into(flat, "", data)
    return flat, len(flat) * _BYTES_PER_ENTRY + sum(len(v) for v in flat.values() if type(v) is str)


def _flatten_into(out: dict, prefix: str, data: dict) -> None:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten_into(out, f"{name}/", value)
        elif type(value) in _DEFERRABLE:
            out[name] = value
        else:
            out[name] = _detach(value)


def _detach(value: Any) -> Any:
    """A 0-d tensor or array becomes its Python number; anything else is kept for the shipper to reject."""
    torch = sys.modules.get("torch")  # never import torch ourselves: it costs seconds
    if torch is not None and isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else _Unloggable(f"tensor of shape {tuple(value.shape)}")
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else _Unloggable(f"array of shape {value.shape}")
    if isinstance(value, (float, int)):  # subclasses (e.g. np.float64 is a float subclass)
        return value
    return _Unloggable(type(value).__name__)


class _Unloggable:
    """Stands in for a value that is not a number, so the shipper can name it in its warning."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


class MetricCleaner:
    """Shipper-side conversion of captured values to msgpack-able numbers, warning once per key."""

    def __init__(self, on_skip: Callable[[int], None] | None = None) -> None:
        self._warned: set[str] = set()
        self._on_skip = on_skip
        self.skipped = 0

    def clean(self, values: dict) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for key, value in values.items():
            number = _as_number(value)
            name = key if type(key) is str else str(key)
            if number is None:
                self._skip(name, value)
            else:
                out[name] = number
        return out

    def _skip(self, name: str, value: Any) -> None:
        self.skipped += 1
        if self._on_skip is not None:
            self._on_skip(1)
        if name not in self._warned:
            self._warned.add(name)
            what = value.what if isinstance(value, _Unloggable) else type(value).__name__
            log.warning("tracklane: metric %r skipped: %s is not a number (warned once per key)", name, what)


def _as_number(value: Any) -> float | int | None:
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        return value if -_INT64_MAX <= value <= _INT64_MAX else float(value)
    if kind is bool or kind is np.bool_:
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float):  # float subclasses
        return float(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _as_number(int(value))
    return None


def is_finite(value: float | int) -> bool:
    """True for numbers every tracker accepts (not NaN, not +-Inf)."""
    return type(value) is int or math.isfinite(value)
