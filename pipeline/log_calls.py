"""The ``log*()`` calls, shared by ``Tracking`` (rank 0) and ``Producer`` (any Ray actor or task).

Each takes a cheap copy of what it is given and puts one tuple in ``Captured``'s field order into
the pipeline (``self._put``); everything else (cleaning, encoding, shipping) happens off the
caller's thread. Bad input is counted and warned about, never raised into the training loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from tracklane.capture.captured import METRICS, METRICS_ON_AXIS, REDUCE
from tracklane.core.records import BULK_KINDS
from tracklane.core.values import BYTES_PER_ENTRY

log = logging.getLogger("tracklane")
_now = time.time


class LogCalls:
    """Needs ``_put`` and ``_put_bulk`` (the pipeline's puts of small and of bulk records), ``_report`` (None until
    finished), ``_rejected`` and ``_drop_late()``."""

    _put: Any
    _put_bulk: Any
    _report: Any
    _rejected: int

    def _drop_late(self) -> None:
        raise NotImplementedError

    def log(self, data: dict, step: int, backend: str | list[str] | None = None, axis: str | None = None,
            reduce: str | dict[str, str] | None = None, keep_per_producer: bool = False) -> None:
        """Hand over the metrics of one step. In async mode this is a shallow copy and an append.

        ``axis`` names what ``step`` counts when it is not the trainer's step (``rollout/step``,
        ``param_version``): every tracker keeps the points on that axis, in any order.

        ``reduce`` ("mean", "sum", "min", "max", "count", or a dict key -> one of them): the run gets one point
        per key and step, under the key as given, reduced over every producer that logged it at that step
        (core/reduction.py says when a step is complete); ``keep_per_producer`` logs each producer's own values
        too, under its prefix. Needs ``trainer.async_log.reductions: true`` on the asynchronous path."""
        try:
            if self._report is not None:
                return self._drop_late()
            values = data.copy() if type(data) is dict else dict(data)
            if reduce is not None:
                self._put((step, (values, reduce, bool(keep_per_producer), axis), _now(), backend, REDUCE,
                           len(values) * BYTES_PER_ENTRY))
            elif axis is None:
                self._put((step, values, _now(), backend, METRICS, len(values) * BYTES_PER_ENTRY))  # a Captured
            else:
                self._put((step, (values, str(axis)), _now(), backend, METRICS_ON_AXIS,
                           len(values) * BYTES_PER_ENTRY))
        except Exception:  # bad input must never stop the training loop; it is counted
            self._reject("log", data)

    # -- rich records: each takes a cheap copy here; conversion happens off this thread -------
    def log_generations(self, samples: Sequence[Sequence[Any]], step: int, backend: str | list[str] | None = None,
                        key: str = "val/generations") -> None:
        """Validation samples of ``(input, output, score)``, as verl's ValidationGenerationsLogger gets them."""
        try:
            rows = list(samples)
            size = sum(len(row[0]) + len(row[1]) for row in rows if len(row) >= 2) + 64 * len(rows)
            self._rich("generations", step, (rows, key), backend, size)
        except Exception:
            self._reject("log_generations", samples)

    def log_trajectories(self, trajectories: Sequence[Any], step: int, backend: str | list[str] | None = None,
                         key: str = "rollout/trajectories") -> None:
        """Rollout trajectories: dicts (or ``Trajectory``) with messages, tool_calls, rewards, meta, token_ids."""
        try:
            items = list(trajectories)
            self._rich("trajectories", step, (items, key), backend, _trajectories_size(items))
        except Exception:
            self._reject("log_trajectories", trajectories)

    def log_histogram(self, name: str, values: Any, step: int, backend: str | list[str] | None = None) -> None:
        """A distribution (rewards, advantages, KL per token ...): a list, array or tensor of numbers."""
        try:
            copied = values.copy() if hasattr(values, "copy") else list(values)  # arrays change in place
            self._rich("histogram", step, (name, copied), backend, 8 * len(copied) + 64)
        except Exception:
            self._reject("log_histogram", values)

    def log_text(self, name: str, text: str, step: int, backend: str | list[str] | None = None) -> None:
        try:
            self._rich("text", step, (name, text), backend, len(text) + 64)
        except Exception:
            self._reject("log_text", text)

    def log_image(self, name: str, image: Any, step: int, backend: str | list[str] | None = None) -> None:
        """PNG bytes, or an HxW / HxWxC uint8 array (encoded to PNG off the caller's thread)."""
        try:
            if isinstance(image, bytes):
                self._rich("image", step, (name, image), backend, len(image))
            else:
                copied = image.copy()  # arrays change in place
                self._rich("image", step, (name, copied), backend, copied.nbytes)
        except Exception:
            self._reject("log_image", image)

    def log_artifact(self, path: str, name: str | None = None, type: str = "artifact", step: int = 0,
                     backend: str | list[str] | None = None) -> None:
        """A file to store with the run (read by the trackers later: keep it in place until finish())."""
        try:
            absolute = os.path.abspath(path)
            self._rich("artifact", step, (absolute, name or os.path.basename(absolute), type), backend, 256)
        except Exception:
            self._reject("log_artifact", path)

    def log_trace(self, name: str, step: int, start_ns: int, end_ns: int, status: str = "success",
                  attributes: dict | None = None, messages: list | None = None, metadata: dict | None = None,
                  key: str | None = None, backend: str | list[str] | None = None) -> None:
        """One traced call (a tool, an agent loop, a generate call) or span: its name, wall-clock start and end
        (``time.time_ns``), status (``success``/``error``), flat ``attributes``, the call as ``messages``
        ([{"role", "content"}]) and nested ``metadata``; ``key``: where trackers keep it (``rollout_trace/<name>``).
        verl's rollout traces come here with the drop-in (pipeline/verl/rollout_traces.py)."""
        try:
            size = 512 + sum(len(m.get("content") or "") for m in messages or () if isinstance(m, dict))
            self._rich("trace", step, (name, key or f"rollout_trace/{name}", start_ns, end_ns, status, attributes,
                                       messages, metadata), backend, size)
        except Exception:
            self._reject("log_trace", name)

    def _rich(self, kind: str, step: int, payload: tuple, backend: Any, size: int) -> None:
        if self._report is not None:
            return self._drop_late()
        put = self._put_bulk if kind in BULK_KINDS else self._put  # small records overtake bulk (buffer.py)
        put((step, payload, _now(), backend, kind, size))  # a Captured

    def _reject(self, call: str, data: Any) -> None:
        self._rejected += 1
        log.warning("tracklane: %s() could not take %s; skipped and counted", call, type(data).__name__,
                    exc_info=True)


_SIZE_SAMPLES = 8


def _trajectories_size(items: list) -> int:
    """Rough bytes of a list of trajectories, from at most 8 evenly spaced ones: sizing all 256 of a
    step on the caller's thread cost ~0.3 ms, and the buffer's bound only needs an estimate."""
    if len(items) <= _SIZE_SAMPLES:
        return sum(map(_trajectory_size, items))
    stride = len(items) / _SIZE_SAMPLES
    sampled = sum(_trajectory_size(items[int(i * stride)]) for i in range(_SIZE_SAMPLES))
    return sampled * len(items) // _SIZE_SAMPLES


def _trajectory_size(item: Any) -> int:
    """Rough bytes of one trajectory (text and token ids), for the buffer's bound; kept cheap."""
    if type(item) is not dict:
        return 4096
    size = 256
    for message in item.get("messages") or ():
        size += len(message.get("content") or "")
    token_ids = item.get("token_ids")
    return size if token_ids is None else size + 4 * len(token_ids)
