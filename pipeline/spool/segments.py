"""The durable spool: every shipped batch, on local disk, until every lane's tracker has it.

Append-only segment files ``seg-<first seq>.tls`` in one folder, written only by the shipper
thread. Each batch is one frame::

    magic "TLS2" | length u32 | crc32c u32 | seq u64 | records u32 | oldest log time f64 | stream u8
                 | audience length u16 | audience | payload

``payload`` is the batch exactly as shipped (msgpack + zstd); ``stream`` says which of a lane's two streams it
travels in (0 small records, 1 bulk: stream.py); ``audience`` the lanes it is for, their names joined by newlines
(empty: every lane), so a lane skips a batch it has nothing in without reading it. The CRC32C covers everything
after itself. Frames of the first format (``TLS1``: no stream, no audience) are still read.
A SIGKILL needs no fsync (written bytes stay in the page cache); ``fsync_s`` bounds what a
power loss can take. Opening a spool repairs it: a torn last frame is cut off, a corrupt frame is
skipped (the scan resynchronises on the next magic) and counted, an unreadable segment is renamed
``.bad`` and counted, so recovery never crash-loops. A segment goes once every lane's tracker stored all
of it (after ``retention_s``); when the folder would pass ``max_bytes``, the oldest segment is
evicted even if not stored, and the caller is told which batches went. A write the disk refuses
(full, read-only, failing) raises OSError and leaves the spool as its index says (a partial frame is
cut off); ``intact``/``restore`` notice and mend a folder removed under the writer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from tracklane.core.errors import ConfigError
from tracklane.core.files import same_file

log = logging.getLogger("tracklane")

MAGIC = b"TLS2"
MAGIC_V1 = b"TLS1"
_HEADER = struct.Struct("<4sIIQIdBH")  # magic, length, crc, seq, records, oldest log time, stream, audience length
_CHECKED = struct.Struct("<QIdBH")  # the header fields the checksum covers
_HEADER_V1 = struct.Struct("<4sIIQId")
_SEGMENT = re.compile(r"seg-(\d{16})\.tls")
MAX_FRAME_BYTES = 2**31  # a length past this is corruption, not a batch
_LOCK = "LOCK"


@dataclass(slots=True, frozen=True)
class SpoolEntry:
    """Where one spooled batch lies, and what the lanes need to know of it without reading it."""

    seq: int
    records: int
    oldest_log_time: float
    nbytes: int  # payload bytes
    segment: int  # first seq of its segment (the segment's name)
    offset: int  # of the frame in the segment
    bulk: bool = False
    """It travels in the lanes' bulk stream (rollouts, tables, media)."""
    audience: frozenset[str] | None = None
    """The lanes it holds records for (None: every lane)."""


@dataclass(slots=True)
class SpoolStats:
    """What the spool did, and what it found damaged; cumulative since it was opened."""

    evicted_batches: int = 0
    """Batches deleted to stay within ``max_bytes`` (the shipper counts those a lane still needed)."""
    evicted_records: int = 0
    corrupt_frames: int = 0
    """Frames whose checksum, header or length was wrong: skipped."""
    torn_bytes: int = 0
    """Bytes cut off the end of the last segment (a write the crash interrupted)."""
    quarantined_segments: int = 0
    """Segments that could not be read at all, renamed ``*.bad``."""
    missing_batches: int = 0
    """Sequence numbers absent between the first and the last spooled batch (corrupt or deleted)."""

    @property
    def damaged(self) -> int:
        return self.corrupt_frames + self.quarantined_segments + self.missing_batches


@dataclass(slots=True)
class _Segment:
    first: int
    path: str
    size: int = 0
    last: int = 0  # seq of its last frame (0 while empty)
    entries: list[SpoolEntry] = field(default_factory=list)

    def add(self, entry: SpoolEntry) -> None:
        self.entries.append(entry)
        self.last = entry.seq


def frame_header(seq: int, records: int, oldest_log_time: float, payload: bytes, bulk: bool = False,
                 audience: frozenset[str] | None = None) -> bytes:
    """One frame's header and audience for ``payload`` (the payload follows them on disk)."""
    names = "\n".join(sorted(audience)).encode() if audience else b""
    checked = _CHECKED.pack(seq, records, oldest_log_time, int(bulk), len(names)) + names
    crc = crc32c.crc32c(payload, crc32c.crc32c(checked))
    return _HEADER.pack(MAGIC, len(payload), crc, seq, records, oldest_log_time, int(bulk), len(names)) + names


class Spool:
    """A spool folder opened by one writer (an exclusive lock), or read-only by anyone."""

    def __init__(self, directory: str, *, max_bytes: int = 2**30, segment_bytes: int = 8 * 2**20,
                 fsync_s: float = 1.0, retention_s: float = 0.0, readonly: bool = False) -> None:
        self.directory = os.path.abspath(directory)
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._fsync_s = fsync_s
        self._retention_s = retention_s
        self._readonly = readonly
        self.stats = SpoolStats()
        self._segments: list[_Segment] = []
        self._index: dict[int, SpoolEntry] = {}
        self.last_seq = 0  # the highest seq ever indexed (kept when its segment is deleted)
        self.nbytes = 0  # sum of the segments' sizes
        self._fd: int | None = None  # the active segment, opened for appending
        self._last_fsync = time.monotonic()
        self._dirty = False
        self._lock_fd: int | None = None
        # called before a segment is deleted: what must be on disk before its batches are gone (logged_steps.py)
        self.before_forget: Callable[[], None] | None = None
        if not readonly:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            self._lock()
        self._scan()

    # -- opening ---------------------------------------------------------------------------
    def _lock(self) -> None:
        fd = os.open(os.path.join(self.directory, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"spool {self.directory} is in use by another process (another run with this run id?)") from None
        self._lock_fd = fd  # the lock goes with the process, SIGKILL included

    def _scan(self) -> None:
        self._segments = _scan_folder(self.directory, self._readonly, self.stats, self._index)
        self.nbytes = sum(segment.size for segment in self._segments)
        self.last_seq = max(self._index, default=0)

    def _add(self, segment: _Segment, entry: SpoolEntry) -> None:
        segment.add(entry)
        self._index[entry.seq] = entry
        self.last_seq = max(self.last_seq, entry.seq)

    # -- what it holds -------------------------------------------------------------------
    def entries(self) -> list[SpoolEntry]:
        """Every spooled batch, in sequence order."""
        return [entry for segment in self._segments for entry in segment.entries]

    @property
    def batches(self) -> int:
        """How many batches it holds."""
        return len(self._index)

    def read(self, seq: int) -> bytes | None:
        """The payload of batch ``seq``, or None if it is gone or damaged."""
        entry = self._index.get(seq)
        if entry is None:
            return None
        try:
            with open(self._path(entry.segment), "rb") as handle:
                handle.seek(entry.offset)
                data = handle.read(_HEADER.size + 2**16 + entry.nbytes)
        except OSError:
            data = b""
        found = _frame_at(data, 0, entry.segment)
        if found is None:
            return None
        end = _frame_end(data, found)
        return data[end - found.nbytes:end]

    # -- writing -------------------------------------------------------------------------
    def append(self, seq: int, records: int, oldest_log_time: float, payload: bytes, bulk: bool = False,
               audience: frozenset[str] | None = None) -> list[SpoolEntry]:
        """Write one batch (``bulk``, ``audience``: SpoolEntry's); returns the batches evicted to stay within
        ``max_bytes`` (usually none)."""
        if self._readonly:
            raise RuntimeError("a read-only spool cannot be appended to")
        if seq <= self.last_seq:
            raise ValueError(f"spool sequence numbers must grow: {seq} after {self.last_seq}")
        if self._fd is None or self._segments[-1].size >= self._segment_bytes:
            self._roll(seq)
        segment = self._segments[-1]
        header = frame_header(seq, records, oldest_log_time, payload, bulk, audience)
        try:
            _write_all(self._fd, header, payload)
        except OSError:  # a full or failing disk: the spool stays as the index says, the caller decides
            self._cut_back(segment)
            raise
        entry = SpoolEntry(seq=seq, records=records, oldest_log_time=oldest_log_time, nbytes=len(payload),
                           segment=segment.first, offset=segment.size, bulk=bulk, audience=audience or None)
        segment.size += len(header) + len(payload)
        self.nbytes += len(header) + len(payload)
        self._add(segment, entry)
        self._dirty = True
        self.sync_if_due()
        return self._evict()

    def _roll(self, seq: int) -> None:
        if self._fd is not None:
            try:
                self.sync(force=True)
            finally:
                self._drop_fd()
        path = self._path(seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        self._segments.append(_Segment(first=seq, path=path))
        _sync_dir(self.directory)  # the new name survives a power loss too

    def _evict(self) -> list[SpoolEntry]:
        evicted: list[SpoolEntry] = []
        while self.nbytes > self._max_bytes and len(self._segments) > 1:
            segment = self._segments.pop(0)
            self._delete(segment)
            evicted += segment.entries
        self.stats.evicted_batches += len(evicted)
        self.stats.evicted_records += sum(e.records for e in evicted)
        return evicted  # the shipper counts and warns about those a lane still needed

    def release(self, through_seq: int) -> int:
        """Every lane holds batches up to ``through_seq``: delete segments wholly before it (after the
        retention time). The segment being written stays while the spool is open. Returns the segments deleted."""
        if self._readonly:
            return 0
        now = time.time()
        deleted = 0
        keep = 1 if self._fd is not None else 0
        while len(self._segments) > keep and self._segments[0].last <= through_seq:
            segment = self._segments[0]
            if self._retention_s > 0 and now - _mtime(segment.path) < self._retention_s:
                break
            self._segments.pop(0)
            self._delete(segment)
            deleted += 1
        return deleted

    def _delete(self, segment: _Segment) -> None:
        if self.before_forget is not None:
            self.before_forget()
        self.nbytes -= segment.size
        for entry in segment.entries:
            self._index.pop(entry.seq, None)
        # gone already, or a read-only disk keeps it: a resume skips what every lane's tracker stored
        with contextlib.suppress(OSError):
            os.remove(segment.path)

    def sync_if_due(self) -> None:
        if self._dirty and time.monotonic() - self._last_fsync >= self._fsync_s:
            self.sync(force=True)

    def sync(self, force: bool = False) -> None:
        """fsync the active segment (for power loss; a process crash needs none)."""
        if self._fd is not None and (self._dirty or force):
            os.fdatasync(self._fd)
        self._dirty = False
        self._last_fsync = time.monotonic()

    def close(self) -> None:
        try:
            if self._fd is not None:
                self.sync(force=True)
        finally:  # a failing disk still gives its descriptors back
            self._drop_fd()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # -- disk faults (the caller keeps the batches in memory meanwhile: spool_keeper.py) --------
    def _cut_back(self, segment: _Segment) -> None:
        """Cut what a failed write left of its frame; failing that, the next append starts a new segment."""
        try:
            if self._fd is not None:
                os.ftruncate(self._fd, segment.size)
        except OSError:
            self._drop_fd()

    def _drop_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # a failing disk may report a lost write here too; it is closed anyway
                os.close(self._fd)
            self._fd = None

    def intact(self) -> bool:
        """False once the folder, its lock or the segment being written was removed (or another disk was mounted
        over them): writes would go nowhere."""
        return (self._fd is None or same_file(self._fd, self._segments[-1].path)) \
            and (self._lock_fd is None or same_file(self._lock_fd, os.path.join(self.directory, _LOCK)))

    def restore(self) -> list[SpoolEntry]:
        """After (part of) the folder was removed: make it again and take its lock again; the segments that are
        gone are forgotten, and their batches returned (lost from disk, like evicted ones)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        if self._fd is not None and not same_file(self._fd, self._segments[-1].path):
            self._drop_fd()
        if self._lock_fd is None or not same_file(self._lock_fd, os.path.join(self.directory, _LOCK)):
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            try:
                self._lock()
            except ConfigError as exc:  # another process took the new folder: no disk for us
                raise OSError(errno.EBUSY, str(exc)) from exc
        gone = [segment for segment in self._segments if not os.path.exists(segment.path)]
        for segment in gone:
            self._segments.remove(segment)
            self._delete(segment)
        return [entry for segment in gone for entry in segment.entries]

    def _path(self, first: int) -> str:
        return os.path.join(self.directory, f"seg-{first:016d}.tls")


# -- opening: reading the folder back, repairing what a crash or a failing disk left --------------------------
def _scan_folder(directory: str, readonly: bool, stats: SpoolStats, index: dict[int, SpoolEntry]) -> list[_Segment]:
    """Index every good frame of the segments in ``directory`` into ``index``; returns the segments kept. A torn
    last frame is cut off (unless ``readonly``), corrupt frames are skipped and unreadable segments set aside,
    all counted in ``stats``."""
    names = sorted(n for n in os.listdir(directory) if _SEGMENT.fullmatch(n)) \
        if os.path.isdir(directory) else []
    segments: list[_Segment] = []
    for i, name in enumerate(names):
        path = os.path.join(directory, name)
        segment = _Segment(first=int(name[4:20]), path=path)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            _quarantine(path, exc, readonly, stats)
            continue
        segment.size = _parse(segment, data, index, stats)
        tail = len(data) - segment.size
        if tail and i == len(names) - 1:  # the writer died inside its last write
            stats.torn_bytes += tail
            if not readonly:
                os.truncate(path, segment.size)
        elif tail:
            segment.size = len(data)
            stats.corrupt_frames += 1
        if not segment.entries and not readonly:  # nothing usable: its name must not block a new one
            os.remove(path)
            continue
        segments.append(segment)
    seqs = sorted(index)
    if seqs:
        stats.missing_batches = seqs[-1] - seqs[0] + 1 - len(seqs)
    if stats.damaged or stats.torn_bytes:
        log.warning("tracklane: spool %s was damaged: %d corrupt frame(s), %d unreadable segment(s), "
                    "%d batch(es) missing, %d torn byte(s) cut; the rest is intact",
                    directory, stats.corrupt_frames, stats.quarantined_segments, stats.missing_batches,
                    stats.torn_bytes)
    return segments


def _parse(segment: _Segment, data: bytes, index: dict[int, SpoolEntry], stats: SpoolStats) -> int:
    """Index every good frame of ``data``; returns the end of the last good frame."""
    pos, good_end, bad_run = 0, 0, False
    while pos + _HEADER_V1.size <= len(data):
        entry = _frame_at(data, pos, segment.first)
        if entry is None:
            bad_run = True
            found = min((at for at in (data.find(MAGIC, pos + 1), data.find(MAGIC_V1, pos + 1)) if at >= 0),
                        default=-1)
            if found < 0:
                break
            pos = found
            continue
        if bad_run:  # a damaged stretch before a good frame counts once; one at the end is the caller's tail
            stats.corrupt_frames += 1
            bad_run = False
        if entry.seq in index or entry.seq <= segment.last:  # a duplicate or out-of-order frame
            stats.corrupt_frames += 1
        else:
            segment.add(entry)
            index[entry.seq] = entry
        pos = good_end = _frame_end(data, entry)
    return good_end


def _quarantine(path: str, exc: OSError, readonly: bool, stats: SpoolStats) -> None:
    stats.quarantined_segments += 1
    log.warning("tracklane: spool segment %s cannot be read (%s); set aside", path, exc)
    if not readonly:
        with contextlib.suppress(OSError):
            os.replace(path, path + ".bad")


def _frame_at(data: bytes, pos: int, segment: int) -> SpoolEntry | None:
    """The frame (of either format: TLS1's header is TLS2's without stream and audience) starting at ``pos`` if it
    is whole and its checksum holds, else None."""
    magic = data[pos:pos + 4]
    header = _HEADER if magic == MAGIC else _HEADER_V1 if magic == MAGIC_V1 else None
    if header is None or pos + header.size > len(data):
        return None
    _, length, crc, seq, records, oldest, *more = header.unpack_from(data, pos)
    stream, names = more or (0, 0)
    start = pos + header.size + names
    end = start + length
    if length > MAX_FRAME_BYTES or stream > 1 or end > len(data):
        return None
    checked = memoryview(data)[pos + 12:start]
    if crc32c.crc32c(memoryview(data)[start:end], crc32c.crc32c(checked)) != crc:
        return None
    try:
        audience = frozenset(bytes(data[pos + header.size:start]).decode().split("\n")) if names else None
    except UnicodeDecodeError:
        return None
    return SpoolEntry(seq=seq, records=records, oldest_log_time=oldest, nbytes=length, segment=segment, offset=pos,
                      bulk=bool(stream), audience=audience)


def _frame_end(data: bytes, entry: SpoolEntry) -> int:
    """Where ``entry``'s frame (found in ``data`` at its offset) ends."""
    if data[entry.offset:entry.offset + 4] == MAGIC_V1:
        return entry.offset + _HEADER_V1.size + entry.nbytes
    names = _HEADER.unpack_from(data, entry.offset)[-1]
    return entry.offset + _HEADER.size + names + entry.nbytes


def _write_all(fd: int | None, header: bytes, payload: bytes) -> None:
    assert fd is not None
    written = os.writev(fd, [header, payload])
    total = len(header) + len(payload)
    while written < total:  # a short write (rare: signals, a full disk about to fail)
        written += os.write(fd, (header + payload)[written:])


def _sync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
