"""A lane's window: the batches its tracker has not stored yet, bounded by bytes, and its two watermarks.

No Ray here: a batch's encoded bytes are an opaque handle (a Ray object on the shipper, anything in a test), so
the window's rules are unit-tested in milliseconds (tests/unit/test_stream_window.py). ``Stream`` (stream.py) adds the
actor: its calls, liveness and backoff.

Two watermarks (pipeline/README.md's glossary):

- ``handed``: the last batch the tracker was handed. The window moves on, a flush is answered.
- ``stored``: the last batch the tracker's own store holds, what the spool may forget. It lags ``handed`` for
  wandb, whose wandb-core keeps its newest rows in memory; a batch between the two is kept (on disk when the
  spool has it, else in memory) and sent again if the actor dies.

Memory is bounded by bytes. With the spool, a batch that does not fit is kept only on disk (its entry holds no
handle) and is read back when its turn comes, so an outage costs disk, not memory. A batch the spool's disk
refused (durability off, spool_keeper.py) needs memory: batches that are on disk give theirs up first, then the
oldest batches not yet sent are dropped and counted. Without a spool (a producer whose disk failed) only the
dropping applies.

A lane that gives up on its tracker (``give_up``) sends nothing more and holds no memory, but keeps every batch its
tracker's store lacks, on disk: its ``stored`` watermark stays where it was, so the spool keeps them for
``tracklane replay`` and the next resume. Only a batch that is not on disk is lost then, counted.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tracklane.core.report import LaneReport
from tracklane.spool.segments import SpoolEntry

_LAGS_KEPT = 10_000


@dataclass(slots=True)
class Entry:
    """One encoded batch as a lane holds it."""

    seq: int
    ref: Any  # the encoded bytes (a Ray object, shared by every lane); None: only in the spool
    nbytes: int
    records: int
    oldest_log_time: float  # time.time() of the batch's first log() call
    spooled: bool = True  # on disk (False: the spool's disk refused it, or there is none); only memory holds it
    bulk: bool = False  # travels in the bulk stream (lane.py)
    audience: frozenset[str] | None = None  # the lanes it holds records for (None: all)


Reload = Callable[[int], Any]
"""seq -> a handle of that batch read back from the spool, or None if the spool lost it."""


class StreamWindow:
    """The batches of one stream its tracker has not stored, in sequence order; what may be sent next."""

    def __init__(self, max_bytes: int, report: LaneReport, reload: Reload | None = None) -> None:
        """``report``: where dropped records and lost batches are counted. ``reload``: reads a batch back from
        the spool (None: there is no spool, memory holds every batch)."""
        self._max_bytes = max_bytes
        self._report = report
        self._reload = reload
        self._unhanded: OrderedDict[int, Entry] = OrderedDict()  # offered, not handed yet
        self._unstored: OrderedDict[int, Entry] = OrderedDict()  # handed, not stored yet: sent again after a restart
        self._bytes = 0  # of the entries that hold a handle
        self.handed = 0
        """The last batch the tracker was handed."""
        self.stored = 0
        """The last batch the tracker's store holds (``stored <= handed``)."""
        self.sent = 0
        """The last batch sent to the actor since the window last started sending again."""
        self.offered = 0
        """The last batch put in the window (what a producer's lanes must reach before rank 0 finishes)."""
        self.given_up = False
        """Nothing more is sent: what waits is kept on disk for a later delivery (``give_up``)."""
        self.first_stored_at: float | None = None
        """When (time.monotonic) ``stored`` first moved in this process: the time to the first stored point."""
        self._lags: deque[float] = deque(maxlen=_LAGS_KEPT)

    # -- feeding -------------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        """Whether a batch of ``nbytes`` fits in the memory bound now (a lane that gave up holds none)."""
        return not self.given_up and self._bytes + nbytes <= self._max_bytes

    def has_room(self, nbytes: int) -> bool:
        return self._reload is not None or self.given_up or self.fits(nbytes)

    def offer(self, entry: Entry) -> None:
        if self.given_up:
            self._keep_on_disk(entry)
            return
        if self._reload is not None and entry.spooled:  # over the bound, the batch waits on disk only
            fits = entry.ref is not None and self.fits(entry.nbytes)
            self._add(dataclasses.replace(entry, ref=entry.ref if fits else None))
            return
        if self._reload is not None:
            self._spill(entry.nbytes)
        sent = sum(e.nbytes for seq, e in self._unhanded.items() if seq <= self.sent and e.ref is not None)
        if sent + entry.nbytes > self._max_bytes:  # cannot fit even alone: keep what waits
            self._report.dropped_records += entry.records
            return
        while not self.fits(entry.nbytes) and self._drop_oldest_unsent():
            pass
        self._add(entry)

    def _add(self, entry: Entry) -> None:
        self._unhanded[entry.seq] = entry
        self._bytes += entry.nbytes if entry.ref is not None else 0
        self.offered = entry.seq

    def preload(self, entries: Iterable[SpoolEntry]) -> None:
        """Batches an earlier process spooled (recovery): waiting on disk; the actor's first answer says which its
        tracker already holds."""
        for e in entries:
            self._unhanded[e.seq] = Entry(seq=e.seq, ref=None, nbytes=e.nbytes, records=e.records,
                                          oldest_log_time=e.oldest_log_time)
            self.offered = max(self.offered, e.seq)
        self._unhanded = OrderedDict(sorted(self._unhanded.items()))

    def evicted(self, seqs: set[int]) -> int:
        """The spool deleted these batches: those this window holds only there are lost. Returns how many records."""
        lost = 0
        for seq in [s for s in self._unhanded if s in seqs]:
            entry = self._unhanded[seq]
            if entry.ref is None:
                del self._unhanded[seq]
                lost += entry.records
            else:  # memory holds the only copy now: it must not be spilled
                self._unhanded[seq] = dataclasses.replace(entry, spooled=False)
        self._report.dropped_records += lost
        return lost

    def _spill(self, nbytes: int) -> None:
        """A batch the spool's disk refused needs memory: batches that are on disk give theirs up (read back in
        their turn), oldest first."""
        for seq, entry in list(self._unhanded.items()):
            if self.fits(nbytes):
                return
            if entry.ref is not None and entry.spooled:
                self._unhanded[seq] = dataclasses.replace(entry, ref=None)
                self._bytes -= entry.nbytes

    def _drop_oldest_unsent(self) -> bool:
        for seq, entry in self._unhanded.items():
            if seq > self.sent and entry.ref is not None:  # one only on disk holds no memory
                del self._unhanded[seq]
                self._bytes -= entry.nbytes
                self._report.dropped_records += entry.records
                return True
        return False

    # -- sending -------------------------------------------------------------------------
    def to_send(self) -> Iterator[Entry]:
        """The batches not sent yet, in order, each with its handle (read back from the spool if it waited there;
        one the spool lost is dropped, counted). The caller marks each it sends with ``sent_through``."""
        if self.given_up:
            return
        for seq, entry in list(self._unhanded.items()):
            if seq <= self.sent:
                continue
            if entry.ref is None and not self._load(entry):
                continue
            yield entry

    def sent_through(self, seq: int) -> None:
        self.sent = seq

    def send_again(self) -> None:
        """The actor's answers to what was sent are not coming (refused, held, failed): send from ``handed`` on."""
        self.sent = self.handed

    def _load(self, entry: Entry) -> bool:
        ref = self._reload(entry.seq) if self._reload is not None else None
        if ref is None:
            del self._unhanded[entry.seq]
            self._report.dropped_records += entry.records
            self._report.note_error(f"batch {entry.seq} is no longer in the spool ({entry.records} records lost)")
            return False
        entry.ref = ref
        self._bytes += entry.nbytes
        return True

    # -- answers -------------------------------------------------------------------------
    def take(self, handed: int, stored: int) -> None:
        """The actor's answer: batches through ``handed`` were handed to the tracker, through ``stored`` are in its
        store (``stored <= handed``)."""
        now = time.time()
        while self._unhanded:
            seq, entry = next(iter(self._unhanded.items()))
            if seq > handed:
                break
            del self._unhanded[seq]
            self._bytes -= entry.nbytes if entry.ref is not None else 0
            self._lags.append(now - entry.oldest_log_time)
            if seq > stored:  # sent again if the actor dies: from the spool, or from memory if it is not on disk
                keep = self._reload is None or not entry.spooled
                self._unstored[seq] = entry if keep else dataclasses.replace(entry, ref=None)
        self.handed = max(self.handed, handed)
        if stored > self.stored and self.first_stored_at is None:
            self.first_stored_at = time.monotonic()
        self.stored = max(self.stored, stored)
        while self._unstored and next(iter(self._unstored)) <= self.stored:
            self._unstored.popitem(last=False)
        self.sent = max(self.sent, self.handed)

    def actor_restarted(self) -> None:
        """Its successor starts from what the store holds: what was handed but not stored goes again (the actor
        skips what its store holds), from memory or from the spool."""
        if self._unstored:
            self._bytes += sum(e.nbytes for e in self._unstored.values() if e.ref is not None)
            self._unhanded = OrderedDict(sorted({**self._unstored, **self._unhanded}.items()))
        self._unstored.clear()
        self.handed = self.stored
        self.send_again()

    def give_up(self) -> int:
        """The lane gave up on its tracker: nothing more is sent, and no memory is held. Every batch its store lacks
        (the dead actor's tracker may not have stored what it was handed) stays on disk for ``tracklane replay``
        and the next resume; one that is only in memory is dropped. Returns the records dropped (counted)."""
        self.given_up = True
        waiting = sorted({**self._unstored, **self._unhanded}.items())
        self._unhanded, self._unstored, self._bytes = OrderedDict(), OrderedDict(), 0
        self.handed = self.sent = self.stored
        before = self._report.dropped_records
        for _, entry in waiting:
            self._keep_on_disk(entry)
        return self._report.dropped_records - before

    def _keep_on_disk(self, entry: Entry) -> None:
        """A lane that gave up keeps a batch only where it is on disk (the spool); one only in memory is lost."""
        self.offered = max(self.offered, entry.seq)
        if self._reload is not None and entry.spooled:
            self._unhanded[entry.seq] = dataclasses.replace(entry, ref=None)
        else:
            self._report.dropped_records += entry.records

    # -- figures -------------------------------------------------------------------------
    def first_pending(self, stored: bool = True) -> int | None:
        """The oldest batch its tracker's store lacks (``stored``), or was not handed; None if there is none."""
        seqs = [next(iter(self._unhanded), None)] + ([next(iter(self._unstored), None)] if stored else [])
        return min((seq for seq in seqs if seq is not None), default=None)

    def settled(self, through_seq: int) -> bool:
        """True once nothing up to ``through_seq`` waits to be handed (a lane that gave up hands nothing more)."""
        return self.given_up or not any(seq <= through_seq for seq in self._unhanded)

    @property
    def nbytes(self) -> int:
        """Bytes of the batches that hold a handle (the memory bound's measure)."""
        return self._bytes

    def batches(self) -> int:
        return len(self._unhanded) + len(self._unstored)

    def records(self) -> int:
        return sum(e.records for e in self._unhanded.values()) + sum(e.records for e in self._unstored.values())

    def in_memory(self) -> list[int]:
        """The batches waiting to be handed whose bytes are in memory, in order."""
        return [seq for seq, e in self._unhanded.items() if e.ref is not None]

    def entry(self, seq: int) -> Entry:
        return self._unhanded[seq]

    def lag_s(self) -> float:
        """Age of the oldest record not handed yet (0: none)."""
        if not self._unhanded:
            return 0.0
        return time.time() - next(iter(self._unhanded.values())).oldest_log_time

    def lag_percentiles(self) -> tuple[float, float]:
        """p50 and p99 of how long the latest batches waited from log() to being handed."""
        lags = sorted(self._lags)
        if not lags:
            return 0.0, 0.0
        return lags[len(lags) // 2], lags[min(len(lags) - 1, int(len(lags) * 0.99))]
