"""One sink's life, the same on both paths: open (retried), route, write with retries, count.

The lane actor wraps a host in sequence bookkeeping (``log_async: true``); the synchronous
path is a loop over hosts (``log_async: false``). A host never raises: a tracker that fails is
retried with doubling backoff, then its records are counted as failed and the caller goes on.
On the synchronous path that bounds one ``log()`` per failing tracker to
``retry_backoff_s * (2 ** sink_retries - 1)`` seconds of waiting (3.5 s with the defaults),
plus the tracker's own time per attempt.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.ack import Ack, SinkCounts
from pipeline.records import Record
from workers.sink import Sink

log = logging.getLogger("tracklane")


class SinkHost:
    def __init__(self, lane: str, sink: Sink, retries: int, backoff_s: float,
                 resume: Mapping[str, Any] | None = None, counts: SinkCounts | None = None,
                 node_id: str = "", sleep: Callable[[float], None] = time.sleep) -> None:
        """``resume`` and ``counts`` come from an earlier actor of the same lane (None for a fresh one)."""
        self.lane = lane
        self.sink = sink
        if counts is not None:
            sink.counts = counts
        self.resume: dict[str, Any] | None = dict(resume) if resume is not None else None
        """What the sink's open() returned (how to re-attach); None until it opened once."""
        self._retries = retries
        self._backoff_s = backoff_s
        self._sleep = sleep
        self._node_id = node_id
        self._opened = False
        self._closed = False
        self._failing = False  # the last write failed: warn once per outage, not per batch
        self.error: str | None = None
        """The last error seen (open, write, flush or close)."""

    @property
    def counts(self) -> SinkCounts:
        return self.sink.counts

    def open(self) -> bool:
        """Open the tracker if it is not open yet; False (and ``error`` set) if it cannot now."""
        if self._opened:
            return True
        try:
            resume = self.sink.open(self.resume)
        except Exception as exc:  # the tracker may be down: reported, retried at the next write
            self.error = f"open: {type(exc).__name__}: {exc}"
            log.warning("tracklane: lane %s could not open its tracker: %s", self.lane, self.error)
            return False
        self._opened = True
        if self.resume is None:
            self.resume = dict(resume or {})
        return True

    def write(self, records: Sequence[Record]) -> None:
        """Write the records addressed to this lane, retrying with backoff; count them failed at the end."""
        mine = [r for r in records if r.only is None or self.lane in r.only]
        if not mine or self._closed:
            return
        delay = self._backoff_s
        for attempt in range(self._retries + 1):
            if self.open():
                try:
                    self.sink.write(mine)
                    if self._failing:
                        self._failing = False
                        log.warning("tracklane: backend %s writes again", self.lane)
                    return
                except Exception as exc:  # any SDK error: isolated to this lane
                    self.error = f"{type(exc).__name__}: {exc}"
            if attempt < self._retries:
                self._sleep(delay)
                delay *= 2
        self.counts.failed_records += len(mine)
        if not self._failing:
            self._failing = True
            log.warning("tracklane: backend %s failed: %d record(s) after %d retries (%s); counting failures from now on",
                        self.lane, len(mine), self._retries, self.error)

    def note_error(self, message: str) -> None:
        """Record an error that is not the tracker's (e.g. a corrupt batch)."""
        self.error = message
        log.warning("tracklane: lane %s: %s", self.lane, message)

    def flush(self) -> None:
        if self._opened and not self._closed:
            self._guard("flush", self.sink.flush)

    def close(self, exit_code: int) -> None:
        """End the tracker run once (exit code / run status); later writes are ignored."""
        if self._opened and not self._closed:
            self._guard("close", self.sink.close, exit_code)
        self._closed = True

    def _guard(self, what: str, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:  # a tracker's failure never reaches the caller
            self.error = f"{what}: {type(exc).__name__}: {exc}"
            log.warning("tracklane: lane %s: %s", self.lane, self.error)

    def ack(self, applied: int, gap: bool = False) -> Ack:
        """This host's figures now, as the lane and the report read them."""
        return Ack(applied=applied, gap=gap, opened=self._opened, error=self.error, counts=self.counts,
                   where=self.sink.where(), pid=os.getpid(), node_id=self._node_id)
