"""The reduce lane's sink: every sender's batches in, one point per key and step out (core/reduction.py).

Not a tracker but a judge (host/sink.py ``Judging``): its store is the reducer's state, one msgpack file rewritten
after every batch (``flush``), so what it was handed survives its actor. It keeps the last batch of every sender it
was handed in that state and skips a batch sent again, so a batch lands once even when its actor died between the
file and the lane's own acknowledgement state. Each step it completes it emits into every tracker, as a sender of
its own (``Emitter``): on disk before the state that says so, so a restarted judge neither loses a step nor emits
it twice (its emitter leaves out what an earlier one emitted: shipping/judge_emitter.py).

Selected by ``trainer.async_log.reductions: true`` (the trainer adds it to the run's backends), never by
``trainer.logger``. Settings: ``timeout_s`` (``trainer.async_log.reduce_timeout_s``) and ``state_path`` (set by
the pipeline: the spool's lanes folder, or in memory only on the synchronous path).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from tracklane.core.files import write_atomically
from tracklane.core.records import Metrics, Record, Reduction, RunSpec
from tracklane.core.reduction import PART, Reducer
from tracklane.host.sink import Emitter, Sink

log = logging.getLogger("tracklane")

DEFAULT_TIMEOUT_S = 60.0


class ReduceSink(Sink):
    name = "reduce"
    judges = reduces = True

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        timeout = (trainer.get("async_log") or {}).get("reduce_timeout_s", DEFAULT_TIMEOUT_S)
        return {"timeout_s": float(timeout), "state_path": ""}  # the pipeline sets state_path

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._path = str(self.settings.get("state_path") or "")
        self.reducer = Reducer(float(self.settings.get("timeout_s", DEFAULT_TIMEOUT_S)))
        self._sender, self._apply = "", True  # the synchronous path has no batches: rank 0's, every time
        self._emitter: Emitter | None = None

    def judge_into(self, emitter: Emitter) -> None:
        self._emitter = emitter

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        if self._path and os.path.exists(self._path):
            with open(self._path, "rb") as handle:
                self.reducer = Reducer.from_plain(msgpack.unpackb(handle.read(), raw=False),
                                                  self.reducer.timeout_s)
        return {}

    def begin_batch(self, sender: str, seq: int, records: Sequence[Record]) -> None:
        self._sender, self._apply = sender, self.reducer.begin(sender, seq)

    def write(self, records: Sequence[Record]) -> None:
        if not self._apply:  # a batch this reducer was handed before its lane's state said so
            return
        sender, reducer = self._sender, self.reducer
        for record in records:
            if isinstance(record, Reduction):
                if record.role == PART:
                    reducer.contribute(sender, record.step, record.values, record.op, record.ops)
                elif not sender:  # notices come from rank 0 only
                    reducer.notice(record.role, record.step, record.values)
            elif not isinstance(record, Metrics) or record.axis is None:  # anything on the trainer's step
                reducer.saw(sender, record.step)
        self._emit()
        self._sender, self._apply = "", True

    def _emit(self) -> None:
        now = time.time()
        points = [Metrics(step=step, values=values, time=now) for step, values in self.reducer.complete()]
        if points and self._emitter is not None:
            self._emitter.emit(points)

    def flush(self) -> None:
        self._emit()  # a timeout may have passed
        if self._emitter is not None:
            self._emitter.keep()  # what was emitted is on disk before the state says it was
        if self._path:
            write_atomically(self._path, msgpack.packb(self.reducer.to_plain(), use_bin_type=True))

    def judged(self) -> dict[str, Any]:
        return self.reducer.figures()

    def where(self) -> str:
        figures = self.reducer.figures()
        return f"reduce: {figures['emitted']} steps reduced" + (f", state in {self._path}" if self._path else "")
