"""The reducer alone (core/reduction.py): each op's result, when a step is complete, exactly once, on disk."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracklane.core.reduction import DECLARE, ENDED, FINISH, OPS, Reducer, check_ops

SENDERS = ["w0#aaaaaaaaaa", "w1#bbbbbbbbbb", "w2#cccccccccc"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _expected(op: str, values: list[float]) -> float:
    return {"mean": sum(values) / len(values), "sum": sum(values), "min": min(values), "max": max(values),
            "count": len(values)}[op]


def _feed(reducer: Reducer, sender: str, seq: int, step: int, values: dict, op: str = "mean") -> None:
    assert reducer.begin(sender, seq)
    reducer.contribute(sender, step, values, op, {})


def test_each_op_over_three_producers_once_all_got_past_the_step():
    reducer = Reducer(timeout_s=60)
    reducer.notice(DECLARE, 0, {"w0": 0, "w1": 0, "w2": 0})
    for i, sender in enumerate(SENDERS):
        assert reducer.begin(sender, 1)
        reducer.contribute(sender, 5, {op: float(i + 1) * (2 if op == "sum" else 1) for op in OPS}, "", {op: op for op in OPS})
    reducer.saw("", 6)
    assert reducer.complete() == []  # no producer got past step 5 yet
    for sender in SENDERS[:2]:
        reducer.saw(sender, 6)
    assert reducer.complete() == []  # w2 still at step 5
    reducer.saw(SENDERS[2], 7)
    [(step, points)] = reducer.complete()
    assert step == 5
    assert points == {"mean": 2.0, "sum": 12.0, "min": 1.0, "max": 3.0, "count": 3}
    assert reducer.complete() == [] and reducer.figures()["emitted"] == 1  # emitted once


def test_rank0_and_declared_names_hold_a_step_until_they_got_past_it():
    reducer = Reducer(timeout_s=60)
    reducer.notice(DECLARE, 0, {"w0": 0, "w1": 0})
    _feed(reducer, SENDERS[0], 1, 0, {"x": 1.0})
    reducer.saw(SENDERS[0], 1)
    assert reducer.complete() == []  # rank 0 at no step, w1 never seen
    reducer.saw("", 1)
    assert reducer.complete() == []  # w1 declared, not seen
    assert reducer.begin(SENDERS[1], 1)
    reducer.saw(SENDERS[1], 0)
    assert reducer.complete() == []  # w1 seen, not past step 0
    reducer.saw(SENDERS[1], 1)
    assert reducer.complete() == [(0, {"x": 1.0})]


def test_a_declared_name_that_never_logs_on_the_trainers_step_is_waited_for_only_the_timeout():
    """A handle given to a process that never logs (or logs only on an axis of its own) holds steps back for
    ``timeout_s`` from its declaration, once, not every step."""
    clock = Clock()
    reducer = Reducer(timeout_s=5, clock=clock)
    reducer.notice(DECLARE, 0, {"w0": 0, "idle": 0, "axis": 0})
    assert reducer.begin("axis#0000000000", 1)  # a batch of records on its own axis only: never saw() a step
    for step in range(3):
        clock.now = step * 2.0
        _feed(reducer, SENDERS[0], step + 1, step, {"x": 1.0})
        reducer.saw("", step + 1)
        reducer.saw(SENDERS[0], step + 1)
    assert reducer.complete() == []  # 4 s after the declaration
    clock.now = 5.0
    assert [step for step, _ in reducer.complete()] == [0, 1, 2]  # step 2 opened 1 s ago: past by all who log
    _feed(reducer, SENDERS[0], 4, 3, {"x": 1.0})
    assert reducer.complete() == []
    reducer.saw(SENDERS[0], 4)
    reducer.saw("", 4)
    assert [step for step, _ in reducer.complete()] == [3]  # the two names no longer hold anything back


def test_an_ended_producer_is_left_out_once_its_last_batch_arrived_and_the_step_is_reported():
    reducer = Reducer(timeout_s=60)
    reducer.notice(DECLARE, 0, {"w0": 0, "w1": 0})
    for step in range(3):
        _feed(reducer, SENDERS[0], step + 1, step, {"x": 1.0})
        _feed(reducer, SENDERS[1], step + 1, step, {"x": 3.0})
    reducer.saw("", 10)
    reducer.saw(SENDERS[0], 10)
    _feed(reducer, SENDERS[0], 4, 3, {"x": 1.0})
    assert [s for s, _ in reducer.complete()] == [0, 1]  # w1 reached step 2 only
    reducer.notice(ENDED, 0, {SENDERS[1]: 4})  # its batch 4 is still on its way
    assert reducer.complete() == []
    _feed(reducer, SENDERS[1], 4, 3, {"x": 3.0})  # its last batch: step 3
    assert reducer.complete() == [(2, {"x": 2.0}), (3, {"x": 2.0})]
    _feed(reducer, SENDERS[0], 5, 4, {"x": 1.0})
    reducer.saw(SENDERS[0], 11)
    assert reducer.complete() == [(4, {"x": 1.0})]
    assert reducer.left_out == {SENDERS[1]: 4}


def test_late_values_conflicting_ops_and_batches_sent_again_never_count():
    reducer = Reducer(timeout_s=60)
    _feed(reducer, "", 1, 0, {"x": 1.0})
    assert not reducer.begin("", 1)  # sent again: skipped whole
    _feed(reducer, SENDERS[0], 1, 0, {"x": 5.0}, op="max")  # another op for x at step 0
    reducer.saw("", 1)
    reducer.saw(SENDERS[0], 1)
    assert reducer.complete() == [(0, {"x": 1.0})]
    _feed(reducer, SENDERS[1], 1, 0, {"x": 9.0, "y": 1.0})  # step 0 is done
    assert (reducer.conflicts, reducer.late) == (1, 2)


def test_a_timeout_and_the_finish_complete_what_waits():
    clock = Clock()
    reducer = Reducer(timeout_s=5, clock=clock)
    reducer.notice(DECLARE, 0, {"never": 0})
    _feed(reducer, "", 1, 0, {"x": 1.0})
    reducer.saw("", 3)
    assert reducer.complete() == []
    clock.now = 5.0
    assert reducer.complete() == [(0, {"x": 1.0})]
    _feed(reducer, "", 2, 1, {"x": 2.0})
    _feed(reducer, "", 3, 2, {"x": 3.0})
    reducer.notice(FINISH, 0, {})
    assert reducer.complete() == [(1, {"x": 2.0}), (2, {"x": 3.0})]
    _feed(reducer, "", 4, 7, {"x": 3.0})  # after the finish: a new step, open (a resumed run goes on)
    assert reducer.open and reducer.complete() == []


def test_nan_makes_mean_sum_min_and_max_nan():
    reducer = Reducer(timeout_s=60)
    reducer.contribute("", 0, {op: 1.0 for op in OPS}, "", {op: op for op in OPS})
    reducer.contribute("", 0, {op: math.nan for op in OPS}, "", {op: op for op in OPS})
    reducer.notice(FINISH, 0, {})
    [(_, points)] = reducer.complete()
    assert points["count"] == 2 and all(math.isnan(points[op]) for op in ("mean", "sum", "min", "max"))


def test_the_state_survives_msgpack_and_goes_on_where_it_stood():
    reducer = Reducer(timeout_s=60)
    reducer.notice(DECLARE, 0, {"w0": 0})
    _feed(reducer, SENDERS[0], 3, 4, {"x": 2.0})
    reducer.saw("", 9)
    reducer.notice(FINISH, 0, {})
    reducer.complete()
    _feed(reducer, SENDERS[0], 4, 5, {"x": 4.0})
    again = Reducer.from_plain(msgpack.unpackb(msgpack.packb(reducer.to_plain()), raw=False, strict_map_key=False), 60)
    assert again.to_plain() == reducer.to_plain()
    assert not again.begin(SENDERS[0], 4)
    assert again.done == 4 and again.figures()["emitted"] == 1


def test_reduce_names_ops_or_says_what_is_wrong():
    assert check_ops("sum", ["a"]) == ("sum", {})
    assert check_ops({"a": "min", "b": "count"}, ["a", "b"]) == ("", {"a": "min", "b": "count"})
    for bad, why in (("median", "not one of"), ({"a": "avg"}, "not among"), ({"a": "min"}, "no op for"),
                     (3, "takes one of")):
        with pytest.raises(ValueError, match=why):
            check_ops(bad, ["a", "b"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.floats(-1e6, 1e6)), min_size=1, max_size=60),
       st.randoms(use_true_random=False))
def test_any_arrival_order_gives_each_op_over_every_value(contributions, rng):
    """Each sender's batches in its own order, the senders interleaved at random: the points are each op over
    every value, each step once, in step order."""
    per_sender: dict[int, list[tuple[int, float]]] = {}
    for sender, step, value in contributions:
        per_sender.setdefault(sender, []).append((step, value))
    for rows in per_sender.values():
        rows.sort(key=lambda row: row[0])  # a producer logs its steps in order
    queues = {f"p{s}#0000000000": rows for s, rows in per_sender.items()}
    reducer = Reducer(timeout_s=1e9)
    reducer.notice(DECLARE, 0, {f"p{s}": 0 for s in per_sender})
    seqs = dict.fromkeys(queues, 0)
    emitted = []
    while any(queues.values()):
        sender = rng.choice([s for s, rows in queues.items() if rows])
        step, value = queues[sender].pop(0)
        seqs[sender] += 1
        assert reducer.begin(sender, seqs[sender])
        reducer.contribute(sender, step, {op: value for op in OPS}, "", {op: op for op in OPS})
        reducer.saw("", 99)
        emitted += reducer.complete()
    reducer.notice(FINISH, 0, {})
    emitted += reducer.complete()
    steps = sorted({step for _, step, _ in contributions})
    assert [step for step, _ in emitted] == steps
    for step, points in emitted:
        values = [value for _, s, value in contributions if s == step]
        for op in OPS:
            assert points[op] == pytest.approx(_expected(op, values), rel=1e-9, abs=1e-6)
    assert reducer.late == 0
