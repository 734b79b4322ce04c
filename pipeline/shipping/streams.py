"""One tracker's lane as the shipper sees it: two streams into the same actor, small records before bulk.

A rollout dump of hundreds of MB takes a tracker seconds to store; a step's scalars must not wait behind it. So
each tracker's lane has two streams (two ``Stream``s, stream.py), numbered from the one sequence of the spool: the
small stream (metrics, params, text, histograms, the vitals) under the producer's sender id, the bulk
stream (rollouts, tables, media) under that id plus ``BULK``. The actor keeps a watermark per sender, so each
stream is handed once and in order; Ray runs an actor's calls in the order they were sent, so a small batch
waits at most for the bulk batches already in flight (``max_inflight_batches``, a chunk each).

A batch the tracker has nothing in (its ``audience`` leaves it out: the file's share of a dump, when the
dashboards keep a sample) is never sent to it. A judge's lane never gets bulk.

The spool may forget a batch once every tracker's store holds it: here, once no stream still waits for it
(``stored``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from tracklane.core.acks import Ack
from tracklane.core.report import LaneInfo, LaneReport
from tracklane.shipping.stream import Entry, Reload, Stream, StreamSettings
from tracklane.shipping.wakeup import Wakeup
from tracklane.spool.lane_state import bulk_sender
from tracklane.spool.segments import SpoolEntry


class TrackerLane:
    """The small and the bulk stream of one tracker's lane, with the interface of one lane."""

    def __init__(self, name: str, actor: Any, settings: StreamSettings, *, reload: Reload | None = None,
                 sender: str = "", on_output: Callable[[str], None] | None = None) -> None:
        """As ``Stream``'s; ``on_output`` is the small stream's."""
        self.name = name
        self.actor = actor
        self.small = Stream(name, actor, settings, reload=reload, sender=sender, on_output=on_output)
        self.bulk = Stream(name, actor, settings, reload=reload, sender=bulk_sender(sender))
        self._offered = 0  # the newest batch offered, sent or skipped

    @property
    def streams(self) -> list[Stream]:
        return [self.small, self.bulk]

    def _stream(self, bulk: bool) -> Stream:
        return self.bulk if bulk else self.small

    def _mine(self, audience: frozenset[str] | None) -> bool:
        return audience is None or self.name in audience

    # -- feeding -------------------------------------------------------------------------
    def offer(self, entry: Entry) -> None:
        self._offered = max(self._offered, entry.seq)
        if self._mine(entry.audience):
            self._stream(entry.bulk).offer(entry)

    def preload(self, entries: Iterable[SpoolEntry], through: int = 0) -> None:
        """Batches an earlier process spooled, each to its stream (those it has nothing in are skipped). ``through``:
        the last batch an earlier process numbered; those not in ``entries`` this tracker's store holds already (a
        lane with nothing to deliver again lets the spool forget them)."""
        entries = list(entries)
        for bulk in (False, True):
            self._stream(bulk).window.preload(e for e in entries if e.bulk == bulk and self._mine(e.audience))
        self._offered = max([self._offered, through] + [e.seq for e in entries])

    def holds(self, entry: Entry) -> bool:
        """Whether it would keep ``entry`` in memory (it is for this tracker and fits the stream's bound)."""
        return self._mine(entry.audience) and self._stream(entry.bulk).fits(entry.nbytes)

    def has_room(self, nbytes: int, bulk: bool = False) -> bool:
        return self._stream(bulk).has_room(nbytes)

    def wait_for_room(self, nbytes: int, bulk: bool, deadline: float, wakeup: Wakeup) -> None:
        """The block policy: pump until the stream has room for ``nbytes`` or ``deadline`` (time.monotonic) passes."""
        while not self.has_room(nbytes, bulk) and time.monotonic() < deadline:
            wakeup.watch(self.waitables())
            wakeup.wait(min(self.wake_at(), deadline) - time.monotonic())
            self.pump()

    def evicted(self, seqs: set[int]) -> int:
        return sum(stream.window.evicted(seqs) for stream in self.streams)

    # -- progress ------------------------------------------------------------------------
    def waitables(self) -> list[Any]:
        return [ref for stream in self.streams for ref in stream.waitables()]

    def wake_at(self) -> float:
        return min(stream.wake_at() for stream in self.streams)

    def pump(self) -> None:
        for stream in self.streams:
            stream.pump()
        if self.dead:  # one stream gave up on the actor: so does the other (what it lacks stays on disk)
            for stream in self.streams:
                if not stream.dead:
                    stream.give_up(self.report.error or "the lane's other stream gave up")

    def accept(self, ack: Ack) -> None:
        """An answer to a flush or close (the small stream's sender): each stream takes its own watermarks."""
        self.small.accept(ack)
        self.bulk.accept(ack.for_sender(self.bulk.sender))

    def refresh(self) -> None:
        self.small.refresh()

    def freeze(self) -> None:
        for stream in self.streams:
            stream.freeze()

    # -- state ---------------------------------------------------------------------------
    @property
    def dead(self) -> bool:
        return any(stream.dead for stream in self.streams)

    @property
    def answered(self) -> bool:
        return self.small.answered

    @property
    def report(self) -> LaneReport:
        """The small stream's: the tracker's own figures (both streams' answers carry the same)."""
        return self.small.report

    def offered(self) -> dict[str, int]:
        """Per stream (its sender id), the last batch handed to it: the actor has them all once its ``senders``
        reach these."""
        return {stream.sender: stream.window.offered for stream in self.streams if stream.window.offered}

    @property
    def handed_by_sender(self) -> dict[str, int]:
        """How far each sender got at the actor, as of the newer of the two streams' answers."""
        return _newest(stream.handed_by_sender for stream in self.streams)

    @property
    def stored_by_sender(self) -> dict[str, int]:
        return _newest(stream.stored_by_sender for stream in self.streams)

    def _first(self, stored: bool) -> int | None:
        return min((seq for stream in self.streams if (seq := stream.window.first_pending(stored)) is not None),
                   default=None)

    @property
    def stored(self) -> int:
        """Every batch up to here that this tracker was offered is in its store (what the spool may forget)."""
        first = self._first(stored=True)
        return self._offered if first is None else first - 1

    @property
    def handed(self) -> int:
        """Every batch up to here was handed to the tracker (its store may hold less: ``stored``)."""
        first = self._first(stored=False)
        return self._offered if first is None else first - 1

    def settled(self, through_seq: int) -> bool:
        return self.dead or all(stream.settled(through_seq) for stream in self.streams)

    @property
    def dropped_records(self) -> int:
        """Records its streams dropped (their bounds, a full disk), both streams."""
        return sum(stream.report.dropped_records for stream in self.streams)

    @property
    def unstored_bytes(self) -> int:
        return sum(stream.window.nbytes for stream in self.streams)

    def down(self) -> tuple[float, str]:
        """How long and why its tracker has been out of reach (stream.py ``Stream.down``), the longer of its streams'."""
        return max((stream.down() for stream in self.streams), key=lambda down: down[0])

    def info(self) -> LaneInfo:
        return dataclasses.replace(self.small.info(), unstored_bytes=self.unstored_bytes)

    def lag_s(self) -> float:
        """Age of the oldest small record its tracker lacks."""
        return self.small.window.lag_s()

    def bulk_lag_s(self) -> float:
        return self.bulk.window.lag_s()

    def snapshot(self) -> LaneReport:
        report = self.small.snapshot()
        report.stored_seq = self.stored
        bulk = self.bulk.snapshot()
        report.unstored_batches += bulk.unstored_batches
        report.unstored_records += bulk.unstored_records
        report.dropped_records += bulk.dropped_records
        report.retries += bulk.retries
        report.restarts = max(report.restarts, bulk.restarts)
        report.outage_s = max(report.outage_s, bulk.outage_s)
        report.outage_total_s = max(report.outage_total_s, bulk.outage_total_s)
        if bulk.down_s > report.down_s:
            report.down_s, report.down = bulk.down_s, bulk.down
        report.gave_up = report.gave_up or bulk.gave_up
        report.bulk_lag_s, report.bulk_lag_p50_s, report.bulk_lag_p99_s = bulk.lag_s, bulk.lag_p50_s, bulk.lag_p99_s
        if report.error is None and bulk.error is not None:
            report.error = bulk.error
        if bulk.last_error_at > report.last_error_at:
            report.last_error, report.last_error_at = bulk.last_error, bulk.last_error_at
        return report


def _newest(maps: Iterable[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for figures in maps:
        for key, value in figures.items():
            merged[key] = max(value, merged.get(key, 0))
    return merged
