"""Rich records (generations, trajectories, histograms, text, images, artifacts) made plain and bounded.

Runs on the shipper thread (or inline on the synchronous path): ``log_*`` on the caller's
thread only took a shallow copy. Here samples and trajectories are thinned to the configured
count (evenly spaced, so a batch stays represented), long strings are cut, token ids are
packed as int32 bytes, images are PNG-encoded. Every cut and every sample left out is counted.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tracklane.config.keys import refuse_unknown_keys
from tracklane.core.errors import ConfigError
from tracklane.core.histogram import histogram_figures
from tracklane.core.png import PNG_SIGNATURE, encode_png
from tracklane.core.records import Artifact, Histogram, Image, Record, Text, Trace, Trajectory
from tracklane.core.trajectory_lines import trajectory_line

log = logging.getLogger("tracklane")


SAMPLED_PER_BACKEND = ("max_generations", "max_trajectories")
"""The limits a backend may set for itself (``trainer.record_limits.backends.<name>``); the others are the run's."""
DEFAULT_BACKEND_LIMITS: dict[str, dict[str, int | None]] = {"file": {"max_generations": None, "max_trajectories": None}}
"""verl's file dumps (rollout_data_dir, validation_data_dir) keep every sample; the dashboards are sampled."""


@dataclass(slots=True, kw_only=True)
class RecordLimits:
    """Sampling and truncation of rich records (``trainer.record_limits``)."""

    max_generations: int | None = 256
    """Validation samples kept per step (verl's trainer.log_val_generations chooses how many it passes); None: all."""
    max_trajectories: int | None = 64
    """Rollout trajectories kept per step; None: all."""
    max_chars: int = 16_384
    """Longest string kept (message, input, output, tool result, text); longer ones are cut, counted."""
    max_histogram_values: int = 1_000_000
    """Values kept per histogram (evenly spaced beyond that)."""
    backends: dict[str, dict[str, int | None]] = field(default_factory=lambda: {
        name: dict(limits) for name, limits in DEFAULT_BACKEND_LIMITS.items()})
    """Per backend, its own ``max_generations`` / ``max_trajectories`` (default: the file keeps every sample)."""

    def __post_init__(self) -> None:
        for name in ("max_generations", "max_trajectories", "max_chars", "max_histogram_values"):
            _check_limit(f"trainer.record_limits.{name}", getattr(self, name), none_ok=name in SAMPLED_PER_BACKEND)
        if not isinstance(self.backends, Mapping):
            raise ConfigError(f"trainer.record_limits.backends must be a map of backend -> limits, got {self.backends!r}")
        for backend, limits in self.backends.items():
            where = f"trainer.record_limits.backends.{backend}"
            if not isinstance(limits, Mapping):
                raise ConfigError(f"{where} must be a map of limits, got {limits!r}")
            unknown = sorted(set(limits) - set(SAMPLED_PER_BACKEND))
            if unknown:
                raise ConfigError(f"unknown key(s) {where}.{', '.join(unknown)}; a backend may set: "
                                  f"{', '.join(SAMPLED_PER_BACKEND)}")
            for name, value in limits.items():
                _check_limit(f"{where}.{name}", value, none_ok=True)

    def samples_for(self, backend: str, field_name: str) -> int | None:
        """``max_generations`` or ``max_trajectories`` for ``backend``: its own if it sets one, else the run's."""
        own = self.backends.get(backend, {})
        return own[field_name] if field_name in own else getattr(self, field_name)

    def widest(self, backends: Sequence[str]) -> RecordLimits:
        """These limits with the sample counts of the most generous of ``backends`` (what the batch must carry)."""
        if not backends:
            return self
        wide = {name: _most(self.samples_for(b, name) for b in backends) for name in SAMPLED_PER_BACKEND}
        return RecordLimits(max_chars=self.max_chars, max_histogram_values=self.max_histogram_values, backends={},
                            **wide)


def _most(limits: Iterable[int | None]) -> int | None:
    values = list(limits)
    return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]


def _check_limit(where: str, value: Any, none_ok: bool) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where} must be an int >= 0{' or null (every sample)' if none_ok else ''}, got {value!r}")


def record_limits(section: Mapping[str, Any] | None) -> RecordLimits:
    section = dict(section or {})
    refuse_unknown_keys(section, RecordLimits.__slots__, "trainer.record_limits")
    if "backends" in section:  # the user's overrides go over the defaults, backend by backend
        given = section["backends"]
        if not isinstance(given, Mapping):
            raise ConfigError(f"trainer.record_limits.backends must be a map of backend -> limits, got {given!r}")
        merged = {name: dict(limits) for name, limits in DEFAULT_BACKEND_LIMITS.items()}
        for name, limits in given.items():  # a value that is no map is refused by RecordLimits itself
            merged[str(name)] = {**merged.get(str(name), {}), **limits} if isinstance(limits, Mapping) else limits
        section["backends"] = merged
    return RecordLimits(**section)


def thin_indices(count: int, limit: int | None) -> Sequence[int]:
    """The indices of at most ``limit`` of ``count`` items (None: all), evenly spaced so that a batch stays
    represented."""
    if limit is None or count <= limit:
        return range(count)
    if limit == 0:
        return []
    return np.linspace(0, count - 1, limit).round().astype(int).tolist()


class RichConverter:
    """Builds rich records from what ``log_*`` captured, counting what it cuts or leaves out."""

    def __init__(self, limits: RecordLimits) -> None:
        self.limits = limits
        self.truncated = 0
        """Strings cut to max_chars."""
        self.sampled_out = 0
        """Samples or trajectories left out by max_generations / max_trajectories."""
        self._warned: set[str] = set()
        self._builders: dict[str, Callable[[int, tuple, float, list[str] | None], Record]] = {
            Histogram.kind: self.histogram, Text.kind: self.text, Image.kind: self.image, Artifact.kind: self.artifact,
            Trace.kind: self.trace,
        }

    def build(self, kind: str, step: int, payload: tuple, when: float, only: list[str] | None) -> Record:
        """The record of ``kind`` from what its ``log_*`` call captured; raises on malformed input."""
        return self._builders[kind](step, payload, when, only)

    # -- samples, one at a time (the converter thins and chunks them: convert.py) ------------
    def generation_row(self, sample: Sequence[Any]) -> list[Any]:
        """One validation sample as the row [input, output, score]."""
        return [self._text(sample[0]), self._text(sample[1]), _score(sample[2])]

    def trajectory_line(self, item: Any, step: int) -> bytes:
        """One rollout as the file tracker's JSON line (trajectory_lines.py)."""
        return trajectory_line(self._trajectory(item), step)

    # -- one method per kind: (step, payload, time, only) -> record ------------------------
    def histogram(self, step: int, payload: tuple, when: float, only: list[str] | None) -> Histogram:
        name, values = payload
        array = _float_array(values)
        if array.size > self.limits.max_histogram_values:
            self.sampled_out += array.size - self.limits.max_histogram_values
            array = array[np.linspace(0, array.size - 1, self.limits.max_histogram_values).astype(np.int64)]
        # Only the figures travel: every tracker stores bins and a summary, and the raw values (up to
        # max_histogram_values, 8 bytes each) were packed, spooled, sent to and unpacked by every lane for nothing.
        return Histogram(step=step, name=str(name), values=b"", time=when, only=only,
                         figures=histogram_figures(array))

    def text(self, step: int, payload: tuple, when: float, only: list[str] | None) -> Text:
        name, text = payload
        return Text(step=step, name=str(name), text=self._text(text), time=when, only=only)

    def image(self, step: int, payload: tuple, when: float, only: list[str] | None) -> Image:
        name, image = payload
        png = bytes(image) if isinstance(image, (bytes, bytearray, memoryview)) else encode_png(_numpy(image))
        if png[:8] != PNG_SIGNATURE:
            raise ValueError("image bytes are not a PNG")
        return Image(step=step, name=str(name), png=png, time=when, only=only)

    def artifact(self, step: int, payload: tuple, when: float, only: list[str] | None) -> Artifact:
        path, name, kind = payload
        return Artifact(step=step, path=path, name=str(name), type=str(kind), time=when, only=only)

    def trace(self, step: int, payload: tuple, when: float, only: list[str] | None) -> Trace:
        name, key, start_ns, end_ns, status, attributes, messages, metadata = payload
        plain = self._nested(metadata if metadata is not None else {})
        if type(plain) is not dict:
            raise TypeError(f"trace metadata must be a dict, got {type(metadata).__name__}")
        return Trace(step=step, time=when, name=str(name), key=str(key), start_ns=_nanoseconds(start_ns),
                     end_ns=_nanoseconds(end_ns), status=str(status),
                     attributes={str(k): _plain(v) for k, v in (attributes or {}).items()},
                     messages=[{"role": self._text(m.get("role", "")), "content": self._text(m.get("content", ""))}
                               for m in map(_fields_of_message, messages or [])],
                     metadata=orjson.dumps(plain, option=orjson.OPT_NON_STR_KEYS).decode(), only=only)

    # -- helpers -------------------------------------------------------------------------
    def _nested(self, value: Any, depth: int = 0) -> Any:
        """JSON-plain values of any depth (strings cut to max_chars, counted; deeper than 32 levels as text)."""
        if type(value) is str:
            return self._text(value)
        if value is None or type(value) in (int, float, bool):
            return value if type(value) is not int or -2**63 <= value < 2**64 else str(value)
        if depth < 32 and isinstance(value, Mapping):
            return {str(k): self._nested(v, depth + 1) for k, v in value.items()}
        if depth < 32 and isinstance(value, (list, tuple)):
            return [self._nested(v, depth + 1) for v in value]
        return self._text(_plain(value))

    def _text(self, value: Any) -> str:
        text = value if type(value) is str else _as_text(value)
        if len(text) > self.limits.max_chars:
            self.truncated += 1
            if "text" not in self._warned:
                self._warned.add("text")
                log.warning("tracklane: strings longer than %d characters are cut (counted; see record_limits.max_chars)",
                            self.limits.max_chars)
            return text[: self.limits.max_chars]
        return text

    def _trajectory(self, item: Any) -> Trajectory:
        data = _fields(item)
        messages = [{"role": self._text(m.get("role", "")), "content": self._text(m.get("content", ""))}
                    for m in data.get("messages") or []]
        calls = [self._tool_call(_fields(c)) for c in data.get("tool_calls") or []]
        rewards = data.get("rewards", data.get("reward"))
        rewards = {str(k): _score(v) for k, v in rewards.items()} if type(rewards) is dict or isinstance(rewards, Mapping) \
            else {"score": _score(rewards)}
        meta = {str(k): _plain(v) for k, v in (data.get("meta") or {}).items()}
        return Trajectory(messages=messages, tool_calls=calls, rewards=rewards, meta=meta,
                          token_ids=_int32_bytes(data.get("token_ids")))

    def _tool_call(self, call: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self._text(call.get("name", "")), "arguments": self._text(call.get("arguments", "")),
               "result": self._text(call.get("result", ""))}
        latency = call.get("latency_s", call.get("latency"))
        out["latency_s"] = _score(latency) if latency is not None else None
        return out


def _fields(item: Any) -> Mapping[str, Any]:
    if type(item) is dict or isinstance(item, Mapping):  # the exact type first: the ABC check costs ~1 us a call
        return item
    if isinstance(item, Trajectory):
        return {name: getattr(item, name) for name in Trajectory.__slots__}
    raise TypeError(f"a trajectory must be a dict or a Trajectory, got {type(item).__name__}")


def _fields_of_message(message: Any) -> Mapping[str, Any]:
    if isinstance(message, Mapping):
        return message
    raise TypeError(f"a trace message must be a dict, got {type(message).__name__}")


def _nanoseconds(value: Any) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"a trace time must be >= 0 ns, got {number}")
    return number


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _score(value: Any) -> float:
    if type(value) is float:
        return value
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return math.nan


def _plain(value: Any) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, (np.generic,)):
        return value.item()
    return str(value)


def _numpy(value: Any) -> np.ndarray:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _float_array(values: Any) -> np.ndarray:
    return _numpy(values).astype(np.float64, copy=False).ravel()


def _int32_bytes(token_ids: Any) -> bytes:
    if token_ids is None:
        return b""
    if isinstance(token_ids, (bytes, bytearray)):
        return bytes(token_ids)
    return np.ascontiguousarray(_numpy(token_ids), dtype="<i4").ravel().tobytes()
