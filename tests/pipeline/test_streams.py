"""A tracker's lane as two streams into one actor: small batches overtake bulk ones, each stream lands once."""

from __future__ import annotations

import os
import time

import pytest
import ray

from tracklane.core.acks import Ack
from tracklane.shipping.lane import LaneStreams, lane_preload, lane_report, lane_stored, open_lane
from tracklane.shipping.stream import Entry, StreamSettings
from tracklane.spool.segments import SpoolEntry
from tracklane.wire.ack import pack_ack

pytestmark = pytest.mark.usefixtures("ray_session")

_DEADLINE_S = 30.0


@ray.remote(num_cpus=0)
class TwoStreamSink:
    """The lane actor's protocol per sender (skip re-sends, refuse gaps); a bulk apply takes ``bulk_s``."""

    def __init__(self, bulk_s: float = 0.0, applied: dict | None = None) -> None:
        self.applied: dict[str, int] = dict(applied or {})
        self.order: list[int] = []
        self._bulk_s = bulk_s

    def _ack(self, sender: str, gap: bool = False) -> bytes:
        return pack_ack(Ack(handed=self.applied.get(sender, 0), gap=gap, pid=os.getpid(),
                            handed_by_sender={k: v for k, v in self.applied.items() if k}, stored_by_sender=dict(self.applied)))

    def ready(self, sender: str = "") -> bytes:
        return self._ack(sender)

    def apply(self, seq: int, prev: int, blob, final: bool = False, sender: str = "") -> bytes:
        if seq <= self.applied.get(sender, 0):
            return self._ack(sender)
        if prev != self.applied.get(sender, 0):
            return self._ack(sender, gap=True)
        if sender.endswith("~bulk"):
            time.sleep(self._bulk_s)
        self.applied[sender] = seq
        self.order.append(seq)
        return self._ack(sender)

    def log(self) -> dict:
        return {"order": self.order, "applied": self.applied}


def _pair(actor, max_inflight: int = 2) -> LaneStreams:
    return open_lane("file", actor, StreamSettings(max_bytes=1 << 20, max_inflight=max_inflight))


def _offer(lane: LaneStreams, entry: Entry) -> None:
    for stream in lane:
        stream.offer(entry)


def _entry(seq: int, bulk: bool = False, audience: frozenset[str] | None = None) -> Entry:
    return Entry(seq=seq, ref=ray.put(b"x"), nbytes=10, records=1, oldest_log_time=time.time(), bulk=bulk,
                 audience=audience)


def _pump_until(lane: LaneStreams, done) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, lane_report(lane)
        refs = [ref for stream in lane for ref in stream.waitables()]
        if refs:
            ray.wait(refs, num_returns=1, timeout=0.02)
        for stream in lane:
            stream.pump()


def test_a_small_batch_overtakes_the_bulk_batches_not_yet_sent():
    """Five slow bulk batches then a small one: the small one is applied after at most the bulk batches already in
    flight (max_inflight_batches), not after all five; the spool may forget nothing until the bulk is stored too."""
    actor = TwoStreamSink.remote(bulk_s=0.3)
    lane = small, bulk = _pair(actor, max_inflight=2)
    _pump_until(lane, lambda: small.answered)
    for seq in range(1, 6):
        _offer(lane, _entry(seq, bulk=True))
    bulk.pump()
    _offer(lane, _entry(6))
    _pump_until(lane, lambda: small.window.stored == 6)
    assert lane_stored(lane) < 6 and bulk.window.stored < 5  # the bulk is still on its way: nothing settled past it
    _pump_until(lane, lambda: lane_stored(lane) == 6)
    order = ray.get(actor.log.remote())["order"]
    assert sorted(order) == [1, 2, 3, 4, 5, 6] and order.index(6) <= 2, order
    assert lane_report(lane).bulk_lag_p99_s > lane_report(lane).lag_p99_s
    ray.kill(actor)


def test_a_batch_a_tracker_has_nothing_in_is_never_sent_to_it():
    """An entry whose audience leaves the lane out goes nowhere, and the spool may forget it once the rest is stored."""
    actor = TwoStreamSink.remote()
    lane = _pair(actor)
    _offer(lane, _entry(1))
    _offer(lane, _entry(2, bulk=True, audience=frozenset({"wandb"})))
    _offer(lane, _entry(3, bulk=True, audience=frozenset({"file", "wandb"})))
    _offer(lane, _entry(4, audience=frozenset({"mlflow"})))
    _pump_until(lane, lambda: lane_stored(lane) == 4)
    # 1 and 3 only; in either order: they went by its two streams, and neither waits for the other
    assert sorted(ray.get(actor.log.remote())["order"]) == [1, 3]
    ray.kill(actor)


def test_a_bulk_batch_never_goes_to_a_judge():
    """The judges need the steps, never the rows: a bulk batch's audience leaves them out (an idle bulk stream)."""
    from tracklane.core.records import Metrics, Trajectories
    from tracklane.shipping.shipper import _audience

    lanes = dict.fromkeys(["file", "wandb", "reduce", "health"])
    rows = [Trajectories(step=1, trajectories=[], time=0.0)]
    judges = frozenset({"reduce", "health"})
    assert _audience(rows, True, lanes, judges) == {"file", "wandb"}  # type: ignore[arg-type]
    assert _audience([Metrics(step=1, time=0.0, values={"x": 1.0})], False, lanes, judges) is None  # type: ignore[arg-type]


def test_preloaded_batches_go_back_to_their_streams_and_skip_what_each_stored():
    """After a resume, each spooled batch waits in its own stream; the actor's watermark per stream says which its
    tracker holds, and only the rest is sent, once."""
    actor = TwoStreamSink.remote(applied={"": 3, "~bulk": 2})
    lane = _pair(actor)
    lane_preload(lane, [SpoolEntry(seq=seq, records=1, oldest_log_time=time.time(), nbytes=10, segment=1, offset=0,
                                   bulk=bulk) for seq, bulk in ((1, False), (2, True), (3, False), (4, True), (5, False))])
    for stream in lane:
        stream.window._reload = lambda seq: ray.put(b"x")  # the spool's reader, for this test
    _pump_until(lane, lambda: lane_stored(lane) == 5)
    log = ray.get(actor.log.remote())
    assert sorted(log["order"]) == [4, 5] and log["applied"] == {"": 5, "~bulk": 4}
    ray.kill(actor)
