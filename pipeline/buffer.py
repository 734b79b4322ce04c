"""The producer's buffer: where ``log()`` leaves records for the shipper thread.

Bounded by (estimated) bytes. The caller's side is an append under a lock; when the
bound is hit the overflow policy applies: ``drop_oldest`` evicts the oldest records at
once, ``block`` waits up to a deadline for the shipper to make room and then evicts.
Every eviction is counted.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any


class RecordBuffer:
    """A byte-bounded FIFO shared by one producer thread (or several) and the shipper."""

    def __init__(self, max_bytes: int, batch_bytes: int, policy: str, block_timeout_s: float) -> None:
        self._items: deque[tuple[Any, int]] = deque()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._batch_bytes = batch_bytes
        self._block = policy == "block"
        self._block_timeout_s = block_timeout_s
        self._lock = threading.Lock()
        self.ready = threading.Condition(self._lock)
        """Notified when a full batch is waiting (and by flush/stop requests)."""
        self._room = threading.Condition(self._lock)
        self.dropped = 0
        self.first_time = 0.0
        """monotonic time at which the oldest waiting record arrived (0 when empty)."""

    def put(self, record: Any, size: int) -> None:
        """Append; never raises. Runs on the caller's thread, so it does no more than it must."""
        with self._lock:
            if self._bytes + size > self._max_bytes:
                self._make_room(size)
            if not self._items:
                self.first_time = time.monotonic()
            self._items.append((record, size))
            before = self._bytes
            self._bytes = before + size
            if before < self._batch_bytes <= self._bytes:
                self.ready.notify()

    def _make_room(self, size: int) -> None:
        if self._block:
            deadline = time.monotonic() + self._block_timeout_s
            while self._bytes + size > self._max_bytes and self._items:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.ready.notify()
                self._room.wait(left)
        while self._bytes + size > self._max_bytes and self._items:
            _, old = self._items.popleft()
            self._bytes -= old
            self.dropped += 1

    def take(self, max_bytes: int) -> list[Any]:
        """Remove and return the oldest records, up to ``max_bytes`` (at least one). Caller holds no lock."""
        with self._lock:
            out: list[Any] = []
            taken = 0
            while self._items and (not out or taken + self._items[0][1] <= max_bytes):
                record, size = self._items.popleft()
                out.append(record)
                taken += size
            self._bytes -= taken
            self.first_time = time.monotonic() if self._items else 0.0
            if out:
                self._room.notify_all()
            return out

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def due(self, flush_interval_s: float) -> float:
        """Seconds until the oldest record must be shipped (inf when empty, 0 when overdue or a batch is full)."""
        if not self._items:
            return float("inf")
        if self._bytes >= self._batch_bytes:
            return 0.0
        return max(0.0, self.first_time + flush_interval_s - time.monotonic())
