"""The shipper's flush/close barriers, around real Lanes and small fake Ray actors that record what they get."""

from __future__ import annotations

import os
import threading
import time

import pytest
import ray
from ray.exceptions import RayActorError

from tracklane.capture.captured import Captured
from tracklane.capture.convert import Converter
from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.acks import Ack, SinkCounts
from tracklane.shipping.buffer import RecordBuffer
from tracklane.shipping.lane import open_lane
from tracklane.shipping.shipper import Shipper
from tracklane.shipping.stream import StreamSettings
from tracklane.shipping.tracker_calls import TrackerCalls
from tracklane.wire.ack import pack_ack
from tracklane.wire.batch import decode_batch

pytestmark = pytest.mark.usefixtures("ray_session")

_DEADLINE_S = 30.0  # generous: another test run may share this 2-core machine


@ray.remote(num_cpus=0)
class FakeTracker:
    """Applies batches in order like the lane actor, decoding them to record the steps; records every call."""

    def __init__(self, apply_sleep: float = 0.0, close_failed: int = 0, where: str = "") -> None:
        self.applied = 0
        self.events: list[tuple] = []  # ("apply", seq, prev) / ("flush",) / ("close", exit_code), in order
        self.steps: list[int] = []
        self._apply_sleep = apply_sleep
        self._close_failed = close_failed
        self._where = where

    def _ack(self, gap: bool = False, **extra) -> bytes:
        return pack_ack(Ack(handed=self.applied, gap=gap, pid=os.getpid(), **extra))

    def ready(self, sender: str = "") -> bytes:  # the lane's bulk stream asks too: it never sends anything here
        return self._ack()

    def apply(self, seq: int, prev: int, blob: bytes, final: bool = False, sender: str = "") -> bytes:
        self.events.append(("apply", seq, prev))
        time.sleep(self._apply_sleep)
        if seq <= self.applied:
            return self._ack()
        if prev != self.applied:
            return self._ack(gap=True)
        self.steps.extend(record.step for record in decode_batch(blob).records)
        self.applied = seq
        return self._ack()

    def flush(self) -> bytes:
        self.events.append(("flush",))
        return self._ack()

    def close(self, exit_code: int) -> bytes:
        self.events.append(("close", exit_code))
        return self._ack(counts=SinkCounts(failed_records=self._close_failed), where=self._where,
                         error=f"closed with exit code {exit_code}")

    def log(self) -> dict:
        return {"events": self.events, "steps": self.steps, "applied": self.applied}


class Recorder:
    """Stands in for an actor handle: notes every ``.remote()`` call (method, args, time) in order, then forwards it.

    ``ray.kill`` refuses it, so a test using one kills the real actor itself.
    """

    def __init__(self, handle) -> None:
        self.handle = handle
        self.calls: list[tuple[str, tuple, float]] = []

    def __getattr__(self, name: str):
        method = getattr(self.handle, name)
        calls = self.calls

        class _Method:
            def remote(self, *args):
                calls.append((name, args[:2], time.monotonic()))  # apply: (seq, prev), not the blob
                return method.remote(*args)

        return _Method()


def _config(**overrides) -> AsyncLogConfig:
    settings = {"flush_interval_s": 0.05, "max_inflight_batches": 1, "log_vitals": False, **overrides}
    return AsyncLogConfig(**settings)


def _shipper(cfg: AsyncLogConfig, actors: dict) -> Shipper:
    settings = StreamSettings(max_bytes=cfg.lane_max_bytes, max_inflight=cfg.max_inflight_batches)
    lanes = {name: open_lane(name, actor, settings) for name, actor in actors.items()}
    buffer = RecordBuffer(cfg.queue_max_bytes, cfg.max_batch_bytes, cfg.overflow, cfg.block_timeout_s)
    shipper = Shipper(cfg, buffer, lanes, Converter(RecordLimits(), backends=list(lanes)), tracker_calls=TrackerCalls())
    shipper.start()
    return shipper


def _put(shipper: Shipper, steps) -> None:
    for step in steps:
        shipper._buffer.put(Captured(step, {"x": 1.0}, time.time(), None, "metrics", 64))


def _stop(shipper: Shipper, *actors) -> None:
    """Close the shipper if it still runs, kill the fakes, and check the thread ended."""
    try:
        if shipper._thread.is_alive():
            shipper.close(0, 1.0)
        shipper._thread.join(10)
        assert not shipper._thread.is_alive(), "the shipper thread outlived close()"
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {_DEADLINE_S} s"
        time.sleep(0.02)


@pytest.mark.parametrize(("timeout", "close_share"), [(4.0, 1.0), (20.0, 5.0), (60.0, 15.0), (100.0, 15.0),
                                                      (600.0, 15.0)])
def test_close_keeps_a_quarter_of_the_deadline_at_most_15_s(timeout, close_share):
    """close() drains until its deadline less min(25 %, 15 s) of it; flush() drains until its whole deadline."""
    cfg = _config()
    buffer = RecordBuffer(cfg.queue_max_bytes, cfg.max_batch_bytes, cfg.overflow, cfg.block_timeout_s)
    shipper = Shipper(cfg, buffer, {}, Converter(RecordLimits()))  # not started: requests stay posted
    before = time.monotonic()
    report = shipper.close(0, timeout)
    assert report.timed_out  # no thread to answer: answered at once, as timed out
    (barrier,) = shipper._requests.pending()
    assert barrier.closing and before <= barrier.started
    assert barrier.deadline - barrier.started == pytest.approx(timeout, abs=0.5)
    assert barrier.deadline - barrier.drain_deadline == pytest.approx(close_share, rel=1e-9)
    shipper.flush(timeout)
    flush = shipper._requests.pending()[1]
    assert not flush.closing and flush.drain_deadline == flush.deadline


@pytest.mark.slow
def test_close_calls_trackers_at_the_drain_deadline_and_times_out():
    """With an actor that never answers, close() is sent at 75 % of the deadline and the report times out on time."""
    actor = FakeTracker.remote(apply_sleep=3600)
    recorder = Recorder(actor)
    shipper = _shipper(_config(), {"stuck": recorder})
    try:
        _put(shipper, range(5))
        _wait_for(lambda: any(name == "apply" for name, _, _ in recorder.calls), "a batch submitted")
        started = time.monotonic()
        report = shipper.close(3, 4.0)
        elapsed = time.monotonic() - started
        closes = [(args, at - started) for name, args, at in recorder.calls if name == "close"]
        assert len(closes) == 1 and closes[0][0] == (3,)
        assert 3.0 - 0.05 <= closes[0][1] <= 3.0 + 1.5, closes  # at the drain deadline, not before
        assert 4.0 - 0.05 <= elapsed <= 4.0 + 3.0, elapsed  # answered at the deadline (+ a loaded machine's slack)
        assert report.timed_out and not report.complete
        lane = report.lanes["stuck"]
        assert lane.unstored_records == 5 and lane.stored_seq == 0 and lane.dropped_records == 0
        assert lane.error == "did not answer before the deadline"
        assert report.buffered_records == 0
    finally:
        _stop(shipper, actor)


@pytest.mark.slow
def test_nothing_is_submitted_after_close_begins():
    """Once a lane's close() is sent, the shipper submits no more batches to any lane, though some are unsent."""
    actors = {name: FakeTracker.remote(apply_sleep=0.1) for name in ("a", "b")}
    recorders = {name: Recorder(actor) for name, actor in actors.items()}
    # One record per batch: 40 batches at 0.1 s each cannot drain before the 1.5 s drain deadline.
    shipper = _shipper(_config(max_batch_bytes=64, flush_interval_s=0.01), recorders)
    try:
        _put(shipper, range(40))
        for recorder in recorders.values():  # both actors up and answering (max_inflight 1: a 2nd apply went out)
            _wait_for(lambda calls=recorder.calls: sum(name == "apply" for name, _, _ in calls) >= 2,
                      "a batch acknowledged")
        report = shipper.close(0, 2.0)
        for name, recorder in recorders.items():
            names = [call for call, _, _ in recorder.calls]
            assert names.count("close") == 1, names
            after_close = names[names.index("close") + 1:]
            assert "apply" not in after_close, (name, names)
            log = ray.get(actors[name].log.remote())  # the actor saw the same order: nothing after its close
            kinds = [event[0] for event in log["events"]]
            assert kinds[-1] == "close" and kinds.count("close") == 1, kinds
            lane = report.lanes[name]
            assert lane.stored_seq == log["applied"] and 0 < log["applied"] < 40  # the close answer acknowledged
            assert lane.unstored_records == 40 - log["applied"] and log["steps"] == list(range(log["applied"]))
        assert report.timed_out  # batches were left unsent: the barrier cannot claim completeness
    finally:
        _stop(shipper, *actors.values())


@pytest.mark.slow
def test_flush_times_out_while_a_lane_holds_unacknowledged_batches():
    """flush() with batches the actor has not acknowledged answers at its deadline, timed out, naming them."""
    actor = FakeTracker.remote(apply_sleep=3600)
    shipper = _shipper(_config(), {"stuck": actor})
    try:
        _put(shipper, range(3))
        started = time.monotonic()
        report = shipper.flush(1.5)
        elapsed = time.monotonic() - started
        assert 1.5 - 0.05 <= elapsed <= 1.5 + 3.0, elapsed
        assert report.timed_out and not report.complete
        assert report.lanes["stuck"].unstored_records == 3 and report.lanes["stuck"].stored_seq == 0
        assert report.buffered_records == 0
    finally:
        _stop(shipper, actor)


def test_flush_ships_everything_put_before_it():
    """Records put just before flush() are shipped and acknowledged within that flush, which reports complete."""
    actor = FakeTracker.remote()
    # A minute's flush interval and 4 MiB batches: nothing is shipped unless a barrier forces it.
    shipper = _shipper(_config(flush_interval_s=60.0, max_inflight_batches=2), {"t": actor})
    try:
        for round_ in range(3):
            _put(shipper, range(round_ * 10, round_ * 10 + 10))
            report = shipper.flush(_DEADLINE_S)
            assert not report.timed_out and report.complete, report.summary()
            assert report.buffered_records == 0
            lane = report.lanes["t"]
            assert lane.stored_seq == round_ + 1 and lane.unstored_records == 0  # one batch per flush
        log = ray.get(actor.log.remote())
        assert log["steps"] == list(range(30))
        flushes = [i for i, event in enumerate(log["events"]) if event == ("flush",)]
        assert len(flushes) == 3
        applies = [i for i, event in enumerate(log["events"]) if event[0] == "apply"]
        assert len(applies) == 3 and all(a < f for a, f in zip(applies, flushes, strict=True)), log["events"]
    finally:
        _stop(shipper, actor)


def test_close_report_merges_the_trackers_final_answer():
    """The Ack returned by actor.close (counts, where, error) is in the close report; the actors are then killed."""
    actor = FakeTracker.remote(close_failed=3, where="fake: somewhere")
    shipper = _shipper(_config(), {"t": actor})
    try:
        _put(shipper, range(4))
        report = shipper.close(7, _DEADLINE_S)
        assert not report.timed_out
        lane = report.lanes["t"]
        assert lane.failed_records == 3 and lane.where == "fake: somewhere"
        assert lane.error == "closed with exit code 7"
        assert lane.unstored_records == 0 and lane.stored_seq >= 1 and lane.dropped_records == 0
        assert not lane.complete and not report.complete  # failed records make it incomplete
        shipper._thread.join(10)
        assert not shipper._thread.is_alive()
        with pytest.raises(RayActorError):  # killed by close (ray.kill is asynchronous: a call may still get in)
            deadline = time.monotonic() + _DEADLINE_S
            while time.monotonic() < deadline:
                ray.get(actor.log.remote(), timeout=_DEADLINE_S)
                time.sleep(0.1)
        later = shipper.flush(1.0)  # no thread left: answered at once, as timed out
        assert later.timed_out
    finally:
        _stop(shipper, actor)


@ray.remote(num_cpus=0)
class SlowTracker:
    """Each apply takes 1 s and each flush 0.5 s, so batches queue behind a flush."""

    def __init__(self) -> None:
        self.applied = 0

    def ready(self, sender=""):
        return pack_ack(Ack(handed=0))

    def apply(self, seq, prev, blob, final=False, sender=""):
        time.sleep(1.0)
        self.applied = seq
        return pack_ack(Ack(handed=seq))

    def flush(self):
        time.sleep(0.5)
        return pack_ack(Ack(handed=self.applied))

    def close(self, exit_code):
        return pack_ack(Ack(handed=self.applied))


@pytest.mark.slow
def test_first_flush_is_not_blamed_for_records_logged_after_it():
    """A flush posted before anything was shipped settles on what preceded it, not on batches logged while it ran."""
    actor = SlowTracker.remote()
    shipper = _shipper(_config(), {"t": actor})
    try:
        assert not shipper.flush(30).timed_out  # the actor is up; nothing logged yet
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(report=shipper.flush(30)))
        thread.start()
        time.sleep(0.2)  # that flush is now inside the actor, for 0.5 s
        _put(shipper, range(3))  # shipped at once (flush interval 0.05 s), queued behind the flush
        thread.join(40)
        assert not result["report"].timed_out, result["report"].summary()
    finally:
        _stop(shipper, actor)


def _applies(recorder: Recorder, since: float, until: float) -> int:
    return sum(name == "apply" and since <= at < until for name, _, at in recorder.calls)


def test_batches_are_fewer_while_the_logging_thread_computes():
    """busy_flush_interval_s applies while the thread that built the shipper keeps a CPU busy, and flush_interval_s
    again once it sleeps: a record every 10 ms gives ~1 batch a second while it computes, ~10 while it sleeps."""
    actor = FakeTracker.remote()
    recorder = Recorder(actor)
    shipper = _shipper(_config(flush_interval_s=0.1, busy_flush_interval_s=1.0), {"t": recorder})
    try:
        step = 0
        started = time.monotonic()
        while time.monotonic() - started < 4.0:  # computes: logs every 10 ms without ever sleeping
            mark = time.monotonic()
            while time.monotonic() - mark < 0.01:
                pass
            _put(shipper, [step])
            step += 1
        calm = time.monotonic()
        while time.monotonic() - calm < 3.0:  # waits (a GPU step, say) between the same calls
            time.sleep(0.01)
            _put(shipper, [step])
            step += 1
        shipper.flush(_DEADLINE_S)
        busy_batches = _applies(recorder, started + 1.0, calm)  # its first look takes up to 0.5 s
        calm_batches = _applies(recorder, calm + 1.0, calm + 3.0)
        # 3 s at 1 s a batch is 3; a loaded CI machine left the thread off CPU for a look or two (7 seen), and
        # without the busy interval it is ~28
        assert busy_batches <= 12, busy_batches
        assert calm_batches >= 8, calm_batches  # 2 s at 0.1 s a batch; most of them
        assert ray.get(actor.log.remote())["steps"] == list(range(step))  # and nothing lost or reordered
    finally:
        _stop(shipper, actor)
