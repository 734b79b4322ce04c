"""The producer's buffer: bounded by bytes, overflow counted, the caller never waits past its deadline."""

from __future__ import annotations

import threading
import time

from tracklane.capture.captured import Captured
from tracklane.shipping.buffer import RecordBuffer


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


def _bulk(n: int, size: int = 100) -> Captured:
    return Captured(step=n, payload=([], "rollout/trajectories"), time=time.time(), backend=None, kind="trajectories",
                    size=size)


def test_spill_keeps_everything_while_the_disk_takes_it():
    """Under "spill" (the default) with the spool's disk taking batches, nothing is evicted and put() never waits:
    a dump ten times the bound and the metrics around it all stay for the shipper, in the order of the calls."""
    buffer = RecordBuffer(max_bytes=1000, batch_bytes=500, policy="spill", block_timeout_s=5.0)
    buffer.disk_ok = True
    started = time.monotonic()
    buffer.put(_item(0))
    buffer.put_bulk(_bulk(1, size=10_000))
    for n in range(2, 12):
        buffer.put(_item(n))
    # a put that waited would take block_timeout_s (5 s); half of it leaves a loaded machine its slack
    assert time.monotonic() - started < 2.5 and buffer.dropped == 0 and buffer.nbytes == 11 * 100 + 10_000
    assert [i.step for i in buffer.take(100_000)] == list(range(12)) and buffer.nbytes == 0


def test_without_a_disk_spill_evicts_bulk_and_never_metrics_for_it():
    """With the spool's disk off, "spill" drops like "drop_oldest": bulk first, oldest first, counted; a metric is
    never evicted to make room for bulk, and the bulk item just put stays (at least one)."""
    buffer = RecordBuffer(max_bytes=1000, batch_bytes=500, policy="spill", block_timeout_s=0)
    for n in range(5):
        buffer.put(_item(n))  # 500 bytes of metrics
    buffer.put_bulk(_bulk(5, size=400))
    buffer.put_bulk(_bulk(6, size=400))  # over: bulk 5 goes
    assert (buffer.dropped, buffer.dropped_bulk) == (1, 1)
    buffer.put_bulk(_bulk(7, size=2000))  # over by itself: 6 goes, no metric does
    assert (buffer.dropped, buffer.dropped_bulk, len(buffer)) == (2, 2, 6)
    buffer.put(_item(8))  # a metric may evict bulk ...
    assert buffer.dropped_bulk == 3 and [i.step for i in buffer._items] == [0, 1, 2, 3, 4, 8]
    for n in range(9, 20):
        buffer.put(_item(n))  # ... and, with no bulk left, the oldest metrics
    assert buffer.nbytes <= 1000 and [i.step for i in buffer.take(10_000)] == list(range(10, 20))


def test_drop_oldest_evicts_bulk_before_metrics():
    """Under "drop_oldest" too, a full buffer drops the oldest bulk item before any metric."""
    buffer = RecordBuffer(max_bytes=1000, batch_bytes=500, policy="drop_oldest", block_timeout_s=0)
    buffer.put_bulk(_bulk(0, size=600))
    for n in range(1, 6):
        buffer.put(_item(n))
    assert (buffer.dropped, buffer.dropped_bulk) == (1, 1)
    assert [i.step for i in buffer.take(10_000)] == [1, 2, 3, 4, 5]
