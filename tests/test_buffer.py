"""The producer's buffer: bounded by bytes, overflow counted, the caller never waits past its deadline."""

from __future__ import annotations

import threading
import time

from pipeline.capture.captured import Captured
from pipeline.shipping.buffer import RecordBuffer


def _item(n: int, size: int = 100) -> Captured:
    return Captured(step=n, payload={}, time=time.time(), backend=None, kind="metrics", size=size)


def test_drop_oldest_keeps_the_bound_and_counts():
    """Past the bound the oldest items go first, each counted; the newest survive."""
    buffer = RecordBuffer(max_bytes=1000, batch_bytes=500, policy="drop_oldest", block_timeout_s=0)
    for n in range(25):
        buffer.put(_item(n))
        assert buffer.nbytes <= 1000
    kept = [item.step for item in buffer.take(10_000)]
    assert kept == list(range(15, 25)) and buffer.dropped == 15 and buffer.nbytes == 0


def test_take_respects_batch_bytes():
    """take() returns at most max_bytes worth of items (but always at least one)."""
    buffer = RecordBuffer(max_bytes=10_000, batch_bytes=5000, policy="drop_oldest", block_timeout_s=0)
    for n in range(10):
        buffer.put(_item(n))
    assert [i.step for i in buffer.take(350)] == [0, 1, 2]
    assert [i.step for i in buffer.take(1)] == [3]
    assert len(buffer) == 6 and buffer.nbytes == 600


def test_full_batch_wakes_the_shipper():
    """Crossing max_batch_bytes notifies a waiting shipper at once, not at the next flush interval."""
    buffer = RecordBuffer(max_bytes=10_000, batch_bytes=300, policy="drop_oldest", block_timeout_s=0)
    woke = threading.Event()

    def shipper():
        with buffer.ready:
            if buffer.ready.wait(5.0):
                woke.set()

    thread = threading.Thread(target=shipper)
    thread.start()
    time.sleep(0.1)
    for n in range(3):
        buffer.put(_item(n))
    thread.join()
    assert woke.is_set() and buffer.due(flush_interval_s=60) == 0.0


def test_block_waits_up_to_the_deadline_then_drops():
    """Under "block" a full buffer makes put() wait for room up to the deadline, then drop the oldest."""
    buffer = RecordBuffer(max_bytes=300, batch_bytes=300, policy="block", block_timeout_s=0.2)
    for n in range(3):
        buffer.put(_item(n))
    started = time.monotonic()
    buffer.put(_item(3))
    waited = time.monotonic() - started
    assert 0.15 <= waited < 1.0 and buffer.dropped == 1


def test_block_resumes_when_the_shipper_makes_room():
    """Under "block" put() returns as soon as the shipper takes items, and nothing is dropped."""
    buffer = RecordBuffer(max_bytes=300, batch_bytes=300, policy="block", block_timeout_s=5.0)
    for n in range(3):
        buffer.put(_item(n))
    threading.Timer(0.1, lambda: buffer.take(10_000)).start()
    started = time.monotonic()
    buffer.put(_item(3))
    assert time.monotonic() - started < 2.0 and buffer.dropped == 0
