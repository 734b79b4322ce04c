"""Metrics reduced across producers: one point per key per step, over every producer that logged that key there.

``log(data, step, reduce="mean")`` (on ``Tracking`` or any ``Producer``) sends its values as contributions
(``records.Reduction``, role ``PART``) to the run's reduce lane only. That lane's sink (workers/sinks/reduce.py)
keeps one ``Reducer``, on disk after every batch, which decides when a step is complete and what its points are.

A step is complete (the lowest open one first, so the points leave in step order) when
  - rank 0 got past it (logged anything at a later step of the trainer), every sender that contributed got past
    it, and every producer name rank 0 handed out (``Tracking.producer``, a ``DECLARE``) has a sender logging on
    the trainer's step and all such senders got past it; a sender rank 0 said ended (``ENDED``: it died or closed)
    is past every step once its last batch arrived. A name with no such sender is waited for ``timeout_s`` from
    its declaration, no longer (a handle given to a process that never logs, or logs only on an axis of its own);
  - or rank 0 is finishing (``FINISH``: every step open then; a resumed run opens new ones after it);
  - or it has been open ``timeout_s`` (a producer that stopped logging without dying).
A contribution to a step already complete is late: counted, never reduced. The reduce judge sends each complete
step's points into every tracker as a sender of its own (workers/sinks/reduce.py), once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

LANE = "reduce"
"""The reduce lane's name (and its backend's): ``trainer.async_log.reductions: true`` adds it to the run."""

OPS = ("mean", "sum", "min", "max", "count")
"""What ``reduce=`` may name, for every key or per key."""

PART, DECLARE, ENDED, FINISH = "part", "declare", "ended", "finish"
"""The roles of a ``Reduction`` record: a producer's contribution, then rank 0's notices to the reducer."""
ROLES = frozenset({PART, DECLARE, ENDED, FINISH})

_NONE = -(2**63)  # "no step yet": below every step


def check_ops(reduce: Any, keys: Iterable[str]) -> tuple[str, dict[str, str]]:
    """``reduce=`` as (the op for every key, the keys with another op); ValueError naming what is wrong."""
    if isinstance(reduce, str):
        if reduce not in OPS:
            raise ValueError(f"reduce={reduce!r}: not one of {', '.join(OPS)}")
        return reduce, {}
    if not isinstance(reduce, Mapping):
        raise ValueError(f"reduce= takes one of {', '.join(OPS)} or a dict key -> op, got {type(reduce).__name__}")
    bad = {str(k): v for k, v in reduce.items() if v not in OPS}
    if bad:
        raise ValueError(f"reduce=: ops {bad} are not among {', '.join(OPS)}")
    missing = sorted(set(keys) - set(map(str, reduce)))
    if missing:
        raise ValueError(f"reduce= names no op for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return "", {str(k): str(v) for k, v in reduce.items()}


def producer_name(sender: str) -> str:
    """A producer's name from its sender id (``<name>#<10 hex>``, shipping/producer_pipeline.py)."""
    return sender.rpartition("#")[0] or sender


class Reducer:
    """The reduce lane's whole state: plain values only (``to_plain``/``from_plain``: msgpack, never pickle)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self.seq: dict[str, int] = {}
        """sender -> its last batch reduced (a batch sent again is skipped: exactly once)."""
        self.reached: dict[str, int] = {}
        """sender -> the latest trainer step it logged anything at."""
        self.contributors: set[str] = set()
        self.declared: dict[str, float] = {}
        """Producer name -> when its DECLARE came (this actor's clock: a new actor waits ``timeout_s`` again)."""
        self.ended: dict[str, int] = {}
        """sender -> its last batch, as rank 0 said when it ended."""
        self.left_out: dict[str, int] = {}
        """Ended sender -> the first complete step it had no part in."""
        self._no_steps_yet()

    def _no_steps_yet(self) -> None:
        """The steps' side of the state, empty: none open, none complete, nothing emitted or refused."""
        self._finishing = False  # a FINISH arrived: the next complete() takes every open step
        self.open: dict[int, dict[str, list]] = {}
        """step -> key -> [op, n, total, lo, hi]."""
        self.opened_at: dict[int, float] = {}  # not saved: a new actor gives every open step its timeout again
        self.done = _NONE
        """Every step up to here is complete."""
        self.emitted = 0
        self.late = 0
        """Values that came for a step already complete (or after the finish): not reduced."""
        self.conflicts = 0
        """Values whose op differed from the op the key's first value at that step named: not reduced."""

    # -- what arrives -------------------------------------------------------------------------------------
    def begin(self, sender: str, seq: int) -> bool:
        """Batch ``seq`` of ``sender`` starts; False if it was reduced already (then skip it whole)."""
        if seq <= self.seq.get(sender, 0):
            return False
        self.seq[sender] = seq
        return True

    def saw(self, sender: str, step: int) -> None:
        """``sender`` logged something at trainer step ``step``."""
        if step > self.reached.get(sender, _NONE):
            self.reached[sender] = step

    def contribute(self, sender: str, step: int, values: Mapping[str, float | int], op: str,
                   ops: Mapping[str, str]) -> None:
        self.saw(sender, step)
        if step <= self.done:
            self.late += len(values)
            return
        self.contributors.add(sender)
        keys = self.open.get(step)
        if keys is None:
            keys = self.open[step] = {}
            self.opened_at[step] = self._clock()
        for key, value in values.items():
            want = ops.get(key, op)
            acc = keys.get(key)
            if acc is None:
                keys[key] = [want, 1, value, value, value]
            elif acc[0] != want:
                self.conflicts += 1
            else:
                acc[1] += 1
                acc[2] += value
                acc[3], acc[4] = _lower(acc[3], value), _higher(acc[4], value)

    def notice(self, role: str, step: int, values: Mapping[str, Any]) -> None:
        """One of rank 0's notices (``values``: producer names for DECLARE, sender -> last batch for ENDED)."""
        if role == DECLARE:
            now = self._clock()
            for name in values:
                self.declared.setdefault(name, now)
        elif role == ENDED:
            for sender, last in values.items():
                self.ended[sender] = int(last)
        elif role == FINISH:
            self._finishing = True

    # -- what leaves --------------------------------------------------------------------------------------
    def complete(self) -> list[tuple[int, dict[str, float | int]]]:
        """The steps complete now, lowest first, with their points."""
        out = []
        now = self._clock()
        while self.open:
            step = min(self.open)
            if not self._ready(step, now):
                break
            points = {key: _result(acc) for key, acc in self.open.pop(step).items()}
            self.opened_at.pop(step, None)
            self.done = step
            self.emitted += 1
            self._note_left_out(step)
            out.append((step, points))
        self._finishing = False
        return out

    def _ready(self, step: int, now: float) -> bool:
        if self._finishing or now - self.opened_at.get(step, now) >= self.timeout_s:
            return True
        if not self._past("", step) or not all(self._past(sender, step) for sender in self.contributors):
            return False
        for name, since in self.declared.items():
            mine = [sender for sender in self.reached if sender and producer_name(sender) == name]
            if not mine and now - since < self.timeout_s:
                return False
            if not all(self._past(sender, step) for sender in mine):
                return False
        return True

    def _past(self, sender: str, step: int) -> bool:
        last = self.ended.get(sender)
        if last is not None and self.seq.get(sender, 0) >= last:
            return True
        return self.reached.get(sender, _NONE) > step

    def _note_left_out(self, step: int) -> None:
        for sender in self.ended:
            if sender not in self.left_out and self.reached.get(sender, _NONE) < step:
                self.left_out[sender] = step

    def figures(self) -> dict[str, Any]:
        """What rank 0's report says of the reductions."""
        return {"emitted": self.emitted, "open": len(self.open), "late": self.late, "conflicts": self.conflicts,
                "left_out": dict(self.left_out)}

    # -- on disk --------------------------------------------------------------------------------------------
    def to_plain(self) -> dict[str, Any]:
        return {"seq": self.seq, "reached": self.reached, "contributors": sorted(self.contributors),
                "declared": sorted(self.declared), "ended": self.ended,
                "open": [[step, keys] for step, keys in self.open.items()], "done": self.done,
                "emitted": self.emitted,
                "late": self.late, "conflicts": self.conflicts, "left_out": self.left_out}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], timeout_s: float,
                   clock: Callable[[], float] = time.monotonic) -> Reducer:
        reducer = cls(timeout_s, clock)
        reducer.seq, reducer.reached = dict(data["seq"]), dict(data["reached"])
        now = clock()
        reducer.contributors, reducer.declared = set(data["contributors"]), dict.fromkeys(data["declared"], now)
        reducer.ended = dict(data["ended"])
        reducer.open = {int(step): keys for step, keys in data["open"]}
        reducer.opened_at = {step: now for step in reducer.open}
        reducer.done = int(data["done"])
        reducer.emitted, reducer.late, reducer.conflicts = int(data["emitted"]), int(data["late"]), int(data["conflicts"])
        reducer.left_out = dict(data["left_out"])
        return reducer


def _result(acc: list) -> float | int:
    op, n, total, lo, hi = acc
    if op == "mean":
        return total / n
    if op == "sum":
        return total
    if op == "min":
        return lo
    if op == "max":
        return hi
    return n  # count


def _lower(a: float, b: float) -> float:
    """min that keeps a NaN (as numpy's does): a NaN among the values makes the min NaN."""
    return a if math.isnan(a) or a <= b else b


def _higher(a: float, b: float) -> float:
    return a if math.isnan(a) or a >= b else b
