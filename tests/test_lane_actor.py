"""The lane actor's bookkeeping, run in-process: in-order apply, no duplicates, corrupt batches counted."""

from __future__ import annotations

import time

from pipeline.codec import decode_batch, encode_batch
from pipeline.records import Batch, Metrics, RunSpec
from workers.lane_actor import LaneActor, opening_bytes


def _blob(seq: int, steps: range, only=None) -> bytes:
    records = [Metrics(step=s, time=time.time(), values={"x": float(s)}, only=only) for s in steps]
    return encode_batch(Batch(seq=seq, created=time.time(), records=records))


def _actor(tmp_path, **trainer) -> LaneActor:
    run = RunSpec(project="p", experiment="e", run_id="r1")
    from workers.memory_sink import MemorySink

    settings = MemorySink.resolve(run, {}, {"memory_sink": trainer})
    return LaneActor("memory", opening_bytes("memory", run, settings, str(tmp_path), retries=1, backoff_s=0.0))


def _steps(actor: LaneActor) -> list[int]:
    return [r.step for r in decode_batch(actor.close(0)["snapshot"]).records]


def test_applies_in_order_and_skips_resends(tmp_path):
    """A re-sent batch is acknowledged without being written twice; a batch after a gap is refused."""
    actor = _actor(tmp_path)
    assert actor.apply(1, 0, _blob(1, range(0, 3)))["applied"] == 1
    assert actor.apply(1, 0, _blob(1, range(0, 3)))["duplicate"] is True
    gap = actor.apply(3, 2, _blob(3, range(6, 9)))
    assert gap["gap"] is True and gap["applied"] == 1
    assert actor.apply(2, 1, _blob(2, range(3, 6)))["applied"] == 2
    assert actor.apply(3, 2, _blob(3, range(6, 9)))["applied"] == 3
    assert _steps(actor) == list(range(9))


def test_restart_resumes_from_saved_state(tmp_path):
    """A new actor on the same state folder knows what was applied and skips it."""
    first = _actor(tmp_path)
    first.apply(1, 0, _blob(1, range(0, 2)))
    second = _actor(tmp_path)
    assert second.ready()["applied"] == 1
    assert second.apply(1, 0, _blob(1, range(0, 2)))["duplicate"] is True
    assert second.apply(2, 1, _blob(2, range(2, 4)))["applied"] == 2
    assert _steps(second) == [2, 3]


def test_corrupt_batch_is_counted_and_skipped(tmp_path):
    """A corrupt batch is acknowledged as failed (so the lane moves on) and reported."""
    actor = _actor(tmp_path)
    result = actor.apply(1, 0, b"\x28\xb5\x2f\xfd garbage")
    assert result["corrupt"] is True and result["failed_batches"] == 1 and "corrupt batch 1" in result["error"]
    assert actor.apply(2, 1, _blob(2, range(2)))["applied"] == 2
    assert _steps(actor) == [0, 1]


def test_failing_tracker_is_retried_then_counted(tmp_path):
    """A tracker that fails every write is retried, then its records are counted as failed, not lost silently."""
    actor = _actor(tmp_path, fail_writes=True)
    result = actor.apply(1, 0, _blob(1, range(5)))
    assert result["applied"] == 1 and result["failed_records"] == 5
    assert "told to fail" in result["error"]


def test_failed_open_is_retried_on_next_batch(tmp_path):
    """A tracker that cannot open is reported by ready() and does not crash the actor."""
    actor = _actor(tmp_path, fail_open=True)
    info = actor.ready()
    assert info["opened"] is False and "fail on open" in info["error"]
    assert actor.apply(1, 0, _blob(1, range(3)))["failed_records"] == 3


def test_records_for_other_backends_are_skipped(tmp_path):
    """A record logged with backend=[...] reaches only the lanes it names."""
    actor = _actor(tmp_path)
    actor.apply(1, 0, _blob(1, range(2), only=["wandb"]))
    actor.apply(2, 1, _blob(2, range(2, 4), only=["memory"]))
    assert _steps(actor) == [2, 3]


def test_lane_gives_up_after_repeated_actor_errors(ray_session):
    """A lane whose actor raises on every call re-sends a few times, then counts its records as dropped."""
    import ray

    from pipeline.lane import Entry, Lane

    @ray.remote(num_cpus=0)
    class Broken:
        def ready(self):
            return {"opened": True, "error": None, "applied": 0}

        def apply(self, seq, prev, blob):
            raise OSError("disk full")

    lane = Lane("broken", Broken.remote(), max_bytes=1 << 20, max_inflight=1, dead_after_s=10, startup_timeout_s=30)
    lane.offer(Entry(seq=1, ref=ray.put(b"x"), nbytes=1, records=3, oldest_log_time=time.time()))
    deadline = time.monotonic() + 30
    while not lane.dead and time.monotonic() < deadline:
        lane.pump()
        time.sleep(0.05)
    report = lane.snapshot()
    assert lane.dead and report.dropped_records == 3 and "disk full" in report.error
