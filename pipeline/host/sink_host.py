"""One sink's life, the same on both paths: open (retried), route, write with retries, count.

The lane actor wraps a host in sequence bookkeeping (``log_async: true``); the synchronous
path is a loop over hosts (``log_async: false``). A host never raises: a tracker that fails is
retried with doubling backoff. Then, if it cannot be reached and the caller can wait (a lane
with the spool behind it), the batch is held: nothing handed, nothing counted, sent again
later. Otherwise the records it refused are counted as failed and the caller goes on.
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

from tracklane.core.acks import Ack, SinkCounts, Work
from tracklane.core.records import Record
from tracklane.host.sink import BatchPositions, CapturedOutput, LaggingStore, Sink, Undoable

log = logging.getLogger("tracklane")


class SinkHost:
    def __init__(self, lane: str, sink: Sink, retries: int, backoff_s: float,
                 resume: Mapping[str, Any] | None = None, counts: SinkCounts | None = None,
                 node_id: str = "", sleep: Callable[[float], None] = time.sleep, node_note: str = "") -> None:
        """``resume`` and ``counts`` come from an earlier actor of the same lane (None for a fresh one);
        ``node_note`` is added to ``where`` (the node the paths are on, when it is not the trainer's)."""
        self.lane = lane
        self.sink = sink
        self._ask_capabilities(sink)
        if counts is not None:
            sink.counts = counts
        self.resume: dict[str, Any] | None = dict(resume) if resume is not None else None
        """What the sink's open() returned (how to re-attach); None until it opened once."""
        self._retries = retries
        self._backoff_s = backoff_s
        self._sleep = sleep
        self._node_id = node_id
        self._node_note = node_note
        self._start_unopened()

    def _ask_capabilities(self, sink: Sink) -> None:
        """The optional capabilities (sink.py), asked once: None where the sink has none."""
        self._positions = sink if isinstance(sink, BatchPositions) else None
        self._lagging = sink if isinstance(sink, LaggingStore) else None
        self._undoable = sink if isinstance(sink, Undoable) else None
        self._printing = sink if isinstance(sink, CapturedOutput) else None

    def _start_unopened(self) -> None:
        """The tracker's state as this host sees it at first: not opened yet, nothing failed."""
        self._opened = False
        self._closed = False
        self._failing = False  # the last write failed: warn once per outage, not per batch
        self._open_error: BaseException | None = None
        self._open_warned = False
        self.error: str | None = None
        """What is wrong now (open, write, flush or close failed; None once a write went through again)."""
        self.last_error: str | None = None
        self.last_error_at = 0.0
        """The last error seen and when (time.time()), kept after the tracker recovered."""
        self.last_failed: list[Record] = []
        """The records the last write() counted failed (the synchronous path spools them for a replay)."""

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
            self._open_error = exc
            self._failed(f"open: {type(exc).__name__}: {exc}")
            if not self._open_warned:  # once per outage: open is retried at every attempt
                self._open_warned = True
                log.warning("tracklane: lane %s could not open its tracker: %s", self.lane, self.error)
            return False
        self._opened = True
        if self.resume is None:
            self.resume = dict(resume or {})
        return True

    def write(self, records: Sequence[Record], hold: bool = False, flush: bool = False,
              batch: tuple[str, int] | None = None) -> bool:
        """Write the records addressed to this lane, retrying with backoff; with ``flush`` also flushed,
        in the tracker's hands before it returns (what a lane's acknowledgement needs). Returns False,
        having handed and counted nothing, if ``hold`` and the tracker is unreachable: the caller sends
        them again later. Otherwise a batch the tracker refuses is written record by record, and only
        the records it refuses are counted failed. ``batch``: (sender, seq) of a lane's batch."""
        mine = [r for r in records if r.only is None or self.lane in r.only]
        self.last_failed = []
        if mine and self._closed:  # a sender still sending after the close (a producer, a judge): held, it waits in
            if hold:  # the sender's spool for a replay or the next resume; past its outage, counted as failed
                return False
            self.counts.failed_records += len(mine)
            self.last_failed = list(mine)
            return True
        if not mine:
            return True
        if batch is not None and self._positions is not None:
            self._positions.begin_batch(batch[0], batch[1], records)
        exc = self._attempt(mine, flush=flush)
        if exc is None:
            return True
        if self.sink.is_outage(exc):
            if hold:
                if not self._failing:
                    self._failing = True
                    log.warning("tracklane: backend %s cannot be reached (%s); retrying with backoff, "
                                "its records wait in the spool", self.lane, self.error)
                return False
            failed = mine
        else:  # the tracker answered and refused: find the records it refuses
            failed = [r for r in mine if self._attempt([r], retries=0, flush=flush) is not None] \
                if len(mine) > 1 else mine
        self.counts.failed_records += len(failed)
        self.last_failed = failed
        if not self._failing:
            self._failing = True
            log.warning("tracklane: backend %s failed: %d of %d record(s) after %d retries (%s); counting failures "
                        "from now on", self.lane, len(failed), len(mine), self._retries, self.error)
        return True

    def _attempt(self, records: Sequence[Record], retries: int | None = None, flush: bool = False) -> BaseException | None:
        """Open if needed, write (and flush), with doubling backoff; None on success, else the last error."""
        delay = self._backoff_s
        retries = self._retries if retries is None else retries
        last: BaseException | None = None
        for attempt in range(retries + 1):
            if self.open():
                try:
                    self.sink.write(records)
                    if flush:
                        self.sink.flush()
                    self.error = None  # it took records again: nothing is wrong now (last_error keeps what was)
                    if self._failing:
                        self._failing = False
                        log.warning("tracklane: backend %s writes again", self.lane)
                    return None
                except Exception as exc:  # any SDK error: isolated to this lane
                    self._failed(f"{type(exc).__name__}: {exc}")
                    last = exc
            else:
                last = self._open_error or RuntimeError(self.error or "the tracker did not open")
            if attempt < retries:
                self._sleep(delay)
                delay *= 2
        return last

    def _failed(self, message: str) -> None:
        self.error = self.last_error = message
        self.last_error_at = time.time()

    def note_error(self, message: str) -> None:
        """Record an error that is not the tracker's (e.g. a corrupt batch)."""
        self._failed(message)
        log.warning("tracklane: lane %s: %s", self.lane, message)

    def flush(self) -> None:
        if self._opened and not self._closed:
            self._guard("flush", self.sink.flush)

    def close(self, exit_code: int) -> bool:
        """End the tracker run once (exit code / run status); later writes are ignored. True if it
        closed cleanly: then the tracker's store holds everything written."""
        clean = not self._opened or self._closed or self._guard("close", self.sink.close, exit_code)
        self._closed = True
        return clean

    def written(self) -> Any:
        """The sink's durability point for what it was handed so far (``LaggingStore.written``; None: stored once handed)."""
        if self._lagging is None:
            return None
        try:
            return self._lagging.written()
        except Exception as exc:  # no point: the batch counts as stored once flushed, as in most trackers
            self._failed(f"written: {type(exc).__name__}: {exc}")
            return None

    def stored(self, point: Any) -> bool:
        """Whether the sink's store holds what was handed to it up to ``point``; False if it cannot tell."""
        if self._lagging is None:
            return True
        try:
            return self._lagging.stored(point)
        except Exception as exc:  # cannot tell: the batch waits (in the spool) until close
            self._failed(f"stored: {type(exc).__name__}: {exc}")
            return False

    def _guard(self, what: str, call: Callable[..., None], *args: Any) -> bool:
        try:
            call(*args)
            return True
        except Exception as exc:  # a tracker's failure never reaches the caller
            self._failed(f"{what}: {type(exc).__name__}: {exc}")
            log.warning("tracklane: lane %s: %s", self.lane, self.error)
            return False

    def mark(self, records: Sequence[Record]) -> dict[str, Any] | None:
        """The sink's undo point before ``records`` (None if it has none, or is not open)."""
        if not self._opened or self._undoable is None:
            return None
        try:
            return self._undoable.mark(records)
        except Exception as exc:  # no undo point: the batch is still written, only not undoable
            self._failed(f"mark: {type(exc).__name__}: {exc}")
            return None

    def rollback(self, mark: Mapping[str, Any]) -> None:
        """Undo a write the previous actor did not acknowledge (before this host opens)."""
        if self._undoable is not None:
            self._guard("rollback", self._undoable.rollback, mark)

    def capture_output(self) -> None:
        """What the sink prints is kept for ``take_output`` (in a lane actor: the trainer prints it)."""
        if self._printing is not None:
            self._printing.capture_output()

    def take_output(self) -> str:
        """The lines the sink printed since the last call ("" for a sink that does not print)."""
        return self._printing.take_output() if self._printing is not None else ""

    def ack(self, handed: int, stored: int | None = None, gap: bool = False, held: bool = False,
            handed_by_sender: dict[str, int] | None = None, work: Work | None = None,
            output: str = "") -> Ack:
        """This host's figures now, as the lane and the report read them."""
        return Ack(handed=handed, stored=None if stored == handed else stored, gap=gap, held=held,
                   handed_by_sender=handed_by_sender or {}, opened=self._opened, error=self.error, last_error=self.last_error,
                   last_error_at=self.last_error_at, counts=self.counts, where=self.sink.where() + self._node_note,
                   pid=os.getpid(), node_id=self._node_id, work=work or Work(), output=output)
