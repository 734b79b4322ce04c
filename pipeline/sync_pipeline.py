"""The synchronous path (``log_async: false``): the same sink hosts, called in-process, in turn.

This is the baseline the benchmarks compare against, and the fallback where Ray is not
wanted. Each tracker sits behind its own ``SinkHost`` (pipeline/host/sink_host.py), exactly as in a
lane actor: a failure is retried with backoff, then counted, and never stops the others or the
training loop. The price of being synchronous: a failing tracker holds up the ``log()`` call
for at most its retries' backoff (``retry_backoff_s * (2 ** sink_retries - 1)``). What a tracker did not take
after them goes to the run's spool (sync_spool.py) for ``tracklane replay``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, cast

from tracklane.capture.captured import STEP, Captured
from tracklane.capture.convert import Converter
from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.acks import Ack
from tracklane.core.errors import ConfigError
from tracklane.core.records import Record, RunSpec
from tracklane.core.report import LaneInfo, LaneReport, PipelineReport
from tracklane.host.registry import backend_traits
from tracklane.host.sink import Judging
from tracklane.host.sink_host import SinkHost
from tracklane.sync_spool import SyncSpool


class SyncPipeline:
    def __init__(self, cfg: AsyncLogConfig, limits: RecordLimits, run: RunSpec,
                 backends: dict[str, tuple[type, dict[str, Any]]]) -> None:
        self._hosts = {name: SinkHost(name, cls(run, settings), cfg.sink_retries, cfg.retry_backoff_s)
                       for name, (cls, settings) in backends.items()}
        self.vitals: dict[str, float | int] = {}  # nothing queues on this path: no lag, no queue
        traits = backend_traits(backends)
        self._judges = [name for name in backends if name in traits["judges"]]
        self._converter = Converter(limits, backends=list(backends), traits=traits)
        self._chunk_bytes = cfg.max_batch_bytes
        self._late_drops = 0
        self._last_step: Any = None
        self._spool = SyncSpool(cfg, run, {name: settings for name, (_, settings) in backends.items()}) \
            if cfg.spool_dir else None
        for host in self._hosts.values():
            host.open()
        # the judges (trainer.async_log.reductions, trainer.health.enabled), last in the run, emit straight into the
        # sinks before them (host/registry.py JUDGES)
        names = list(self._hosts)
        for name in self._judges:
            cast(Judging, self._hosts[name].sink).judge_into(_InProcess(self, names[:names.index(name)]))

    def put(self, item: Captured) -> None:
        """Write one captured item into every tracker it is addressed to, in turn."""
        self._last_step = item[STEP]
        self._write(self._converter.records(item))

    def put_bulk(self, item: Captured) -> None:
        """A bulk item, a dump written a chunk (``max_batch_bytes``) at a time: it is never converted whole."""
        self._last_step = item[STEP]
        now, later = self._converter.staged(item, self._chunk_bytes, self._chunk_bytes)
        self._write(now)
        for rest in later:
            for record in rest:
                self._write([record])

    def _write(self, records: list[Record], names: list[str] | None = None) -> None:
        """``records`` into the trackers ``names`` (None: every one), in turn."""
        if not records:
            return
        for name in names if names is not None else self._hosts:
            host = self._hosts[name]
            host.write(records)
            if host.last_failed and self._spool is not None:
                self._spool.keep(host.lane, host.last_failed, host.resume)

    def drop_late(self) -> None:
        self._late_drops += 1

    def last_step(self) -> Any:
        return self._last_step

    def wait_ready(self, timeout: float) -> bool:
        return True  # every tracker was opened in the constructor

    def lanes(self) -> dict[str, LaneInfo]:
        return {name: LaneInfo(name=name, pid=os.getpid(), node_id="", unstored_bytes=0) for name in self._hosts}

    def flush(self, timeout: float) -> PipelineReport:
        """Every record is written already; this asks each tracker to flush (``timeout`` is not needed)."""
        started = time.monotonic()
        for host in self._hosts.values():
            host.flush()
        return self._report(started)

    def producer_spec(self) -> Any:
        raise ConfigError("Tracking.producer() needs trainer.log_async: true (producers ship to the lane actors)")

    def close(self, exit_code: int, timeout: float) -> PipelineReport:
        """Close every tracker in turn (in-process closes cannot be cut short: ``timeout`` is not applied)."""
        started = time.monotonic()
        for host in self._hosts.values():
            host.close(exit_code)
        if self._spool is not None:
            self._spool.close(exit_code, {name: host.resume for name, host in self._hosts.items()})
        return self._report(started)

    def _report(self, started: float) -> PipelineReport:
        spool = self._spool.report() if self._spool is not None else None
        report = PipelineReport(
            lanes={name: _lane_report(name, host.ack(handed=0)) for name, host in self._hosts.items()},
            dropped_records=self._late_drops, elapsed_s=time.monotonic() - started, spool=spool,
            spooled=dict(self._spool.records) if self._spool is not None else {})
        report.take_judged({name: cast(Judging, self._hosts[name].sink).judged() for name in self._judges}, self._judges)
        return self._converter.counted(report)


class _InProcess:
    """A judge's emitter on this path: what it emits is written into the other trackers at once."""

    def __init__(self, pipeline: SyncPipeline, names: list[str]) -> None:
        self._pipeline, self._names = pipeline, names

    def emit(self, records: Sequence[Record]) -> None:
        self._pipeline._write(list(records), self._names)

    def keep(self) -> None:
        pass  # written already


def _lane_report(name: str, ack: Ack) -> LaneReport:
    """A host's figures as a report: its counts and last error live in the host, so nothing is kept here."""
    report = LaneReport(name=name)
    report.take(ack)
    return report

