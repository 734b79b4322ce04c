"""The trainer-side lane's state machine, driven against small fake Ray actors that record every call."""

from __future__ import annotations

import os
import time

import pytest
import ray

from tracklane.core.acks import Ack, SinkCounts
from tracklane.shipping.lane import lane_info, stream_report
from tracklane.shipping.stream import Entry, Stream, StreamSettings
from tracklane.wire.ack import pack_ack

pytestmark = pytest.mark.usefixtures("ray_session")

_DEADLINE_S = 30.0  # generous: another test run may share this 2-core machine


@ray.remote(num_cpus=0)
class Signal:
    """A flag one fake waits on, so a test decides when a held answer may come back."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@ray.remote(num_cpus=0)
class FakeSink:
    """Follows the lane actor's protocol (skip re-sends, refuse gaps) and records every call it gets.

    ``lose``: seqs whose first arrival is answered as if it never came (not applied, no gap).
    ``hold_gap_of``/``signal``: the first gap answer for that seq waits until ``signal`` is set.
    ``apply_sleep``/``ready_sleep``: seconds each apply()/ready() takes.
    ``failed_per_batch``: cumulative failed_records grows by this much per applied batch.
    ``down_for``: the first this many apply() calls are answered "held" (the tracker is down), with an error.
    ``init_sleep``: seconds its constructor takes (an SDK slow to import on a busy node).
    """

    def __init__(self, lose=(), hold_gap_of=None, signal=None, apply_sleep=0.0, ready_sleep=0.0,
                 failed_per_batch=0, down_for=0, init_sleep=0.0) -> None:
        time.sleep(init_sleep)
        self._down_for = down_for
        self.applied = 0
        self.calls: list[tuple[int, int]] = []  # (seq, prev) of every apply(), in arrival order
        self.order: list[int] = []  # seqs actually applied, in order
        self.blobs: dict[int, bytes] = {}
        self.gaps: list[int] = []
        self._lose = set(lose)
        self._hold_gap_of = hold_gap_of
        self._signal = signal
        self._apply_sleep = apply_sleep
        self._ready_sleep = ready_sleep
        self._failed_per_batch = failed_per_batch

    def _ack(self, gap: bool = False) -> bytes:
        return pack_ack(Ack(handed=self.applied, gap=gap, pid=os.getpid(), node_id="fake-node",
                   counts=SinkCounts(failed_records=self._failed_per_batch * len(self.order))))

    def ready(self, sender: str = "") -> bytes:
        time.sleep(self._ready_sleep)
        return self._ack()

    def apply(self, seq: int, prev: int, blob: bytes, final: bool = False, sender: str = "") -> bytes:
        self.calls.append((seq, prev))
        time.sleep(self._apply_sleep)
        if self._down_for:
            self._down_for -= 1
            return pack_ack(Ack(handed=self.applied, held=True, error="ConnectionError: refused", pid=os.getpid(),
                                last_error="ConnectionError: refused", last_error_at=time.time()))
        if seq <= self.applied:
            return self._ack()
        if seq in self._lose:
            self._lose.discard(seq)
            return self._ack()
        if prev != self.applied:
            self.gaps.append(seq)
            if seq == self._hold_gap_of:
                self._hold_gap_of = None
                deadline = time.monotonic() + _DEADLINE_S
                while not ray.get(self._signal.is_set.remote()) and time.monotonic() < deadline:
                    time.sleep(0.02)
            return self._ack(gap=True)
        self.applied = seq
        self.order.append(seq)
        self.blobs[seq] = blob
        return self._ack()

    def log(self) -> dict:
        return {"calls": self.calls, "order": self.order, "blobs": self.blobs, "gaps": self.gaps}

    def pid(self) -> int:
        return os.getpid()


def _lane(actor, max_inflight: int = 2, max_bytes: int = 1 << 20, look_every_s: float = 5.0, reload=None) -> Stream:
    return Stream("fake", actor, StreamSettings(max_bytes=max_bytes, max_inflight=max_inflight, look_every_s=look_every_s),
                reload=reload)


def _entry(seq: int, records: int = 1, nbytes: int = 10) -> Entry:
    return Entry(seq=seq, ref=ray.put(f"batch-{seq}".encode()), nbytes=nbytes, records=records,
                 oldest_log_time=time.time())


def _pump_until(lane: Stream, done, on_pump=None, timeout: float = _DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"condition not reached in {timeout} s: {stream_report(lane)}"
        refs = lane.waitables()
        if refs:
            ray.wait(refs, num_returns=1, timeout=0.02)
        else:
            time.sleep(0.01)
        lane.pump()
        if on_pump is not None:
            on_pump()


def _kill(*actors) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)


def test_submits_in_order_within_max_inflight_and_settles():
    """Batches go out in seq order, each naming the one before, never more than max_inflight at once; acked ones leave."""
    actor = FakeSink.remote(apply_sleep=0.05)
    lane = _lane(actor, max_inflight=2)
    try:
        entries = [_entry(seq, records=seq) for seq in range(1, 7)]
        for entry in entries:
            lane.offer(entry)
        assert not lane.settled(1) and lane.window.nbytes == 60
        inflight: list[int] = []
        settled_prefixes: list[list[bool]] = []

        def watch() -> None:
            inflight.append(len(lane.waitables()))
            settled_prefixes.append([lane.settled(seq) for seq in range(1, 7)])

        _pump_until(lane, lambda: lane.settled(6), on_pump=watch)
        log = ray.get(actor.log.remote())
        assert log["calls"] == [(seq, seq - 1) for seq in range(1, 7)]
        assert log["order"] == list(range(1, 7))
        assert log["blobs"] == {seq: f"batch-{seq}".encode() for seq in range(1, 7)}
        assert max(inflight) == 2  # the first submission fills the window's two slots, never more
        for flags in settled_prefixes:  # settled(k) implies settled(j) for every j < k
            assert flags == sorted(flags, reverse=True), flags
        report = stream_report(lane)
        assert (report.stored_seq, report.unstored_batches, report.unstored_records) == (6, 0, 0)
        assert lane.window.nbytes == 0 and lane.waitables() == [] and report.dropped_records == 0
    finally:
        _kill(actor)


def test_gap_resends_from_last_acknowledged_seq():
    """A gap answer makes the lane re-send, in order, from its last acknowledged seq; nothing is applied twice."""
    actor = FakeSink.remote(lose={2})  # batch 2 goes missing once: the batch after it is refused
    lane = _lane(actor, max_inflight=2)
    try:
        for seq in range(1, 6):
            lane.offer(_entry(seq))
        _pump_until(lane, lambda: lane.settled(5))
        log = ray.get(actor.log.remote())
        assert log["order"] == [1, 2, 3, 4, 5]
        assert log["gaps"] and log["gaps"][0] == 3
        calls = log["calls"]
        assert calls.count((2, 1)) == 2, calls  # lost once, re-sent once
        resent_at = len(calls) - 1 - calls[::-1].index((2, 1))
        assert calls[resent_at:] == [(2, 1), (3, 2), (4, 3), (5, 4)], calls  # one recovery, in order
        assert stream_report(lane).stored_seq == 5
    finally:
        _kill(actor)


def test_gap_answer_of_a_forgotten_call_does_not_restart_again():
    """A gap answered to a call sent before a recovery arrives after it and triggers no second re-send."""
    signal = Signal.remote()
    # Batch 1 goes missing once: (2, 1) and (3, 2) are both refused; the answer to (3, 2) is held back
    # until the lane has recovered and re-sent, so it reaches a lane in a newer epoch.
    actor = FakeSink.remote(lose={1}, hold_gap_of=3, signal=signal)
    lane = _lane(actor, max_inflight=3)
    try:
        for seq in range(1, 4):
            lane.offer(_entry(seq))
        _pump_until(lane, lambda: lane.pid != 0)  # the probe answered; the same pump submitted
        first = set(lane.waitables())
        assert len(first) == 3  # the first three calls, all in epoch 0
        # Recovery: with the window all in flight, a new call is only ever a re-send.
        _pump_until(lane, lambda: any(ref not in first for ref in lane.waitables()))
        ray.get(signal.set.remote())  # now the stale gap for (3, 2) comes back
        _pump_until(lane, lambda: lane.settled(3))
        log = ray.get(actor.log.remote())
        assert log["gaps"] == [2, 3]
        assert log["calls"] == [(1, 0), (2, 1), (3, 2), (1, 0), (2, 1), (3, 2)]  # exactly one re-send
        assert log["order"] == [1, 2, 3]
        assert stream_report(lane).stored_seq == 3 and not lane.dead
    finally:
        _kill(actor, signal)


def test_full_lane_drops_oldest_unsent_only():
    """At the byte bound the oldest batches not yet submitted are dropped and counted; submitted ones are kept."""
    actor = FakeSink.remote(apply_sleep=3600)  # takes the first batch and never answers
    lane = _lane(actor, max_inflight=1, max_bytes=100)
    try:
        lane.offer(_entry(1, records=1, nbytes=30))
        _pump_until(lane, lambda: lane.pid != 0)  # the probe answered and batch 1 went out
        assert len(lane.waitables()) == 1
        lane.offer(_entry(2, records=2, nbytes=30))
        lane.offer(_entry(3, records=4, nbytes=30))
        assert lane.window.nbytes == 90
        assert lane.window.has_room(10) and not lane.window.has_room(11)
        lane.offer(_entry(4, records=8, nbytes=30))  # evicts 2, the oldest not submitted
        assert lane.report.dropped_records == 2 and lane.window.nbytes == 90
        lane.offer(_entry(5, records=16, nbytes=60))  # evicts 3 and 4
        assert lane.report.dropped_records == 2 + 4 + 8 and lane.window.nbytes == 90
        lane.pump()
        report = stream_report(lane)
        assert (report.unstored_batches, report.unstored_records) == (2, 1 + 16)  # batches 1 (in flight) and 5
        assert not lane.settled(1) and not lane.dead
        lane.offer(_entry(6, records=32, nbytes=71))  # 30 in flight + 71 > 100 even with 5 evicted
        assert lane.window.nbytes <= 100
        assert not lane.settled(1)  # the submitted batch is never dropped
        assert stream_report(lane).dropped_records + stream_report(lane).unstored_records == 63  # every record accounted for
    finally:
        _kill(actor)


def test_a_slow_actor_is_waited_for_and_said_to_be_starting_not_given_up():
    """An actor whose constructor takes long (importing its SDK, opening its tracker on a busy node) is not dead: the
    lane asks Ray, waits on, says what it waits for, and delivers once the actor is up."""
    actor = FakeSink.remote(init_sleep=4.0)
    lane = _lane(actor, look_every_s=0.3)
    try:
        lane.offer(_entry(1, records=3))
        _pump_until(lane, lambda: "starting" in stream_report(lane).down)
        report = stream_report(lane)
        assert not lane.dead and report.down.startswith("not started after") and report.down_s > 0, report.down
        assert "opening its tracker" in report.down and report.dropped_records == 0
        _pump_until(lane, lambda: lane.settled(1))
        report = stream_report(lane)
        assert report.complete and report.down == "" and ray.get(actor.log.remote())["order"] == [1]
    finally:
        _kill(actor)


def test_an_actor_waiting_for_a_resource_no_node_offers_is_pending_not_dead():
    """An actor Ray cannot place yet (its resource is on a node that has not joined) keeps its lane waiting, named."""
    actor = FakeSink.options(resources={"node_that_never_joins": 0.01}).remote()
    lane = _lane(actor, look_every_s=0.2)
    try:
        lane.offer(_entry(1, records=3))
        _pump_until(lane, lambda: "pending" in stream_report(lane).down, timeout=10)
        time.sleep(0.5)
        lane.pump()
        report = stream_report(lane)
        assert not lane.dead and not lane.settled(1) and report.unstored_records == 3 and report.dropped_records == 0
        assert "waiting for resource node_that_never_joins (no node offers it yet)" in report.down, report.down
    finally:
        _kill(actor)


def test_an_actor_ray_reports_dead_gives_the_lane_up_and_keeps_its_batches_on_disk():
    """Killed for good (no restart left): the lane gives up with Ray's own words, sends nothing more, and keeps what
    the tracker lacks in the window, on disk only (its stored watermark stays): nothing is counted dropped."""
    actor = FakeSink.remote(apply_sleep=3600)  # the first batch never comes back
    lane = _lane(actor, max_inflight=1, reload=lambda seq: ray.put(f"batch-{seq}".encode()))
    try:
        lane.offer(_entry(1, records=3))
        lane.offer(_entry(2, records=4))
        _pump_until(lane, lambda: lane.waitables() != [] and lane.window.sent == 1)
        ray.kill(actor, no_restart=True)
        _pump_until(lane, lambda: lane.dead)
        lane.offer(_entry(3, records=5))  # after giving up: kept as well
        report = stream_report(lane)
        assert report.gave_up and "actor died" in report.error and "ray.kill" in report.error, report.error
        assert report.down.startswith("gave up: actor died")
        assert report.dropped_records == 0 and report.unstored_records == 12 and report.stored_seq == 0
        assert lane.window.nbytes == 0 and lane.settled(3) and lane.waitables() == []
        assert "GAVE UP" in report.line() and "12 not stored" in report.line()
    finally:
        _kill(actor)


def test_accept_replaces_counts_and_info_names_the_actor():
    """The actor's cumulative counts replace the report's (never summed); info() carries the answering pid."""
    actor = FakeSink.remote(failed_per_batch=2)
    lane = _lane(actor, max_inflight=1)
    try:
        assert lane.pid == 0  # nothing answered yet
        for seq in range(1, 4):
            lane.offer(_entry(seq))
        _pump_until(lane, lambda: lane.settled(3))
        assert lane.report.failed_records == 6  # 2, 4, 6 cumulative: the last one, not 12
        info = lane_info([lane])
        assert info.pid == ray.get(actor.pid.remote()) and info.pid != os.getpid()
        assert info.node_id == "fake-node" and info.name == "fake" and info.unstored_bytes == 0

        lane.accept(Ack(handed=0, error="tracker said no", pid=4242, node_id="n2",
                        counts=SinkCounts(failed_records=9, unsupported={"artifact": 2},
                                          cuts={"params_truncated": 1}, artifacts_missing=1)))
        report = stream_report(lane)
        assert (report.failed_records, report.unsupported, report.cuts, report.artifacts_missing) == \
            (9, {"artifact": 2}, {"params_truncated": 1}, 1)
        assert report.error == "tracker said no" and report.stored_seq == 3  # an older applied never un-acks
        assert (lane.pid, lane.node_id) == (4242, "n2")

        lane.accept(Ack(handed=3, counts=SinkCounts(failed_records=10, unsupported={"table": 1})))
        report = stream_report(lane)
        assert (report.failed_records, report.unsupported, report.cuts, report.artifacts_missing) == \
            (10, {"table": 1}, {}, 0)
        assert report.error is None and report.last_error == "tracker said no"  # it went through: nothing wrong now
        lane.accept(Ack(handed=3, error="and again"))
        assert stream_report(lane).error == "and again" and stream_report(lane).failed_records == 0
    finally:
        _kill(actor)


def test_a_recovered_tracker_is_reported_as_recovered_not_broken():
    """A tracker down for two sends, then back: the lane has everything, no current error, and says it recovered:
    one outage, its length, two batches sent again, and the last error with its time."""
    actor = FakeSink.remote(down_for=2)
    lane = Stream("fake", actor, StreamSettings(max_bytes=1 << 20, max_inflight=1, backoff_s=0.05, max_backoff_s=0.1))
    try:
        before = time.time()
        for seq in range(1, 4):
            lane.offer(_entry(seq))
        _pump_until(lane, lambda: lane.settled(3))
        report = stream_report(lane)
        assert report.complete and ray.get(actor.log.remote())["order"] == [1, 2, 3]
        assert report.error is None and report.outage_s == 0.0
        assert (report.recovered_outages, report.retries) == (1, 2)
        assert report.outage_total_s > 0.0
        assert report.last_error is not None and "ConnectionError: refused" in report.last_error
        assert before <= report.last_error_at <= time.time()
        assert "recovered from 1 outage(s)" in report.line() and "2 batch(es) sent again" in report.line()
    finally:
        _kill(actor)


@ray.remote(num_cpus=0)
class RaisingReady:
    """ready() raises inside the actor every time (a tracker whose start-up code crashes)."""

    def ready(self, sender=""):
        raise ValueError("tracker init exploded")

    def apply(self, seq, prev, blob, final=False, sender=""):
        return pack_ack(Ack(handed=seq))


def test_probe_that_raises_is_retried_then_the_lane_dies():
    """A ready() that raises never escapes pump(): it is asked again a few times, then the lane gives up; without a
    spool behind it (no reload) its records are counted dropped."""
    actor = RaisingReady.remote()
    lane = _lane(actor)
    lane.offer(_entry(1, records=3))
    try:
        _pump_until(lane, lambda: lane.dead)
        report = stream_report(lane)
        assert report.dropped_records == 3 and "tracker init exploded" in report.error
    finally:
        _kill(actor)


def test_batch_that_cannot_fit_leaves_waiting_batches_alone():
    """A batch too big for what is in flight plus itself is dropped alone; the batches waiting to be sent stay."""
    actor = FakeSink.remote(apply_sleep=3600)
    lane = _lane(actor, max_inflight=1, max_bytes=100)
    try:
        lane.offer(_entry(1, records=1, nbytes=30))
        _pump_until(lane, lambda: lane.pid != 0)  # batch 1 submitted and in flight
        lane.offer(_entry(2, records=5, nbytes=60))  # 90 held: fits
        lane.offer(_entry(3, records=7, nbytes=80))  # 30 in flight + 80 > 100 whatever is evicted
        report = stream_report(lane)
        assert (report.dropped_records, report.unstored_records) == (7, 6), report
    finally:
        _kill(actor)


@ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)
class LaggingStore:
    """A tracker whose store lags what it was handed by ``lag`` batches (as wandb-core's does), and that
    loses the lag when its process dies: only ``durable`` survives, in ``state_path``; every apply is logged
    there too. It dies (once) when ``crash_at`` first arrives."""

    def __init__(self, state_path: str, lag: int, crash_at: int) -> None:
        self._path, self._lag, self._crash_at = state_path, lag, crash_at
        try:
            with open(state_path) as handle:
                lines = handle.read().split()
        except FileNotFoundError:
            lines = []
        self.durable = max((int(x[1:]) for x in lines if x.startswith("d")), default=0)
        self.handed = self.durable  # what was only in memory died with the process
        self.crashed = any(x == "crash" for x in lines)

    def _note(self, word: str) -> None:
        with open(self._path, "a") as handle:
            handle.write(word + "\n")

    def _ack(self, gap: bool = False) -> bytes:
        return pack_ack(Ack(handed=self.handed, stored=self.durable, gap=gap, pid=os.getpid()))

    def ready(self, sender: str = "") -> bytes:
        return self._ack()

    def apply(self, seq: int, prev: int, blob: bytes, final: bool = False, sender: str = "") -> bytes:
        if seq <= self.handed:
            return self._ack()
        if prev != self.handed:
            return self._ack(gap=True)
        if seq == self._crash_at and not self.crashed:
            self._note("crash")
            os._exit(1)
        assert blob == f"batch-{seq}".encode()
        self.handed = seq
        self._note(f"a{seq}")
        if seq - self._lag > self.durable:
            self.durable = seq - self._lag
            self._note(f"d{self.durable}")
        return self._ack()


def _applied_order(path) -> list[int]:
    return [int(x[1:]) for x in path.read_text().split() if x.startswith("a")]


@pytest.mark.slow
def test_batches_not_durable_yet_are_sent_again_from_the_spool_after_a_crash(tmp_path):
    """A tracker whose store lags by 2 batches dies at batch 6: batches 4 and 5 (handed, never stored) come back
    from the spool (the reload) and are applied again; the lane's durable watermark is what the store holds."""
    state = tmp_path / "store.txt"
    actor = LaggingStore.remote(str(state), lag=2, crash_at=6)
    reloaded: list[int] = []

    def reload(seq: int):
        reloaded.append(seq)
        return ray.put(f"batch-{seq}".encode())

    settings = StreamSettings(max_bytes=1 << 20, max_inflight=1)
    lane = Stream("lagging", actor, settings, reload=reload)
    try:
        for seq in range(1, 9):
            lane.offer(_entry(seq, records=seq))
        _pump_until(lane, lambda: lane.settled(8))
        assert _applied_order(state) == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8]
        assert reloaded == [4, 5]
        report = stream_report(lane)
        assert lane.window.stored == 6 and report.stored_seq == 6 and report.restarts == 1
        assert (report.unstored_batches, report.unstored_records, report.dropped_records) == (2, 7 + 8, 0)
    finally:
        _kill(actor)


@pytest.mark.slow
def test_without_a_spool_batches_not_durable_go_again_from_memory_after_a_crash(tmp_path):
    """The same crash with no spool: the lane kept batches 4 and 5 in Ray until the store held them, so the
    successor gets them again from memory; nothing is counted lost, and the tracker holds each once."""
    state = tmp_path / "store.txt"
    actor = LaggingStore.remote(str(state), lag=2, crash_at=6)
    lane = _lane(actor, max_inflight=1)
    try:
        for seq in range(1, 9):
            lane.offer(_entry(seq, records=seq))
        _pump_until(lane, lambda: lane.settled(8))
        assert _applied_order(state) == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8]
        report = stream_report(lane)
        assert report.restarts == 1 and report.dropped_records == 0 and report.error is None
    finally:
        _kill(actor)


def test_lane_gives_up_after_repeated_actor_errors(ray_session):
    """A lane whose actor raises on every call re-sends a few times, then counts its records as dropped."""
    @ray.remote(num_cpus=0)
    class Broken:
        def ready(self, sender=""):
            return pack_ack(Ack(handed=0))

        def apply(self, seq, prev, blob, final=False, sender=""):
            raise OSError("disk full")

    settings = StreamSettings(max_bytes=1 << 20, max_inflight=1)
    lane = Stream("broken", Broken.remote(), settings)
    lane.offer(Entry(seq=1, ref=ray.put(b"x"), nbytes=1, records=3, oldest_log_time=time.time()))
    deadline = time.monotonic() + 30
    while not lane.dead and time.monotonic() < deadline:
        lane.pump()
        time.sleep(0.05)
    report = stream_report(lane)
    assert lane.dead and report.dropped_records == 3 and "disk full" in report.error
