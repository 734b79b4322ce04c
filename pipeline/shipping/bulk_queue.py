"""Big parts of calls already taken (a rollout dump, an artifact), shipped a batch a round.

A dump of hundreds of MB is never converted, encoded or held whole: its records are made lazily, a batch of about
``max_batch_bytes`` at a time, so what is logged meanwhile never waits behind it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

from tracklane.core.records import Record

BULK_BYTES = 2**20
"""A group of samples this big (a rollout dump, to the trackers that keep all of it) goes in the bulk stream, a chunk
at a time; smaller ones (the dashboards' samples) go with the step's other records, in the order of the calls.
Measured: a 256-row table took wandb's lane ~50 ms, a 64 MB dump the file lane ~1 s."""


@dataclass(slots=True)
class _BulkItem:
    records: Iterator[Record]
    next: Record | None = None  # made, not shipped yet (it did not fit in the last batch)


class BulkQueue:
    """The bulk items being shipped, oldest first."""

    def __init__(self) -> None:
        self._items: deque[_BulkItem] = deque()

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, parts: Iterable[Iterable[Record]]) -> None:
        self._items.append(_BulkItem(records=chain.from_iterable(parts)))

    def next_batch(self, max_bytes: int) -> tuple[list[Record], bool]:
        """One batch of the oldest item (about ``max_bytes``), and whether it was the item's last (the item is
        gone then)."""
        bulk = self._items[0]
        records: list[Record] = []
        nbytes = 0
        while nbytes < max_bytes:
            record = bulk.next if bulk.next is not None else next(bulk.records, None)
            bulk.next = None
            if record is None:
                break
            size = record_bytes(record)
            if records and nbytes + size > max_bytes:
                bulk.next = record  # the next batch's
                break
            records.append(record)
            nbytes += size
        if bulk.next is None:  # is this the item's last batch?
            bulk.next = next(bulk.records, None)
        done = bulk.next is None
        if done:
            self._items.popleft()
        return records, done


def record_bytes(record: Record) -> int:
    """About how many bytes a bulk record encodes to (its chunk's size), to fill a batch."""
    rows = getattr(record, "trajectories", None)
    if rows is not None:
        lines = getattr(rows, "lines", None)
        return len(lines) if lines is not None else 4096 * len(rows)
    samples = getattr(record, "samples", None)
    if samples is not None:
        return sum(len(row[0]) + len(row[1]) + 32 for row in samples)
    return len(getattr(record, "png", b"")) + 256
