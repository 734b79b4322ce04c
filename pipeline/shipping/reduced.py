"""Rank 0's end of the reductions (core/reduction.py): the reduce lane's points into every tracker, each step once.

The reduce lane answers rank 0 with the steps it completed (``Ack.reduced``). Each new step becomes a plain
``Metrics`` record in rank 0's own stream, so it is spooled and reaches every tracker exactly once like anything
rank 0 logs, followed by a ``CONFIRM`` for the reducer: once that reaches it, it forgets the step's points. Until
then a new reduce actor sends them again; a step rank 0 holds already (in this process, or still in its spool
from a process before a resume) is not logged twice. Rank 0 also tells the reducer which producers ended (their
spool was taken over, or they closed) and when the run finishes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from tracklane.core.errors import CodecError
from tracklane.core.records import Metrics, Record, Reduction
from tracklane.core.reduction import CONFIRM, ENDED, FINISH, LANE
from tracklane.spool.segments import Spool
from tracklane.wire.batch import decode_batch

log = logging.getLogger("tracklane")


class ReducedPoints:
    def __init__(self, logged: Iterable[int] = ()) -> None:
        """``logged``: steps whose points rank 0 holds already (``confirmed_in``)."""
        self._logged = set(logged)
        self._ended: set[str] = set()
        self._out: list[Record] = []
        self.figures: dict[str, Any] = {}
        """The reducer's figures as of its latest answer (core/reduction.py ``Reducer.figures``)."""
        self.repeats = 0
        """Points a reduce actor sent again that rank 0 held already (not logged twice)."""

    def take(self, reduced: dict[str, Any]) -> None:
        """The reduce lane's answer (``Stream``'s ``on_reduced``, on the shipper thread)."""
        self.figures = reduced.get("figures") or self.figures
        now = time.time()
        for step, points in reduced.get("points", ()):
            if step in self._logged:
                self.repeats += 1
                continue
            self._logged.add(step)
            self._out.append(Metrics(step=step, values=points, time=now))
            self._out.append(Reduction(step=step, time=now, role=CONFIRM, only=[LANE]))

    def ended(self, sender: str, last_seq: int) -> None:
        """Producer ``sender`` will send nothing after its batch ``last_seq`` (it died or closed)."""
        if sender not in self._ended:
            self._ended.add(sender)
            self._out.append(Reduction(step=0, time=time.time(), role=ENDED, values={sender: last_seq}, only=[LANE]))

    def finish(self) -> Reduction:
        """The notice that completes every open step: sent once every producer's last batch is in the lanes."""
        return Reduction(step=0, time=time.time(), role=FINISH, only=[LANE])

    @property
    def unlogged(self) -> int:
        """Points taken and not yet sent on (at a report: they came after the trackers closed; the reducer keeps
        them unconfirmed, so a resumed run logs them)."""
        return sum(1 for record in self._out if isinstance(record, Metrics))

    def drain(self) -> list[Record]:
        """What to send next, in order (the shipper sends it as one batch)."""
        out, self._out = self._out, []
        return out


def confirmed_in(spool: Spool, seqs: Iterable[int]) -> set[int]:
    """The steps rank 0 confirmed in the spooled batches ``seqs`` (those the reduce lane had not yet stored
    before a resume): the points are in those batches, so a reduce actor sending them again is not logged twice."""
    steps: set[int] = set()
    for seq in seqs:
        blob = spool.read(seq)
        if blob is None:
            continue
        try:
            records = decode_batch(blob).records
        except CodecError as exc:
            log.warning("tracklane: spooled batch %d cannot be read for its reduced steps (%s)", seq, exc)
            continue
        steps.update(r.step for r in records if isinstance(r, Reduction) and r.role == CONFIRM)
    return steps
