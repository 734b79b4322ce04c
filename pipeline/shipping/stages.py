"""What the ship loop drives besides its lanes: each feature a ``Stage`` with one small protocol.

The shipper (shipper.py) runs the same loop on rank 0 and in a producer; what differs is the stages it is handed
(async_pipeline.py, producer_pipeline.py). Each round the loop pumps its lanes, then every stage's ``round``; it
wakes for any Ray answer a stage awaits (``waitables``); a flush or close passes only once every stage is
``settled``; a closing barrier's answer ``close``s each; every report takes each stage's figures (``report``).

    ProducersStage   rank 0: its producers and judges (hub.py); a close waits for what they handed the lanes
    OrphansStage     rank 0: the spools of producers that died (orphans.py), delivered to the lanes
    EndedStage       rank 0 with a reduce judge: the producers that ended, told to it (it stops waiting for them)
    RunRulesStage    rank 0 with a health judge: its own rules (the trainer's pace, the lanes), alerts sent as its own
    StoredCopiesStage  rank 0: its copy of each lane's state in the spool (spool/lane_state.py)
    ProgressStage    a producer: its figures told to the hub after each round
    DeadLanesStage   every shipper: a lane that gave up is told to the other trackers
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from tracklane.core.alerts import Alerts
from tracklane.core.health_rules import LaneHealth, RunRules
from tracklane.core.records import Record, Reduction, Text
from tracklane.core.reduction import ENDED
from tracklane.core.report import PipelineReport
from tracklane.shipping.barrier import ANSWER_S, Barrier, producers_settled
from tracklane.shipping.hub import HubWatch
from tracklane.shipping.lane import LaneStreams, by_sender, lane_dead, lane_down
from tracklane.shipping.orphans import Orphans
from tracklane.spool.lane_state import StoredCopies
from tracklane.spool.segments import SpoolEntry

if TYPE_CHECKING:
    from tracklane.shipping.lane import Lanes

log = logging.getLogger("tracklane")


class Loop(Protocol):
    """What a stage may ask of the shipper's loop."""

    @property
    def lanes(self) -> Lanes: ...

    @property
    def closing(self) -> bool:
        """The trackers are being closed: nothing more is shipped."""

    @property
    def seq(self) -> int:
        """The last batch handed to the lanes."""

    @property
    def last_step(self) -> int:
        """The trainer's latest step, as the records shipped said."""

    def send(self, records: list[Record]) -> None:
        """One batch of ``records`` to the spool and every lane it is for."""


class Stage:
    """The protocol, each step doing nothing by default: a stage overrides what it takes part in."""

    def waitables(self) -> list[Any]:
        """Ray answers the loop should wake for."""
        return []

    def round(self, loop: Loop) -> None:
        """After the lanes were pumped, every round (on the shipper thread; never blocks)."""

    def settled(self, barrier: Barrier, loop: Loop) -> bool:
        """Whether ``barrier`` may pass as far as this stage is concerned."""
        return True

    def close(self, barrier: Barrier) -> None:
        """A closing barrier is being answered: the trackers are closed."""

    def report(self, report: PipelineReport, barrier: Barrier, loop: Loop) -> None:
        """Add this stage's figures to ``report``."""

    def answered(self, loop: Loop) -> None:
        """A barrier was answered."""


class ProducersStage(Stage):
    """Rank 0's producers, once it made one (``watch``): a close waits for what they handed the lanes."""

    def __init__(self) -> None:
        self.hub: HubWatch | None = None

    def watch(self, hub: Any) -> None:
        self.hub = HubWatch(hub)

    def waitables(self) -> list[Any]:
        return self.hub.waitables() if self.hub is not None else []

    def settled(self, barrier: Barrier, loop: Loop) -> bool:
        return producers_settled(barrier, self.hub, loop.lanes)

    def report(self, report: PipelineReport, barrier: Barrier, loop: Loop) -> None:
        if self.hub is not None:
            wait = max(0.1, min(2.0, barrier.deadline + ANSWER_S / 2 - time.monotonic()))  # finish's deadline holds
            report.producers = self.hub.reports(loop.lanes, final=barrier.closing, timeout=wait)
            report.take_judged(self.hub.judged(), loop.lanes)


class OrphansStage(Stage):
    """Rank 0: the spools of producers that died, delivered to the lanes; a close waits for them."""

    def __init__(self, orphans: Orphans) -> None:
        self._orphans = orphans

    def waitables(self) -> list[Any]:
        return self._orphans.waitables()

    def round(self, loop: Loop) -> None:
        self._orphans.pump()

    def settled(self, barrier: Barrier, loop: Loop) -> bool:
        return not barrier.closing or self._orphans.settled()

    def close(self, barrier: Barrier) -> None:
        self._orphans.close()

    def report(self, report: PipelineReport, barrier: Barrier, loop: Loop) -> None:
        report.producers = self._orphans.merged(report.producers)


class EndedStage(Stage):
    """Rank 0 with a reduce judge: each producer that ended (it closed, or died: its spool found by orphans.py),
    told to the judge with its last batch, so no step waits for it any longer."""

    def __init__(self, producers: ProducersStage, lane: str) -> None:
        """``lane``: the reduce judge's."""
        self._producers, self._lane = producers, lane
        self._told: set[str] = set()
        self._out: list[Record] = []
        self._next_hub_look = 0.0

    def gone(self, sender: str, spooled: list[SpoolEntry]) -> None:
        """A producer found gone, with what its spool still holds: its last batch for the judge is the last of them
        it was in (the spool forgot those the judge stored)."""
        self.ended(sender, max((e.seq for e in spooled if not e.bulk and (e.audience is None or self._lane in
                                                                          e.audience)), default=0))

    def ended(self, sender: str, last_seq: int) -> None:
        if sender not in self._told:
            self._told.add(sender)
            self._out.append(Reduction(step=0, time=time.time(), role=ENDED, values={sender: last_seq}))

    def round(self, loop: Loop) -> None:
        now = time.monotonic()
        hub = self._producers.hub
        if hub is not None and now >= self._next_hub_look:
            self._next_hub_look = now + 1.0
            for sender, last in hub.closed(self._lane).items():
                self.ended(sender, last)
        if self._out and not loop.closing:
            records, self._out = self._out, []
            loop.send(records)


class RunRulesStage(Stage):
    """Rank 0 with a health judge: the rules only rank 0 can judge (the trainer's pace, the lanes), looked at every
    round; what fires goes into every tracker as rank 0's own records (core/alerts.py)."""

    def __init__(self, rules: RunRules) -> None:
        self._rules = rules
        self._alerts = Alerts()

    def round(self, loop: Loop) -> None:
        if loop.closing:
            return
        lanes = {name: _lane_health(lane) for name, lane in loop.lanes.items()}  # O(lanes) a round: cheap
        records = self._alerts.records(self._rules.look(time.monotonic(), loop.last_step if loop.seq else None, lanes),
                                       time.time())
        if records:
            loop.send(records)

    def report(self, report: PipelineReport, barrier: Barrier, loop: Loop) -> None:
        report.alerts = report.alerts + self._alerts.lines()


def _lane_health(lane: LaneStreams) -> LaneHealth:
    """What rank 0's rules look at in one lane."""
    down_s, why = lane_down(lane)
    return LaneHealth(down_s=down_s, lag_s=lane[0].window.lag_s(), down=why)


class StoredCopiesStage(Stage):
    """Rank 0's copy of each lane's state in its spool, for lanes whose own is on another node's disk."""

    def __init__(self, copies: StoredCopies) -> None:
        self._copies = copies

    def round(self, loop: Loop) -> None:
        for name, lane in loop.lanes.items():
            self._copies.update(name, by_sender(lane, stored=True))


class DeadLanesStage(Stage):
    """Every shipper's: a lane that gave up leaves its last error in every other tracker, as text
    ``error/lane/<name>``."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    def round(self, loop: Loop) -> None:
        records: list[Record] = []
        for name, lane in loop.lanes.items():
            if lane_dead(lane) and name not in self._told:
                self._told.add(name)
                error = lane[0].report.error
                log.warning("tracklane: lane %s gave up: %s; what its tracker lacks stays in the spool for "
                            "`tracklane replay` and the next resume", name, error)
                others = [other for other in loop.lanes if other != name]  # its own gets what it missed, later
                if others:
                    records.append(Text(step=loop.last_step, name=f"error/lane/{name}", time=time.time(),
                                        text=f"tracklane: the {name} lane gave up: {error}", only=others))
        if records and not loop.closing:
            loop.send(records)


class ProgressStage(Stage):
    """A producer: ``tell(loop, force)`` after each round (it tells the hub how far it got) and, forced, after a
    barrier's answer."""

    def __init__(self, tell: Callable[[Any, bool], None]) -> None:
        self._tell = tell

    def round(self, loop: Loop) -> None:
        self._tell(loop, False)

    def answered(self, loop: Loop) -> None:
        self._tell(loop, True)
