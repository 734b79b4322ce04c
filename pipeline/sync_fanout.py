"""The synchronous path (``log_async: false``): the same sinks, called in-process, in turn.

This is the baseline the benchmarks compare against, and the fallback where Ray is
not wanted. Each sink is isolated: its failure is caught, counted and warned about
once, and never stops the others or the training loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .report import LaneReport, PipelineReport
from .convert import Converter
from .rich import RecordLimits

log = logging.getLogger("tracklane")


class SyncFanout:
    def __init__(self, sinks: dict[str, Any], limits: RecordLimits) -> None:
        self._sinks = sinks
        self.health: dict[str, float | int] = {}  # nothing queues on this path: no lag, no queue
        self._reports = {name: LaneReport(name=name) for name in sinks}
        self._open: set[str] = set()
        self._converter = Converter(limits)
        for name, sink in sinks.items():
            if self._guard(name, 0, sink.open, None):
                self._open.add(name)

    def put(self, item: tuple) -> None:
        """Write one captured item (see convert.py) into every sink, in turn."""
        record = self._converter.record(item)
        if record is None:
            return
        only = record.only
        for name, sink in self._sinks.items():
            if only is not None and name not in only:
                continue
            if name in self._open:
                self._guard(name, 1, sink.write, [record])
            else:
                self._reports[name].failed_records += 1

    def flush(self) -> PipelineReport:
        started = time.monotonic()
        for name in self._open:
            self._guard(name, 0, self._sinks[name].flush)
        return self.report(started)

    def close(self, exit_code: int) -> PipelineReport:
        started = time.monotonic()
        for name, sink in self._sinks.items():
            if name in self._open:
                self._guard(name, 0, sink.close, exit_code)
            self._reports[name].where = sink.where()
            snapshot = getattr(sink, "snapshot", None)
            if callable(snapshot):
                self._reports[name].snapshot = snapshot()
        self._open.clear()
        return self.report(started)

    def report(self, started: float) -> PipelineReport:
        for name, sink in self._sinks.items():
            self._reports[name].unsupported = dict(sink.unsupported)
            self._reports[name].artifacts_missing = sink.artifacts_missing
        return PipelineReport(lanes=dict(self._reports), elapsed_s=time.monotonic() - started,
                              **self._converter.counts())

    def _guard(self, name: str, records: int, call: Any, *args: Any) -> bool:
        try:
            call(*args)
            return True
        except Exception as exc:  # a tracker's failure must never reach the training loop
            report = self._reports[name]
            report.failed_records += records
            first = report.error is None
            report.error = f"{type(exc).__name__}: {exc}"
            if first:
                log.warning("tracklane: backend %s failed (%s); counting its failures from now on",
                            name, report.error, exc_info=True)
            return False
