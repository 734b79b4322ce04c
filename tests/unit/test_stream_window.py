"""The lane's window without Ray: the memory bound, the spool's read-back, and the two watermarks (handed, stored)."""

from __future__ import annotations

from tracklane.core.report import LaneReport
from tracklane.shipping.stream_window import Entry, StreamWindow
from tracklane.spool.segments import SpoolEntry


def _entry(seq: int, nbytes: int = 10, *, ref: object = "bytes", spooled: bool = True) -> Entry:
    return Entry(seq=seq, ref=ref, nbytes=nbytes, records=seq, oldest_log_time=0.0, spooled=spooled)


def _window(max_bytes: int = 100, spool: dict[int, object] | None = None) -> tuple[StreamWindow, LaneReport]:
    report = LaneReport(name="t")
    reload = None if spool is None else spool.get
    return StreamWindow(max_bytes, report, reload), report


def _send_all(window: StreamWindow) -> list[int]:
    sent = []
    for entry in window.to_send():
        sent.append(entry.seq)
        window.sent_through(entry.seq)
    return sent


def test_batches_over_the_bound_wait_on_disk_and_are_read_back_in_their_turn():
    """With a spool, what does not fit holds no memory and is read back, in order, when it is sent."""
    window, report = _window(max_bytes=25, spool={3: "from disk"})
    for seq in (1, 2, 3):
        window.offer(_entry(seq))
    assert window.in_memory() == [1, 2] and window.nbytes == 20
    assert _send_all(window) == [1, 2, 3] and window.entry(3).ref == "from disk" and window.nbytes == 30
    assert report.dropped_records == 0


def test_a_batch_the_spool_lost_is_dropped_and_counted_when_its_turn_comes():
    """A batch that waited on disk and is gone from the spool is counted (its records) and named in the report."""
    window, report = _window(max_bytes=10, spool={})
    window.offer(_entry(1))
    window.offer(_entry(2))  # over the bound: disk only, and the spool has nothing
    assert _send_all(window) == [1]
    assert report.dropped_records == 2 and "batch 2 is no longer in the spool" in (report.error or "")


def test_without_a_spool_the_oldest_unsent_batch_is_dropped_to_make_room():
    """No spool: the bound drops the oldest batch not sent yet, never one already sent, and counts it."""
    window, report = _window(max_bytes=30, spool=None)
    for seq in (1, 2, 3):
        window.offer(_entry(seq, spooled=False))
    assert _send_all(window)[:1] == [1]
    window.send_again()
    window.sent_through(1)  # only batch 1 is out
    window.offer(_entry(4, spooled=False))
    assert window.in_memory() == [1, 3, 4] and report.dropped_records == 2  # batch 2 (2 records) went


def test_handed_moves_the_window_and_stored_frees_what_a_restart_would_resend():
    """handed trims the window; a batch handed but not stored is sent again after a restart, until it is stored."""
    window, _ = _window(spool={1: "a", 2: "b", 3: "c"})
    for seq in (1, 2, 3):
        window.offer(_entry(seq))
    _send_all(window)
    window.take(handed=3, stored=1)
    assert (window.handed, window.stored, window.first_pending(stored=False), window.first_pending()) == (3, 1, None, 2)
    window.actor_restarted()
    assert window.handed == 1 and _send_all(window) == [2, 3]
    window.take(handed=3, stored=3)
    assert window.first_pending() is None and window.batches() == 0 and window.settled(3)


def test_handed_never_moves_back_and_stored_never_passes_it():
    """An older answer arriving late moves neither watermark back."""
    window, _ = _window()
    window.take(handed=5, stored=4)
    window.take(handed=2, stored=1)
    assert (window.handed, window.stored, window.sent) == (5, 4, 5)


def test_eviction_loses_only_what_is_on_disk_alone():
    """The spool deleting batches loses those the window holds only there; one in memory stays, not to be spilled."""
    window, report = _window(max_bytes=10, spool={})
    window.offer(_entry(1))
    window.offer(_entry(2))  # disk only
    assert window.evicted({1, 2}) == 2 and report.dropped_records == 2
    assert window.in_memory() == [1] and not window.entry(1).spooled


def test_preloaded_batches_from_an_earlier_process_wait_on_disk_in_order():
    """Recovery puts spooled batches in sequence order, holding no memory, and raises ``offered``."""
    window, _ = _window(spool={})
    window.preload([SpoolEntry(seq=seq, records=1, oldest_log_time=0.0, nbytes=10, segment=1, offset=0) for seq in (4, 2)])
    assert window.offered == 4 and window.nbytes == 0 and window.first_pending() == 2


def test_giving_up_keeps_on_disk_what_the_store_lacks_and_holds_no_memory():
    """give_up keeps every batch its tracker's store lacks, handed or not, on disk only; the stored watermark stays, so
    the spool keeps them; nothing more is sent; a later batch is kept too. Only one that is not on disk is lost."""
    window, report = _window(spool={})
    for seq in (1, 2, 3):
        window.offer(_entry(seq))
    window.offer(_entry(4, spooled=False))  # the disk refused it: memory holds the only copy
    window.take(handed=2, stored=1)
    assert window.give_up() == 4 and report.dropped_records == 4  # batch 4 (4 records), not on disk
    assert window.nbytes == 0 and window.in_memory() == [] and window.stored == 1 and window.first_pending() == 2
    assert window.records() == 2 + 3 and window.batches() == 2 and window.settled(10**9)
    assert list(window.to_send()) == [] and not window.fits(1) and window.has_room(10**12)
    window.offer(_entry(5))
    assert window.records() == 10 and window.in_memory() == [] and window.offered == 5
    window.offer(_entry(6, spooled=False))
    assert report.dropped_records == 10 and window.records() == 10
    assert window.evicted({2}) == 2 and report.dropped_records == 12  # the spool's bound takes one: lost, counted
    assert window.first_pending() == 3


def test_giving_up_without_a_spool_drops_everything_counted():
    """A producer whose disk refused its spool has nothing to keep: every waiting record is dropped and counted."""
    window, report = _window(spool=None)
    for seq in (1, 2):
        window.offer(_entry(seq, spooled=False))
    assert window.give_up() == 3 and report.dropped_records == 3 and window.records() == 0
