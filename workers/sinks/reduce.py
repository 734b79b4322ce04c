"""The reduce lane's sink: every sender's batches in, one point per key and step out (core/reduction.py).

Not a tracker but a judge (host/sink.py ``Judging``): its store is the reducer's state, one msgpack file rewritten
after every batch (``flush``), so what it was handed survives its actor. It keeps the last batch of every sender it
was handed in that state and skips a batch sent again, so a batch lands once even when its actor died between the
file and the lane's own acknowledgement state. Each step it completes it emits into every tracker, as a sender of
its own (judge.py: on disk before the state that says so).

Selected by ``trainer.async_log.reductions: true`` (the trainer adds it to the run's backends), never by
``trainer.logger``. Settings: ``timeout_s`` (``trainer.async_log.reduce_timeout_s``) and ``state_path`` (set by
the pipeline: the spool's lanes folder, or in memory only on the synchronous path).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tracklane.core.records import Metrics, Record, Reduction, RunSpec
from tracklane.core.reduction import PART, Reducer
from tracklane.workers.sinks.judge import JudgeSink

DEFAULT_TIMEOUT_S = 60.0


class ReduceSink(JudgeSink):
    name = "reduce"
    reduces = True

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        timeout = (trainer.get("async_log") or {}).get("reduce_timeout_s", DEFAULT_TIMEOUT_S)
        return {"timeout_s": float(timeout), "state_path": ""}  # the pipeline sets state_path

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.reducer = Reducer(float(self.settings.get("timeout_s", DEFAULT_TIMEOUT_S)))
        self._sender, self._apply = "", True  # the synchronous path has no batches: rank 0's, every time

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        saved = self._load_state()
        if saved is not None:
            self.reducer = Reducer.from_plain(saved, self.reducer.timeout_s)
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
        self._emit_complete()
        self._sender, self._apply = "", True

    def _emit_complete(self) -> None:
        now = time.time()
        self._emit([Metrics(step=step, values=values, time=now) for step, values in self.reducer.complete()])

    def flush(self) -> None:
        self._emit_complete()  # a timeout may have passed
        self._save_state(self.reducer.to_plain())

    def judged(self) -> dict[str, Any]:
        return self.reducer.figures()

    def where(self) -> str:
        figures = self.reducer.figures()
        return f"reduce: {figures['emitted']} steps reduced" + (f", state in {self._path}" if self._path else "")
