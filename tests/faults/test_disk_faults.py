"""Disk faults under the spool, staged for real: a full tmpfs, an ext4 gone read-only, a removed folder, a file
size limit. The loop and the lanes go on from memory, durability goes off (said once, with its time) and comes
back on by itself once the disk takes batches again; every point reaches every tracker exactly once."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tracklane.benchmarks import faults
from tracklane.core.records import Batch, Metrics, RunSpec
from tracklane.core.report import PipelineReport
from tracklane.shipping import spool_keeper
from tracklane.shipping.lane import stream_report
from tracklane.shipping.lane_actor import LaneActor
from tracklane.shipping.spool_keeper import SpoolKeeper
from tracklane.shipping.stream import Entry, Stream, StreamSettings
from tracklane.spool.lane_state import LaneState
from tracklane.spool.manifest import RunManifest
from tracklane.spool.recovery import Spooling
from tracklane.spool.segments import Spool
from tracklane.wire.ack import unpack_ack
from tracklane.wire.batch import encode_batch
from tracklane.wire.opening import LaneOpening
from tracklane.workers.testing.memory import memory_records
from tracklane.workers.testing.readers.file_reader import file_lines

RUN = RunSpec(project="p", experiment="e", run_id="disk-faults")
KEYS = 10
OFF_WARNING = "durability is OFF for the spool"


# -- real small disks ---------------------------------------------------------------------------
def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        reason = f"mounting a test filesystem is not permitted here: {done.stderr.strip()}"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)


def _unmount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)  # still held (a lane actor's file)


@contextlib.contextmanager
def _tmpfs(where: Path, size: str = "2m") -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``where``, unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where))
    try:
        yield where
    finally:
        _unmount(where)


def _fill(disk: Path) -> Path:
    """Write to a ballast file until the disk is full (again: other writers free a page now and then)."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (b"\0" * 65536, b"\0" * 512):
            with contextlib.suppress(OSError):
                while os.write(fd, chunk) == len(chunk):
                    pass
    finally:
        os.close(fd)
    return ballast


def _payload(seq: int) -> bytes:
    return bytes((seq + i) % 251 for i in range(600))


def _stage(folder: Path, **spool: int) -> SpoolKeeper:
    spooling = Spooling(spool=Spool(str(folder), **spool), manifest=RunManifest(run=RUN, backends={}))
    stage = SpoolKeeper(spooling, max_bytes=2**30)
    stage.durability.retry_s = 0.0  # every append tries the disk (the default: once a second)
    return stage


def _off_warnings(caplog: pytest.LogCaptureFixture, what: str = OFF_WARNING) -> int:
    return sum(what in record.getMessage() for record in caplog.records)


# -- the spool alone ------------------------------------------------------------------------------
def test_a_full_disk_turns_durability_off_once_and_back_on(tmp_path, caplog):
    """On a full tmpfs appends return False (never raise), one warning says since when; once the ballast is gone the
    next append is on disk again. What was spooled reads back whole: no torn or corrupt frame, only the holes."""
    with _tmpfs(tmp_path / "disk") as disk, caplog.at_level(logging.WARNING, logger="tracklane"):
        stage = _stage(disk / "spool", segment_bytes=4096)
        assert all(stage.append(seq, 2, 0.0, _payload(seq), {}) for seq in range(1, 11))
        ballast = _fill(disk)
        # The segment's last page may still have room for a frame or so; then the disk says no.
        took = [seq for seq in range(11, 31) if stage.append(seq, 2, 0.0, _payload(seq), {})]
        assert took == list(range(11, 11 + len(took))) and len(took) <= 6, took
        refused = 20 - len(took)
        off = stage.report()
        assert off.durability_off_since > 0 and off.disk_error and off.disk_error.startswith("ENOSPC")
        assert (off.unspooled_batches, off.unspooled_records) == (refused, 2 * refused)
        assert "durability OFF since" in off.line() and f"{refused} batch(es) ({2 * refused} records) not spooled" \
            in off.line()
        assert _off_warnings(caplog) == 1 and not stage.durable
        ballast.unlink()
        assert all(stage.append(seq, 2, 0.0, _payload(seq), {}) for seq in range(31, 41))
        back = stage.report()
        assert back.durability_off_since == 0 and back.durability_outages == 1 and back.durability_off_s > 0
        assert "durability was off 1 time(s)" in back.line() and stage.durable
        assert _off_warnings(caplog, "durability is back on for the spool") == 1
        kept = [*range(1, 11 + len(took)), *range(31, 41)]
        reader = Spool(str(disk / "spool"), readonly=True)
        assert [e.seq for e in reader.entries()] == kept and all(reader.read(seq) == _payload(seq) for seq in kept)
        assert (reader.stats.corrupt_frames, reader.stats.torn_bytes, reader.stats.missing_batches) == (0, 0, refused)
        stage.release(40)  # around the hole: only the segment being written stays
        assert len({e.segment for e in Spool(str(disk / "spool"), readonly=True).entries()}) == 1
        stage.close(0, 40)
        assert Spool(str(disk / "spool"), readonly=True).entries() == []


def test_a_removed_spool_folder_is_noticed_and_made_again(tmp_path, monkeypatch, caplog):
    """Writes into a removed folder succeed and go nowhere: the next look (every second) turns durability off, the
    next append makes the folder again (lock, manifest); its batches some tracker lacked count as not spooled."""
    monkeypatch.setattr(spool_keeper, "_CHECK_S", 0.0)
    folder = tmp_path / "spool"
    stage = _stage(folder)
    assert all(stage.append(seq, 1, 0.0, _payload(seq), {}) for seq in range(1, 6))
    shutil.rmtree(folder)
    assert stage.append(6, 1, 0.0, _payload(6), {})  # nobody can tell yet
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        stage.release(3)  # every lane has 1-3: their loss costs nothing
        assert not stage.durable and "ENOENT" in (stage.report().disk_error or "")
        assert stage.append(7, 1, 0.0, _payload(7), {})
    report = stage.report()
    assert report.durability_off_since == 0 and report.durability_outages == 1
    assert (report.unspooled_batches, report.unspooled_records) == (3, 3)
    assert _off_warnings(caplog) == 1 and _off_warnings(caplog, "removed with their files") == 1
    assert RunManifest.load(str(folder)).run.run_id == RUN.run_id
    assert [e.seq for e in Spool(str(folder), readonly=True).entries()] == [7]
    with pytest.raises(Exception, match="in use by another process"):  # its lock was taken again
        Spool(str(folder))
    stage.close(0, 7)


def test_a_file_size_limit_leaves_the_spool_as_its_index_says(tmp_path):
    """RLIMIT_FSIZE in a child process: the append that crosses it gets EFBIG with part of its frame written; that part
    is cut off, so the segment reopens with every earlier batch and no torn or corrupt byte."""
    child = (
        "import json, resource, sys\n"
        "from tracklane.spool.segments import Spool\n"
        "spool = Spool(sys.argv[1], segment_bytes=2**20)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))\n"
        "codes = []\n"
        "for seq in range(1, 11):\n"
        "    try:\n"
        "        spool.append(seq, 1, 0.0, bytes([seq]) * 500)\n"
        "    except OSError as exc:\n"
        "        codes.append(exc.errno)\n"
        "spool.close()\n"
        "print(json.dumps(codes))\n")
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "spool")], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [errno.EFBIG] * 5  # 5 frames of 536 bytes fit in 3000
    reader = Spool(str(tmp_path / "spool"), readonly=True)
    assert [e.seq for e in reader.entries()] == [1, 2, 3, 4, 5]
    assert (reader.stats.corrupt_frames, reader.stats.torn_bytes) == (0, 0)


# -- a lane -------------------------------------------------------------------------------------
def test_a_lane_keeps_unspooled_batches_in_memory_and_spills_the_spooled_ones():
    """Over its bound, a lane lets spooled batches wait on disk to keep one the disk refused in memory; only when
    memory holds nothing but unspooled batches does it drop (and count) the oldest not yet sent."""
    unasked = SimpleNamespace(ready=SimpleNamespace(remote=lambda *args: None))  # offer() never calls the actor
    lane = Stream("x", unasked, StreamSettings(max_bytes=100, max_inflight=1),
                reload=lambda seq: None)

    def entry(seq: int, spooled: bool) -> Entry:
        return Entry(seq=seq, ref=f"obj-{seq}", nbytes=40, records=seq, oldest_log_time=time.time(), spooled=spooled)

    for seq in (1, 2, 3):
        lane.offer(entry(seq, spooled=True))  # 3 waits on disk only
    lane.offer(entry(4, spooled=False))  # 1 gives up its memory
    lane.offer(entry(5, spooled=False))  # 2 too
    assert lane.window.in_memory() == [4, 5] and lane.window.nbytes == 80
    lane.offer(entry(6, spooled=False))  # nothing left to spill: 4, the oldest in memory only, is dropped
    assert lane.window.in_memory() == [5, 6]
    assert stream_report(lane).dropped_records == 4
    assert lane.window.evicted({1, 5}) == 1  # 1 was only on disk; 5 is in memory
    assert stream_report(lane).dropped_records == 5 and not lane.window.entry(5).spooled


# -- a lane actor ---------------------------------------------------------------------------------
def _blob(seq: int, steps: range) -> bytes:
    records = [Metrics(step=s, time=time.time(), values={"x": float(s)}) for s in steps]
    return encode_batch(Batch(seq=seq, created=time.time(), records=records))


def test_a_lane_actor_delivers_on_while_its_state_cannot_be_saved(tmp_path):
    """The state's disk full: every batch is still applied and acknowledged, the answers say since when the state is
    unsaved; once the disk has room the next save puts the current state on it."""
    from tracklane.workers.sinks.memory import MemorySink

    with _tmpfs(tmp_path / "disk") as disk:
        settings = MemorySink.resolve(RUN, {}, {"memory_sink": {"dir": str(tmp_path / "memory")}})
        opening = LaneOpening(backend="memory", run=RUN, settings=settings, state_dir=str(disk / "lanes"),
                              sink_retries=1, retry_backoff_s=0.0)
        actor = LaneActor("memory", opening.pack())
        assert unpack_ack(actor.apply(1, 0, _blob(1, range(0, 3)))).state_unsaved_since == 0
        ballast = _fill(disk)
        for seq in (2, 3):
            ack = unpack_ack(actor.apply(seq, seq - 1, _blob(seq, range(3 * seq - 3, 3 * seq))))
            assert ack.handed == seq and ack.state_unsaved_since > 0 and not ack.gap
        assert LaneState.load(str(disk / "lanes" / "memory.state")).stored_of("") == 1  # what the disk last took
        ballast.unlink()
        assert unpack_ack(actor.apply(4, 3, _blob(4, range(9, 12)))).state_unsaved_since == 0
        assert LaneState.load(str(disk / "lanes" / "memory.state")).stored_of("") == 4
        actor.close(0)
        assert [r.step for r in memory_records(RUN.run_id, str(tmp_path / "memory"))] == list(range(12))


# -- whole runs: file and TensorBoard on another disk than the spool ------------------------------
class _Run:
    """An asynchronous run logging KEYS scalars a step; the trackers write under ``work``, the spool in ``spool``."""

    def __init__(self, work: Path, spool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from tracklane import Tracking

        monkeypatch.setenv("TENSORBOARD_DIR", str(work / "tensorboard"))
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(work / "metrics.jsonl"))
        self.work, self.spool, self.step, self.slowest_log_s = work, spool, 0, 0.0
        self.experiment = f"disk-{uuid.uuid4().hex[:6]}"
        # Acknowledged segments are kept (retention) so the test sees which batches reached the disk.
        config = {"trainer": {"log_async": True, "async_log": {
            "spool_dir": str(spool), "flush_interval_s": 0.05, "spool_segment_bytes": 8192, "spool_retention_s": 600,
            "spool_fsync_s": 0.1}}}
        self.tracking = Tracking("tracklane-disk", self.experiment, ["file", "tensorboard"], config=config)

    def log(self, steps: int, between: Callable[[], object] = lambda: None) -> None:
        for _ in range(steps):
            self.step += 1
            started = time.perf_counter()
            self.tracking.log(faults.values(self.step, KEYS), step=self.step)
            self.slowest_log_s = max(self.slowest_log_s, time.perf_counter() - started)
            between()
            time.sleep(0.01)

    def until(self, what: Callable[[PipelineReport], bool], between: Callable[[], object] = lambda: None,
              timeout: float = 60.0) -> PipelineReport:
        """Log and flush until the report shows ``what`` (the spool tries the disk only when a batch comes)."""
        deadline = time.monotonic() + timeout
        while True:
            self.log(5, between)
            report = self.tracking.flush(timeout=30)
            if what(report):
                return report
            assert time.monotonic() < deadline, report.summary()

    def finish_and_read_back(self) -> tuple[PipelineReport, list[int]]:
        """finish(); each tracker holds every point once; returns the report and the batches on disk."""
        report = self.tracking.finish(timeout=120)
        assert report.complete, report.summary()
        must = set(range(1, self.step + 1))
        for tracker in ("file", "tensorboard"):
            stored = faults.stored_points(tracker, self.work, self.tracking.run_id, self.experiment, "")
            tally = faults.tally(stored, must, set(), KEYS)
            assert tally["once"] == tally["expected"] == self.step * KEYS, (tracker, tally)
            assert tally["duplicated"] == tally["unexpected"] == 0, (tracker, tally)
        return report, [e.seq for e in Spool(str(self.spool), readonly=True).entries()]

    def durable_figures(self) -> list[int]:
        """The health key ``tracklane/spool_durable`` as the file tracker kept it (beside verl's lines)."""
        return [int(line["data"]["tracklane/spool_durable"]) for line in file_lines(self.work / "metrics.jsonl")
                if "tracklane/spool_durable" in line["data"]]


def _off(report: PipelineReport) -> bool:
    return report.spool is not None and report.spool.durability_off_since > 0


def _back_on(report: PipelineReport) -> bool:
    return report.spool is not None and report.spool.durability_off_since == 0 and report.spool.durability_outages > 0


def _check_recovered(run: _Run, caplog: pytest.LogCaptureFixture, healed_at: int, same_disk: bool) -> None:
    """After the fault: the loop never waited, everything arrived once, the report says what durability cost, and the
    batches since durability came back are on disk (retention keeps them). ``same_disk``: nothing went from it, so
    every batch is on it or counted not spooled (batches on a removed disk that every tracker had leave quietly)."""
    report, on_disk = run.finish_and_read_back()
    print(report.summary())
    spool = report.spool
    assert spool is not None and spool.durability_off_since == 0 and spool.durability_outages >= 1, report.summary()
    assert spool.unspooled_batches > 0 and "durability was off" in report.summary(), report.summary()
    assert _off_warnings(caplog) == spool.durability_outages  # one warning per outage, not one per batch
    assert all(lane.state_unsaved_since == 0 for lane in report.lanes.values()), report.summary()
    last = report.lanes["file"].stored_seq
    # Batches since the repair are on disk, the newest included. Not always from the repair on: a lane actor that
    # makes a removed folder again for its state can have a new segment land there before the spool looks.
    since = [seq for seq in on_disk if seq > healed_at]
    assert len(since) >= 2 and since[-1] == last, (healed_at, on_disk, last)
    if same_disk:
        assert len(on_disk) + spool.unspooled_batches == last, (on_disk, spool)
    assert run.slowest_log_s < 0.5, run.slowest_log_s
    figures = run.durable_figures()
    assert 0 in figures and figures[-1] == 1, figures


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_run_whose_spool_disk_fills_up_delivers_everything_and_says_so(tmp_path, monkeypatch, caplog):
    """The spool's tmpfs fills up mid-run (its lane states too): log() keeps returning, the lanes deliver from memory,
    the report says durability is off and since when; the ballast deleted, durability comes back on by itself and
    new batches are on disk; every point is in the file and TensorBoard exactly once."""
    caplog.set_level(logging.WARNING, logger="tracklane")
    with _tmpfs(tmp_path / "disk") as disk:
        run = _Run(tmp_path, disk / "spool", monkeypatch)
        run.log(40)
        run.tracking.flush(timeout=60)
        ballast = _fill(disk)
        off = run.until(_off, between=lambda: _fill(disk))
        assert "durability OFF since" in off.summary() and off.spool and off.spool.disk_error.startswith("ENOSPC")
        assert all(lane.unstored_records == 0 for lane in off.lanes.values()), off.summary()  # delivered from memory
        assert any(lane.state_unsaved_since for lane in off.lanes.values()), off.summary()  # their states: same disk
        ballast.unlink()
        healed_at = run.tracking.flush(timeout=30).lanes["file"].stored_seq
        run.until(_back_on)
        run.log(40)
        _check_recovered(run, caplog, healed_at, same_disk=True)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_run_whose_spool_disk_goes_read_only_then_is_replaced(tmp_path, monkeypatch, caplog):
    """The spool's ext4 hits an error and goes read-only (errors=remount-ro: every write, open files included, gets
    EROFS): the run goes on from memory; a fresh disk mounted in its place (the repair) brings durability back on."""
    if shutil.which("mkfs.ext4") is None or not os.path.isdir("/sys/fs/ext4"):
        print("SKIPPED: no mkfs.ext4 or ext4 here")
        pytest.skip("no mkfs.ext4 or ext4 here")
    caplog.set_level(logging.WARNING, logger="tracklane")
    image, disk = tmp_path / "ext4.img", tmp_path / "disk"
    disk.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(16 * 2**20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image)], check=True, capture_output=True)
    _mount("-o", "loop,errors=remount-ro", str(image), str(disk))
    try:
        run = _Run(tmp_path, disk / "spool", monkeypatch)
        run.log(40)
        run.tracking.flush(timeout=60)
        device = subprocess.run(["findmnt", "-no", "SOURCE", str(disk)], capture_output=True, text=True).stdout.strip()
        trigger = Path(f"/sys/fs/ext4/{os.path.basename(device)}/trigger_fs_error")
        if not trigger.exists():
            run.tracking.finish(timeout=60)
            print(f"SKIPPED: this kernel has no {trigger}")
            pytest.skip(f"this kernel has no {trigger}")
        trigger.write_text("tracklane disk fault test\n")  # ext4_error(): errors=remount-ro takes it read-only
        off = run.until(_off)
        assert off.spool and off.spool.disk_error.startswith("EROFS"), off.summary()
        assert all(lane.unstored_records == 0 for lane in off.lanes.values()), off.summary()
        _unmount(disk)  # held by the spool's and the lane actors' files: detached lazily
        _mount("-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(disk))
        healed_at = run.tracking.flush(timeout=30).lanes["file"].stored_seq
        run.until(_back_on)
        run.log(40)
        _check_recovered(run, caplog, healed_at, same_disk=False)
    finally:
        _unmount(disk)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_run_whose_spool_folder_is_removed_makes_it_again(tmp_path, monkeypatch, caplog):
    """The spool's folder removed mid-run: within about a second durability is off, the folder is made again and
    new batches are on disk; the batches that went with it were delivered from memory, every point once."""
    caplog.set_level(logging.WARNING, logger="tracklane")
    run = _Run(tmp_path, tmp_path / "spool", monkeypatch)
    run.log(40)
    run.tracking.flush(timeout=60)
    shutil.rmtree(run.spool, ignore_errors=True)  # a lane actor may write its state meanwhile: the segments go
    healed_at = run.tracking.flush(timeout=30).lanes["file"].stored_seq
    run.until(_back_on)
    run.log(40)
    _check_recovered(run, caplog, healed_at, same_disk=False)
    assert RunManifest.load(str(run.spool)).run.run_id == run.tracking.run_id  # resume and replay can use it
