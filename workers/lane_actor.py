"""The Ray actor that drains one lane into one tracker: sequence bookkeeping around a sink host.

It decodes each batch, skips what it already applied (re-sends after a restart), refuses a
batch that does not follow the last one applied, hands the rest to its ``SinkHost`` (which
writes with retries, flushes and counts), records the sequence number durably, and answers with
an ``Ack`` packed as msgpack. A tracker that cannot be reached makes it answer "held" (nothing
applied; the lane sends the batch again later). A failing tracker costs only this lane.

Exactly once: the state moves right after the tracker's flush returned, and a sink that can undo
a partial write (``Sink.mark``) has its undo point saved before the write, so an actor killed
between the two is rolled back by its successor and the re-sent batch lands once. A tracker whose
store lags what it was handed (wandb: ``Sink.written``/``Sink.durable``) has two watermarks: the
last batch handed to it (the lane sends the next one) and the last its store holds (what the
state saves, what a successor starts from, what the spool may forget); a successor's sink skips
what its tracker's store turns out to hold already.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

from pipeline.backends import backend_class
from pipeline.codec import decode_batch
from pipeline.errors import CodecError
from pipeline.lane_state import LaneState
from pipeline.opening import LaneOpening
from workers.sink_host import SinkHost


class LaneActor:
    """Hosts one sink. Ray calls run one at a time, in submission order."""

    def __init__(self, lane: str, opening: bytes) -> None:
        spec = LaneOpening.unpack(opening)
        self._state = LaneState.load(os.path.join(spec.state_dir, f"{lane}.state"))
        sink = backend_class(spec.backend)(spec.run, spec.settings)
        self._host = SinkHost(lane, sink, spec.sink_retries, spec.retry_backoff_s, resume=self._state.resume,
                              counts=self._state.counts, node_id=_node_id())
        if self._state.pending and self._state.mark is not None:  # the previous actor died inside a write
            self._host.rollback(self._state.mark)
        self._state.pending, self._state.mark = 0, None
        self._written = self._state.applied  # the last batch handed to the tracker; the state keeps the durable one
        self._not_durable: deque[tuple[int, Any]] = deque()  # (seq, the sink's point) handed but not durable yet
        if self._host.open():
            self._save()

    def ready(self) -> bytes:
        """Whether the tracker opened, and what was applied before (non-zero after a restart)."""
        return self._answer()

    def apply(self, seq: int, prev: int, blob: bytes, final: bool = False) -> bytes:
        """Write batch ``seq`` if it follows ``prev``, the last batch the lane sent before it. ``final``:
        the lane waited long enough (max_outage_s); count what does not arrive instead of holding it."""
        if seq <= self._written:  # a re-send of what the tracker has already
            self._settle()
            return self._answer()
        if prev != self._written:
            return self._answer(gap=True)
        try:
            batch = decode_batch(blob)
        except CodecError as exc:
            self._host.note_error(f"corrupt batch {seq}: {exc}")
        else:
            mark = self._host.mark(batch.records)
            if mark is not None:
                self._state.pending, self._state.mark = seq, mark
                self._save()
            if not self._host.write(batch.records, hold=not final, durable=True):
                return self._answer(held=True)  # the mark stays: rolling back to it undoes nothing
        self._written = seq
        self._not_durable.append((seq, self._host.written()))
        self._state.pending, self._state.mark = 0, None
        self._settle()
        self._save()
        return self._answer()

    def _settle(self) -> None:
        """Move the durable watermark over every batch the tracker's store now holds, in order."""
        while self._not_durable:
            seq, point = self._not_durable[0]
            if point is not None and not self._host.durable(point):
                return
            self._not_durable.popleft()
            self._state.applied = seq

    def flush(self) -> bytes:
        self._host.flush()
        self._settle()
        self._save()
        return self._answer()

    def close(self, exit_code: int) -> bytes:
        """End the tracker run; answers with the final figures."""
        if self._host.close(exit_code):  # closed cleanly: its store holds everything handed to it
            self._not_durable.clear()
            self._state.applied = self._written
        self._save()
        return self._answer()

    def _save(self) -> None:
        self._state.resume = self._host.resume
        self._state.counts = self._host.counts
        self._state.save()

    def _answer(self, gap: bool = False, held: bool = False) -> bytes:
        return self._host.ack(self._written, durable=self._state.applied, gap=gap, held=held).pack()


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # outside Ray (tests run the actor in-process)
        return ""
