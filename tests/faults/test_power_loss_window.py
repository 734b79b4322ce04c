"""What a power loss can take from the spool: at most ``spool_fsync_s`` (plus one shipper round) of batches.

A killed process loses nothing the spool wrote (the page cache keeps it); a lost machine loses what was not
fsynced. The shipper fsyncs the active segment when ``spool_fsync_s`` has passed since the last fsync, at an
append or at its next round (every 0.2 s at most when idle): here every append is followed by an fsync of the
spool within that window, watched by a spy on ``os.fdatasync`` that calls the real one.
"""

from __future__ import annotations

import os
import time

import pytest

from tracklane import Tracking

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

FSYNC_S = 0.3
ROUND_S = 0.2  # the shipper's longest idle wait (shipping/shipper.py _IDLE_WAIT_S)


@pytest.mark.slow
def test_every_spooled_batch_is_fsynced_within_spool_fsync_s(tmp_path, monkeypatch, offline_trackers):
    spool_dir = tmp_path / "spool"
    synced: list[float] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(spool_dir)):
            synced.append(time.monotonic())
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": str(spool_dir), "spool_fsync_s": FSYNC_S,
                                                           "flush_interval_s": 0.05}}}
    tracking = Tracking("power", "loss", ["file"], config=config)
    appended: list[float] = []
    for step in range(60):
        tracking.log({"loss": float(step)}, step=step)
        appended.append(time.monotonic())
        time.sleep(0.02)
    time.sleep(FSYNC_S + ROUND_S + 0.5)
    report = tracking.finish()
    assert report.complete, report.summary()
    assert synced, "the spool was never fsynced"
    # A record logged at time t is in a batch by t + flush_interval (+ a round), on disk then, and fsynced by
    # the next fsync: the gap from any log() to the first fsync after it stays within the window (+ slack).
    slack = 0.05 + ROUND_S + 0.5
    for at in appended:
        after = [s for s in synced if s >= at]
        assert after and after[0] - at <= FSYNC_S + ROUND_S + slack, (at, synced)
