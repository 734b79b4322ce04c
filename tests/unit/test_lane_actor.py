"""The lane actor's bookkeeping, run in-process: in-order apply, no duplicates, corrupt batches counted."""

from __future__ import annotations

import time

from tracklane.core.acks import Ack
from tracklane.core.records import Batch, Metrics, RunSpec
from tracklane.shipping.lane_actor import LaneActor
from tracklane.wire.ack import unpack_ack
from tracklane.wire.batch import encode_batch
from tracklane.wire.opening import LaneOpening
from tracklane.workers.testing.memory import memory_records

RUN = RunSpec(project="p", experiment="e", run_id="lane-actor-test")


def _blob(seq: int, steps: range, only=None) -> bytes:
    records = [Metrics(step=s, time=time.time(), values={"x": float(s)}, only=only) for s in steps]
    return encode_batch(Batch(seq=seq, created=time.time(), records=records))


def _actor(tmp_path, **trainer) -> LaneActor:
    from tracklane.workers.sinks.memory import MemorySink

    settings = MemorySink.resolve(RUN, {}, {"memory_sink": {"dir": str(tmp_path / "memory"), **trainer}})
    opening = LaneOpening(backend="memory", run=RUN, settings=settings, state_dir=str(tmp_path),
                          sink_retries=1, retry_backoff_s=0.0)
    return LaneActor("memory", opening.pack())


def _apply(actor: LaneActor, seq: int, prev: int, blob: bytes) -> Ack:
    return unpack_ack(actor.apply(seq, prev, blob))


def _steps(actor: LaneActor, tmp_path) -> list[int]:
    actor.close(0)
    return [r.step for r in memory_records(RUN.run_id, str(tmp_path / "memory"))]


def test_applies_in_order_and_skips_resends(tmp_path):
    """A re-sent batch is acknowledged without being written twice; a batch after a gap is refused."""
    actor = _actor(tmp_path)
    assert _apply(actor, 1, 0, _blob(1, range(0, 3))).handed == 1
    resent = _apply(actor, 1, 0, _blob(1, range(0, 3)))
    assert resent.handed == 1 and not resent.gap
    gap = _apply(actor, 3, 2, _blob(3, range(6, 9)))
    assert gap.gap is True and gap.handed == 1
    assert _apply(actor, 2, 1, _blob(2, range(3, 6))).handed == 2
    assert _apply(actor, 3, 2, _blob(3, range(6, 9))).handed == 3
    assert _steps(actor, tmp_path) == list(range(9))


def test_restart_resumes_from_saved_state(tmp_path):
    """A new actor on the same state folder knows what was applied and skips it."""
    first = _actor(tmp_path)
    first.apply(1, 0, _blob(1, range(0, 2)))
    second = _actor(tmp_path)
    assert unpack_ack(second.ready()).handed == 1
    assert _apply(second, 1, 0, _blob(1, range(0, 2))).handed == 1  # skipped, not written again
    assert _apply(second, 2, 1, _blob(2, range(2, 4))).handed == 2
    assert _steps(second, tmp_path) == [0, 1, 2, 3]  # one sink file across both actors, no duplicate


def test_corrupt_batch_is_counted_and_skipped(tmp_path):
    """A corrupt batch is acknowledged as failed (so the lane moves on) and reported."""
    actor = _actor(tmp_path)
    result = _apply(actor, 1, 0, b"\x28\xb5\x2f\xfd garbage")
    assert result.handed == 1 and "corrupt batch 1" in result.error
    assert _apply(actor, 2, 1, _blob(2, range(2))).handed == 2
    assert _steps(actor, tmp_path) == [0, 1]


def test_failing_tracker_is_retried_then_counted(tmp_path):
    """A tracker that fails every write is retried, then its records are counted as failed, not lost silently."""
    actor = _actor(tmp_path, fail_writes=True)
    result = _apply(actor, 1, 0, _blob(1, range(5)))
    assert result.handed == 1 and result.counts.failed_records == 5
    assert "told to fail" in result.error


def test_failed_open_is_retried_on_next_batch(tmp_path):
    """A tracker that cannot open is reported by ready() and does not crash the actor."""
    actor = _actor(tmp_path, fail_open=True)
    info = unpack_ack(actor.ready())
    assert info.opened is False and "fail on open" in info.error
    assert _apply(actor, 1, 0, _blob(1, range(3))).counts.failed_records == 3


def test_records_for_other_backends_are_skipped(tmp_path):
    """A record logged with backend=[...] reaches only the lanes it names."""
    actor = _actor(tmp_path)
    actor.apply(1, 0, _blob(1, range(2), only=["wandb"]))
    actor.apply(2, 1, _blob(2, range(2, 4), only=["memory"]))
    assert _steps(actor, tmp_path) == [2, 3]


def test_restarted_actor_continues_its_counts(tmp_path):
    """Failures counted before a restart are kept in the lane state: the new actor's counts continue them."""
    first = _actor(tmp_path, fail_writes=True)
    first.apply(1, 0, _blob(1, range(4)))
    second = _actor(tmp_path, fail_writes=True)
    assert unpack_ack(second.ready()).counts.failed_records == 4
    assert _apply(second, 2, 1, _blob(2, range(4, 6))).counts.failed_records == 6


def test_a_lagging_store_gives_two_watermarks_and_a_successor_starts_from_the_durable_one(tmp_path):
    """With a store two writes behind (as wandb-core's), answers say applied k and durable k-2, the saved state
    keeps the durable one, a successor re-takes the batches after it, and a clean close makes everything durable."""
    actor = _actor(tmp_path, store_lag=2)
    acks = [_apply(actor, seq, seq - 1, _blob(seq, range(seq, seq + 1))) for seq in range(1, 5)]
    assert [(a.handed, a.stored_seq) for a in acks] == [(1, 0), (2, 0), (3, 1), (4, 2)]
    assert _apply(actor, 4, 3, _blob(4, range(4, 5))).handed == 4  # a re-send of what it was handed: skipped

    successor = _actor(tmp_path, store_lag=2)
    assert unpack_ack(successor.ready()).handed == 2  # what the store held; batches 3 and 4 come again
    assert _apply(successor, 4, 3, _blob(4, range(4, 5))).gap
    assert (_apply(successor, 3, 2, _blob(3, range(3, 4))).handed, _apply(successor, 4, 3, _blob(4, range(4, 5))).handed) \
        == (3, 4)
    closed = unpack_ack(successor.close(0))
    assert (closed.handed, closed.stored_seq) == (4, 4)
    assert unpack_ack(_actor(tmp_path, store_lag=2).ready()).handed == 4
