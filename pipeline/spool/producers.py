"""A producer's own spool: ``<run spool>/producers/<sender id>/``, so what it shipped outlives its process.

A producer (``Tracking.producer`` in a Ray actor) spools each batch before its lanes see it, in the same
segment format as rank 0 (segments.py), and holds the folder's lock while it lives. A folder whose lock is
free and still holds batches belongs to a producer that died: rank 0 takes it over and delivers what the
lanes lack (shipping/orphans.py). Beside the segments:

- ``producer.msgpack``: its name and sender id, written once it holds the lock (a folder without it
  was never appended to);
- ``tally``: little-endian u64s in a shared memory map, updated as it goes, so the counts of a
  SIGKILLed producer are exact (the page cache keeps them): log() calls taken, records its buffer
  dropped, then the batch being spooled and how many calls were settled before it and with it.
  Calls after the last spooled batch were never shipped: they are the counted tail. Then a ring of
  the last ``RING`` batches its disk refused (seq, records): shipped, but only in Ray; a lane that had
  not taken one when the producer died lost it, and rank 0 counts it. The file's blocks are allocated
  when it is made, so writing the map never meets a full disk (that would be SIGBUS).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

import msgpack

from tracklane.core.files import write_atomically

PRODUCERS = "producers"
MARK = "producer.msgpack"
TALLY = "tally"
_TALLY = struct.Struct("<5Q")  # puts, dropped, seq, settled before seq, settled through seq
_PUTS = struct.Struct("<Q")
_PAIR = struct.Struct("<2Q")
RING = 256
_RING_AT = _TALLY.size + _PUTS.size  # after the header and the count of unspooled batches
_SIZE = _RING_AT + RING * _PAIR.size


def producers_dir(spool_dir: str) -> str:
    return os.path.join(spool_dir, PRODUCERS)


def write_mark(folder: str, name: str, sender: str) -> None:
    write_atomically(os.path.join(folder, MARK),
                     msgpack.packb({"name": name, "sender": sender, "created": time.time()}, use_bin_type=True))


def read_mark(folder: str) -> dict[str, str] | None:
    """The producer's name and sender id; None if it never wrote them (or they cannot be read)."""
    try:
        with open(os.path.join(folder, MARK), "rb") as handle:
            data = msgpack.unpackb(handle.read(), raw=False)
        return {"name": str(data["name"]), "sender": str(data.get("sender", data.get("source")))}  # "source": before 0.1
    except (OSError, ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException):
        return None


@dataclass(slots=True, frozen=True)
class TallyView:
    """A producer's counts as its tally file last held them."""

    puts: int = 0
    dropped: int = 0
    seq: int = 0
    settled_before: int = 0
    settled_through: int = 0
    unspooled: tuple[tuple[int, int], ...] = ()
    """(seq, records) of the last ``RING`` batches its disk refused."""

    def unshipped(self, last_spooled: int) -> int:
        """Calls neither in a spooled batch nor dropped (counted) nor refused: lost with the process.
        ``last_spooled``: the last batch the folder holds or held; the batch being spooled at the kill
        counts as shipped only if it reached the disk."""
        settled = self.settled_through if last_spooled >= self.seq else self.settled_before
        return max(0, self.puts - settled - self.dropped)


class Tally:
    """The writer's side: one map, the caller's thread writes ``puts``, the shipper thread the rest."""

    def __init__(self, folder: str) -> None:
        path = os.path.join(folder, TALLY)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, _SIZE)  # OSError now (no tally) rather than SIGBUS later
            self._map: mmap.mmap | None = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._puts = 0
        self._unspooled = 0

    def put(self) -> None:
        """One more log() call taken (the caller's thread; ~0.2 us)."""
        self._puts += 1
        if self._map is not None:
            _PUTS.pack_into(self._map, 0, self._puts)

    def spooling(self, seq: int, before: int, through: int, dropped: int) -> None:
        """Batch ``seq`` holding the calls settled up to ``through`` is about to be spooled."""
        if self._map is not None:
            struct.pack_into("<4Q", self._map, 8, dropped, seq, before, through)

    def unspooled(self, seq: int, records: int) -> None:
        """Batch ``seq`` of ``records`` was shipped but the disk refused it."""
        if self._map is not None:
            _PAIR.pack_into(self._map, _RING_AT + (self._unspooled % RING) * _PAIR.size, seq, records)
            self._unspooled += 1
            _PUTS.pack_into(self._map, _TALLY.size, self._unspooled)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def read_tally(folder: str) -> TallyView:
    try:
        with open(os.path.join(folder, TALLY), "rb") as handle:
            data = handle.read(_SIZE)
        if len(data) < _SIZE:
            return TallyView()
        count = _PUTS.unpack_from(data, _TALLY.size)[0]
        pairs = tuple(_PAIR.unpack_from(data, _RING_AT + i * _PAIR.size) for i in range(min(count, RING)))
        puts, dropped, seq, before, through = _TALLY.unpack_from(data)
        return TallyView(puts, dropped, seq, before, through, unspooled=pairs)
    except OSError:
        return TallyView()
