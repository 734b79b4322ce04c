"""The durable spool: frames survive a reopen, damage is cut out and counted, and a model-checked state machine."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tracklane.core.errors import ConfigError
from tracklane.spool.segments import Spool

FUZZ = int(os.environ.get("TRACKLANE_FUZZ_EXAMPLES", "0"))


def _crash(spool: Spool) -> None:
    """What a SIGKILL leaves: descriptors closed by the kernel, nothing synced or tidied."""
    for fd in (spool._fd, spool._lock_fd):
        if fd is not None:
            os.close(fd)
    spool._fd = spool._lock_fd = None


def _payload(seq: int, n: int = 100) -> bytes:
    return bytes((seq + i) % 251 for i in range(n))


def _segments(folder) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.startswith("seg-"))


def _crashed_with(folder, batches: int) -> list:
    """A spool of ``batches`` batches left by a crash; returns its entries."""
    spool = Spool(str(folder))
    for seq in range(1, batches + 1):
        spool.append(seq, 1, 0.0, _payload(seq))
    entries = spool.entries()
    _crash(spool)
    return entries


def _overwrite(path: str, at: int, data: bytes = b"", flip: int = 0) -> None:
    """Put ``data`` at byte ``at`` of ``path``, or XOR the byte there with ``flip``."""
    with open(path, "r+b") as handle:
        if flip:
            handle.seek(at)
            data = bytes([handle.read(1)[0] ^ flip])
        handle.seek(at)
        handle.write(data)


def test_batches_read_back_after_reopen_and_files_are_private(tmp_path):
    """Every appended batch reads back byte for byte after a crash and reopen; files are 0600, the folder 0700."""
    spool = Spool(str(tmp_path / "s"), segment_bytes=1000)
    for seq in range(1, 31):
        assert spool.append(seq, seq, 1000.0 + seq, _payload(seq)) == []
    _crash(spool)
    again = Spool(str(tmp_path / "s"))
    assert [e.seq for e in again.entries()] == list(range(1, 31))
    assert all(again.read(seq) == _payload(seq) for seq in range(1, 31))
    assert [e.records for e in again.entries()][:3] == [1, 2, 3] and again.entries()[0].oldest_log_time == 1001.0
    assert len(_segments(tmp_path / "s")) > 3
    assert stat.S_IMODE(os.stat(tmp_path / "s").st_mode) == 0o700
    for path in _segments(tmp_path / "s"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert again.stats.damaged == 0 and again.stats.torn_bytes == 0


def test_a_torn_last_frame_is_cut_off(tmp_path):
    """Half a frame at the end of the last segment (the crash hit a write) is truncated, the rest kept."""
    spool = Spool(str(tmp_path / "s"))
    for seq in (1, 2, 3):
        spool.append(seq, 1, 0.0, _payload(seq))
    _crash(spool)
    [segment] = _segments(tmp_path / "s")
    whole = os.path.getsize(segment)
    with open(segment, "ab") as handle:
        handle.write(b"TLS1\x00\x10\x00")  # a header cut short
    again = Spool(str(tmp_path / "s"))
    assert [e.seq for e in again.entries()] == [1, 2, 3]
    assert again.stats.torn_bytes == 7 and again.stats.damaged == 0
    assert os.path.getsize(segment) == whole
    again.append(4, 1, 0.0, _payload(4))  # and writing goes on after it
    assert again.read(4) == _payload(4)


def test_a_corrupt_frame_is_skipped_and_counted(tmp_path):
    """A flipped byte loses exactly that batch; the batches after it in the same segment are found again."""
    victim = _crashed_with(tmp_path / "s", 5)[2]
    [segment] = _segments(tmp_path / "s")
    _overwrite(segment, victim.offset + 40, flip=0xFF)
    again = Spool(str(tmp_path / "s"))
    assert [e.seq for e in again.entries()] == [1, 2, 4, 5]
    assert again.stats.corrupt_frames == 1 and again.stats.missing_batches == 1
    assert again.read(3) is None and again.read(4) == _payload(4)


def test_a_smashed_length_field_does_not_lose_the_frames_after_it(tmp_path):
    """A length of 2^32-1 in a header is corruption, not an allocation: the scan resynchronises on the next frame."""
    victim = _crashed_with(tmp_path / "s", 4)[1]
    [segment] = _segments(tmp_path / "s")
    _overwrite(segment, victim.offset + 4, b"\xff\xff\xff\xff")
    again = Spool(str(tmp_path / "s"))
    assert [e.seq for e in again.entries()] == [1, 3, 4]
    assert again.stats.corrupt_frames == 1


def test_unreadable_and_deleted_segments_are_counted_not_fatal(tmp_path):
    """A segment that cannot be read is set aside, a deleted one shows as missing batches; reopening works."""
    spool = Spool(str(tmp_path / "s"), segment_bytes=300)
    for seq in range(1, 13):
        spool.append(seq, 1, 0.0, _payload(seq))
    _crash(spool)
    segments = _segments(tmp_path / "s")
    assert len(segments) >= 4
    os.remove(segments[1])
    os.rename(segments[2], segments[2] + ".x")
    os.mkdir(segments[2])  # a name that cannot be read as a file
    again = Spool(str(tmp_path / "s"))
    assert again.stats.quarantined_segments == 1
    assert again.stats.missing_batches > 0 and again.entries()[0].seq == 1 and again.entries()[-1].seq == 12
    assert os.path.exists(segments[2] + ".bad")


def test_release_deletes_acknowledged_segments_but_keeps_the_active_one(tmp_path):
    """Segments wholly acknowledged go (after the retention time); what some lane still lacks stays."""
    spool = Spool(str(tmp_path / "s"), segment_bytes=300)
    for seq in range(1, 13):
        spool.append(seq, 1, 0.0, _payload(seq))
    before = len(_segments(tmp_path / "s"))
    spool.release(6)
    assert all(spool.read(seq) == _payload(seq) for seq in range(7, 13))
    assert spool.entries()[0].seq <= 7 and len(_segments(tmp_path / "s")) < before
    spool.release(12)
    assert len(_segments(tmp_path / "s")) == 1  # the one being written stays
    kept = Spool(str(tmp_path / "k"), segment_bytes=300, retention_s=3600)
    for seq in range(1, 13):
        kept.append(seq, 1, 0.0, _payload(seq))
    kept.release(12)
    assert [e.seq for e in kept.entries()] == list(range(1, 13))


def test_the_disk_bound_evicts_the_oldest_segment_and_says_which(tmp_path):
    """Past max_bytes the oldest segment goes even unacknowledged, and append returns exactly its batches."""
    spool = Spool(str(tmp_path / "s"), segment_bytes=300, max_bytes=1000)
    evicted = []
    for seq in range(1, 41):
        evicted += spool.append(seq, 2, 0.0, _payload(seq))
    assert spool.nbytes <= 1000 + 300
    kept = {e.seq for e in spool.entries()}
    assert {e.seq for e in evicted} == set(range(1, 41)) - kept
    assert spool.stats.evicted_batches == len(evicted) and spool.stats.evicted_records == 2 * len(evicted)


def test_one_writer_at_a_time_readers_any_time(tmp_path):
    """A second writer on a live spool gets a clear error; a read-only open is always allowed and changes nothing."""
    spool = Spool(str(tmp_path / "s"))
    spool.append(1, 1, 0.0, _payload(1))
    with pytest.raises(ConfigError, match="in use by another process"):
        Spool(str(tmp_path / "s"))
    reader = Spool(str(tmp_path / "s"), readonly=True)
    assert reader.read(1) == _payload(1)
    spool.close()
    Spool(str(tmp_path / "s")).close()  # the lock went with the writer


class SpoolMachine(RuleBasedStateMachine):
    """Append, release, crash (maybe mid-write), corrupt and reopen, checked against a plain model."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="spool-sm-")
        self.spool = Spool(self.folder, segment_bytes=400, max_bytes=10**9)
        self.model: dict[int, bytes] = {}  # seq -> payload that must read back
        self.maybe_gone: set[int] = set()  # released (may or may not be deleted)
        self.corrupted: set[int] = set()
        self.seq = 0

    @rule(size=st.integers(0, 300), records=st.integers(0, 5))
    def append(self, size, records):
        self.seq += 1
        payload = os.urandom(size)
        assert self.spool.append(self.seq, records, float(self.seq), payload) == []
        self.model[self.seq] = payload

    @precondition(lambda self: self.seq > 0)
    @rule(data=st.data())
    def release(self, data):
        floor = data.draw(st.integers(0, self.seq))
        self.spool.release(floor)
        self.maybe_gone |= {s for s in self.model if s <= floor}

    @rule(torn=st.binary(max_size=40))
    def crash_and_reopen(self, torn):
        _crash(self.spool)
        segments = sorted(n for n in os.listdir(self.folder) if n.startswith("seg-") and n.endswith(".tls"))
        if segments and torn:  # the crash hit a write: part of a frame at the very end
            with open(os.path.join(self.folder, segments[-1]), "ab") as handle:
                handle.write(torn)
        self.spool = Spool(self.folder, segment_bytes=400, max_bytes=10**9)
        found = {e.seq for e in self.spool.entries()}
        for seq in list(self.model):
            if seq not in found:
                assert seq in self.maybe_gone or seq in self.corrupted, f"batch {seq} lost"
                del self.model[seq]
        if self.corrupted & set(self.model):
            raise AssertionError("a corrupted batch came back")
        self.seq = max(self.seq, self.spool.last_seq)

    @precondition(lambda self: any(s not in self.corrupted for s in self.model))
    @rule(data=st.data())
    def corrupt(self, data):
        live = sorted(s for s in self.model if s not in self.corrupted and self.model[s] and s in self.spool._index)
        if not live:
            return
        seq = data.draw(st.sampled_from(live))
        entry = self.spool._index[seq]
        at = data.draw(st.integers(0, entry.nbytes - 1))
        _overwrite(self.spool._path(entry.segment), entry.offset + 32 + at, flip=0x5A)
        self.corrupted.add(seq)

    @invariant()
    def what_is_kept_reads_back(self):
        for seq, payload in self.model.items():
            got = self.spool.read(seq)
            if seq in self.corrupted:
                assert got is None
            elif seq not in self.maybe_gone:
                assert got == payload, f"batch {seq} changed"

    def teardown(self):
        self.spool.close()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


SpoolMachine.TestCase.settings = settings(max_examples=FUZZ or 150, stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_spool_state_machine = SpoolMachine.TestCase


def test_a_frame_keeps_its_stream_and_audience_across_a_reopen(tmp_path):
    """Each batch's stream (small or bulk) and the lanes it is for survive a crash: a resume routes it without
    reading it; a frame of the first format (no stream, no audience) is still read, as a small batch for all."""
    import struct

    import crc32c

    spool = Spool(str(tmp_path))
    spool.append(1, 3, 1.5, _payload(1))
    spool.append(2, 1, 2.5, _payload(2, 5000), bulk=True, audience=frozenset({"file"}))
    spool.append(3, 2, 3.5, _payload(3), audience=frozenset({"wandb", "file"}))
    _crash(spool)
    old = tmp_path / "old"
    old.mkdir()
    checked = struct.pack("<QId", 9, 4, 9.5)
    payload = _payload(9)
    header = struct.pack("<4sIIQId", b"TLS1", len(payload), crc32c.crc32c(payload, crc32c.crc32c(checked)), 9, 4, 9.5)
    (old / f"seg-{9:016d}.tls").write_bytes(header + payload)
    back = Spool(str(tmp_path), readonly=True)
    assert [(e.seq, e.records, e.oldest_log_time, e.bulk, e.audience) for e in back.entries()] == [
        (1, 3, 1.5, False, None), (2, 1, 2.5, True, frozenset({"file"})), (3, 2, 3.5, False, frozenset({"wandb", "file"}))]
    assert [back.read(seq) for seq in (1, 2, 3)] == [_payload(1), _payload(2, 5000), _payload(3)]
    [first] = Spool(str(old), readonly=True).entries()
    assert (first.seq, first.records, first.bulk, first.audience) == (9, 4, False, None)
    assert Spool(str(old), readonly=True).read(9) == payload
