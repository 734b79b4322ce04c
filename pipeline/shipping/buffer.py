"""The producer's buffer: where ``log()`` leaves records for the shipper thread.

One queue, in the order of the calls: the shipper keeps that order for every tracker's small stream, and sends
only a dump's big pieces (and artifacts) to the bulk stream, a chunk at a time (shipper.py, lane.py).

The caller's side is one deque append and a counter update, no lock: a lock, a condition or any extra Python on
that path costs microseconds on this kind of machine. The bound is on estimated bytes. Only when it (or a full
batch) is reached does the caller take the slow path: wake the shipper, and apply the overflow policy:

- ``spill`` (the default): nothing is dropped and the caller never waits. The shipper is woken and spools what
  waits at disk speed; what the lanes cannot hold in memory waits on disk (stream.py). While the spool's disk is
  off (full, failing: ``disk_ok`` False) or there is no spool, it drops like ``drop_oldest``.
- ``drop_oldest``: evicts the oldest records at once.
- ``block``: waits up to a deadline for the shipper to make room, then evicts.

Eviction takes bulk records (``put_bulk``: rollouts, generations, images, artifacts) first, oldest first; a small
record is evicted only to make room for a small one, never for bulk. Every eviction is counted.

Items are tuples laid out as ``Captured`` (captured.py): their ``size`` is an estimate of their bytes and their
``time`` the ``time.time()`` of the call, read by index (``SIZE``, ``TIME``). The byte counters assume one producer
thread (rank 0's trainer); more threads are safe, only the byte bound becomes approximate.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tracklane.capture.captured import KIND, OTHER_AXES, SIZE, STEP, TIME, Captured
from tracklane.core.records import BULK_KINDS


class RecordBuffer:
    def __init__(self, max_bytes: int, batch_bytes: int, policy: str, block_timeout_s: float) -> None:
        self._items: deque[Captured] = deque()
        self._bulk = 0  # bulk items among them (put_bulk), so eviction looks for them only when there are some
        self._produced = 0  # bytes appended, written by the producer only
        self._evicted = 0  # bytes dropped by the producer (under the lock)
        self._consumed = 0  # bytes taken by the shipper (under the lock)
        self._max_bytes = max_bytes
        self._batch_bytes = batch_bytes
        self._policy = policy
        self._block_timeout_s = block_timeout_s
        self._woken = False  # the shipper was told a batch is full and has not taken it yet
        self._slow_at = batch_bytes  # _produced value at which put() must take the slow path
        self._lock = threading.Lock()
        self.ready = threading.Condition(self._lock)
        """Notified when a full batch waits, and by flush/close requests."""
        self._room = threading.Condition(self._lock)
        self.dropped = 0
        """Records evicted (small and bulk)."""
        self.dropped_bulk = 0
        """Of them, bulk records."""
        self.disk_ok = False
        """The spool takes batches now (set by the shipper): ``spill`` may let the buffer pass its bound."""
        self._last_taken_step: Any = None

    def put(self, item: Captured) -> None:
        """Append one item; never raises. The caller's hot path: keep it this short."""
        self._items.append(item)
        self._produced = produced = self._produced + item[SIZE]
        if produced >= self._slow_at:
            self._slow_path(bulk=False)

    def put_bulk(self, item: Captured) -> None:
        """Append one item of a bulk kind (``BULK_KINDS``); never raises."""
        self._items.append(item)
        self._bulk += 1
        self._produced = produced = self._produced + item[SIZE]
        if produced >= self._slow_at:
            self._slow_path(bulk=True)

    def _slow_path(self, bulk: bool) -> None:
        with self._lock:
            if self.nbytes > self._max_bytes:
                self._make_room(bulk)
            if not self._woken:
                self._woken = True
                self.ready.notify()
            self._rearm()

    def _rearm(self) -> None:
        """Next _produced value that needs the slow path: a full batch, or the bound (held: the lock)."""
        base = self._consumed + self._evicted
        self._slow_at = base + (self._max_bytes + 1 if self._woken else self._batch_bytes)

    def _make_room(self, bulk: bool) -> None:
        if self._policy == "spill" and self.disk_ok:
            return  # the shipper spools it all; the lanes keep on disk what they cannot hold
        if self._policy == "block":
            deadline = time.monotonic() + self._block_timeout_s
            while self.nbytes > self._max_bytes and (left := deadline - time.monotonic()) > 0:
                self.ready.notify()
                self._room.wait(left)
        # Bulk first, oldest first (keeping the item just put); small records only to make room for a small one.
        while self.nbytes > self._max_bytes and self._bulk > (1 if bulk else 0):
            self._evict(lambda item: item[KIND] in BULK_KINDS)
            self._bulk -= 1
            self.dropped_bulk += 1
        while not bulk and self.nbytes > self._max_bytes and len(self._items) - self._bulk > 1:
            self._evict(lambda item: item[KIND] not in BULK_KINDS)

    def _evict(self, which: Callable[[Captured], bool]) -> None:
        """Drop the oldest item ``which`` accepts (one is there)."""
        index = next(i for i, item in enumerate(self._items) if which(item))
        item = self._items[index]
        del self._items[index]
        self._evicted += item[SIZE]
        self.dropped += 1

    def take(self, max_bytes: int) -> list[Captured]:
        """Remove and return the oldest items, up to ``max_bytes`` (at least one)."""
        with self._lock:
            out: list[Captured] = []
            taken = 0
            while self._items and (not out or taken + self._items[0][SIZE] <= max_bytes):
                item = self._items.popleft()
                out.append(item)
                taken += item[SIZE]
            self._bulk -= sum(1 for item in out if item[KIND] in BULK_KINDS)
            self._consumed += taken
            step = _trainer_step(out)
            if step is not None:
                self._last_taken_step = step
            self._woken = False
            self._rearm()
            if out:
                self._room.notify_all()
            return out

    def last_step(self) -> Any:
        """The trainer's step of the newest item put (as the caller passed it; None before the first)."""
        with self._lock:  # not the hot path: the crash record asks once
            step = _trainer_step(self._items)
            return self._last_taken_step if step is None else step

    @property
    def nbytes(self) -> int:
        return self._produced - self._consumed - self._evicted

    def __len__(self) -> int:
        return len(self._items)

    def due(self, flush_interval_s: float) -> float:
        """Seconds until the oldest item must be shipped (inf when empty, 0 when overdue or a batch is full)."""
        try:
            oldest = self._items[0][TIME]
        except IndexError:
            return float("inf")
        if self.nbytes >= self._batch_bytes:
            return 0.0
        return max(0.0, oldest + flush_interval_s - time.time())


def _trainer_step(items: Any) -> Any:
    """The step of the newest item on the trainer's axis (system metrics and other axes count seconds or
    a producer's own steps), None if there is none."""
    for item in reversed(items):
        if item[KIND] not in OTHER_AXES:
            return item[STEP]
    return None
