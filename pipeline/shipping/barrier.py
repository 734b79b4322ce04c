"""A ``flush()`` or ``finish()`` waiting on the shipper thread: the barrier and the phases it goes through.

The caller posts a barrier and waits on ``done``; the shipper thread moves it on a phase at a time
(``Barrier.advance``), asking the shipper (``BarrierHost``) what it alone knows:

    SHIP            what was logged before the request goes out first (a dump: a batch a round); a ``keep``
                    barrier (a judge's: it waits for its spool only) is answered here
    SETTLE          until every lane holds the batches up to ``target`` (closing: also what live producers and the
                    judges handed the lanes, and what dead producers' spools hold), or the drain's deadline
    CALL            the trackers' flush() (or close()) called; answered when they all answered, or at the deadline
    DONE            the report is in ``report``

A close's last records (the reduce judge's FINISH) are logged before it is posted, so they are shipped and settled
like any other; what the judges emit for them is waited for as a producer's (``producers_settled``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from tracklane.config.async_log import closing_share_s
from tracklane.core.report import PipelineReport
from tracklane.shipping.hub import REPORT_EVERY_S, HubWatch, Targets, behind
from tracklane.shipping.lane import Lanes

ANSWER_S = 0.5
"""How long past its deadline a barrier's answer may take (the report: the producers' last words, the spool's
close) before the caller gets a timed-out report instead: finish() returns within finish_timeout_s + this."""


class Phase(Enum):
    SHIP = "ship"
    SETTLE = "settle"
    CALL = "call"
    DONE = "done"


class BarrierHost(Protocol):
    """What a barrier asks of the shipper thread that serves it."""

    def ship_before(self, barrier: Barrier, now: float) -> bool:
        """Ship what was logged before the barrier; True once all of it is out (its last batch is ``seq``)."""

    @property
    def seq(self) -> int: ...

    def settled(self, barrier: Barrier) -> bool:
        """Every lane holds the batches up to ``barrier.target`` (closing: producers' and dead producers' too)."""

    def kept(self, barrier: Barrier) -> None:
        """A keep barrier: what was logged before it is spooled; answer it (no report)."""

    def call_trackers(self, barrier: Barrier) -> dict[str, Any]:
        """The trackers' flush() or close() calls made (lane -> ref); {} when there is nothing to call."""

    def calls_answered(self, barrier: Barrier) -> bool: ...

    def answer(self, barrier: Barrier, timed_out: bool) -> None:
        """Make the report, end what the barrier ends, set ``report`` and ``done``."""


@dataclass(slots=True, kw_only=True)
class Barrier:
    """A flush() or finish() waiting for the lanes; answered with a report."""

    closing: bool
    exit_code: int
    keep: bool = False
    """Only until what was logged before it is in a spooled batch (``Shipper.keep``)."""
    drain_deadline: float
    deadline: float
    started: float = field(default_factory=time.monotonic)
    phase: Phase = Phase.SHIP
    target: int | None = None
    """The last batch that must be settled (set once what was logged before the barrier is shipped)."""
    producers_since: float | None = None
    """Closing: when the lanes first held rank 0's batches (the judges had emitted for them): the producers' figures
    are read from a hub snapshot asked after then."""
    producer_targets: Targets | None = None
    """Closing: what producers handed each lane before finish (hub.py)."""
    producer_unshipped: dict[str, int] | None = None
    """Closing: live producers holding records they logged before the close began and had not shipped."""
    calls: dict[str, Any] = field(default_factory=dict)
    """Lane -> ref of its tracker's flush() or close()."""
    done: threading.Event = field(default_factory=threading.Event)
    report: PipelineReport | None = None

    def advance(self, host: BarrierHost, now: float) -> None:
        """Move on as far as this round allows (the shipper thread calls it every round)."""
        if self.phase is Phase.SHIP:
            if not host.ship_before(self, now):
                return
            self.target, self.phase = host.seq, Phase.SETTLE
            if self.keep:
                self.phase = Phase.DONE
                host.kept(self)
                return
        if self.phase is Phase.SETTLE:
            if now < self.drain_deadline and not host.settled(self):
                return
            self.calls, self.phase = host.call_trackers(self), Phase.CALL
        if self.phase is Phase.CALL and (not self.calls or host.calls_answered(self) or now >= self.deadline):
            host.answer(self, timed_out=now >= self.deadline)
            self.phase = Phase.DONE


class Requests:
    """The flush() and finish() requests posted to the shipper thread, oldest first."""

    def __init__(self, ready: threading.Condition) -> None:
        """``ready``: the condition the shipper thread waits on (the buffer's), also guarding the list."""
        self._ready = ready
        self._pending: list[Barrier] = []

    def post(self, *, closing: bool, exit_code: int, timeout: float, keep: bool = False) -> Barrier:
        """A flush drains until its whole deadline; a close keeps a quarter of it (up to 15 s) for the trackers
        to close properly."""
        now = time.monotonic()
        drain_s = timeout - closing_share_s(timeout) if closing else timeout
        barrier = Barrier(closing=closing, exit_code=exit_code, drain_deadline=now + drain_s, deadline=now + timeout,
                          keep=keep)
        with self._ready:
            self._pending.append(barrier)
            self._ready.notify_all()
        return barrier

    def pending(self) -> list[Barrier]:
        with self._ready:
            return list(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def answered(self, barrier: Barrier) -> None:
        with self._ready:
            self._pending.remove(barrier)
        barrier.done.set()


def producers_settled(barrier: Barrier, hub: HubWatch | None, lanes: Lanes) -> bool:
    """Closing: every live lane has what each producer handed it before finish() (as the hub knew it), and no live
    producer holds records it logged before the close began and has not shipped."""
    if not barrier.closing or hub is None:
        return True
    # a snapshot asked for after rank 0's batches were in the lanes (a report interval after the close began, at the
    # least) holds what each producer had logged by then, and what the judges emitted for those batches
    if barrier.producers_since is None:
        barrier.producers_since = max(time.monotonic(), barrier.started + REPORT_EVERY_S)
    was_shipping = barrier.producer_unshipped
    barrier.producer_unshipped = hub.unshipped(barrier.producer_unshipped, barrier.producers_since)
    if barrier.producer_unshipped is None:
        return False
    # what producers handed the lanes, again while one was still shipping and once more when it has shipped: its
    # last batches are waited for too
    if barrier.producer_targets is None or was_shipping or barrier.producer_unshipped:
        barrier.producer_targets = hub.targets()
        if barrier.producer_targets is None:
            return False
    lagging = behind(lanes, barrier.producer_targets)
    for lane in lagging:
        lane[0].refresh()  # ask its actor how far each producer got
    return not lagging and not barrier.producer_unshipped
