"""A barrier's phases (pipeline/shipping/barrier.py), driven round by round by a host that records what it is
asked: ship first, settle, call the trackers, answer (a keep barrier: ship, then answered); the drain's deadline
skips what is left to drain, the deadline answers timed out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracklane.shipping.barrier import Barrier, Phase


@dataclass
class Host:
    """The shipper as a barrier sees it: each answer scripted, each request recorded."""

    shipped_after: int = 0  # rounds before what was logged is all out
    settled_after: int = 0  # rounds of settle checks answered False first, per target
    calls: dict[str, Any] = field(default_factory=lambda: {"file": object()})
    answered_after: int = 0
    seq: int = 10
    asked: list[str] = field(default_factory=list)
    _settle_checks: int = 0
    _answer_checks: int = 0

    def ship_before(self, barrier: Barrier, now: float) -> bool:
        self.asked.append("ship")
        self.shipped_after -= 1
        return self.shipped_after < 0 or now >= barrier.drain_deadline  # as the shipper: a dump stops at the deadline

    def settled(self, barrier: Barrier) -> bool:
        self.asked.append(f"settled? {barrier.target}")
        self._settle_checks += 1
        if self._settle_checks > self.settled_after:
            self._settle_checks = 0
            return True
        return False

    def kept(self, barrier: Barrier) -> None:
        self.asked.append(f"kept {barrier.target}")

    def call_trackers(self, barrier: Barrier) -> dict[str, Any]:
        self.asked.append("call")
        return self.calls

    def calls_answered(self, barrier: Barrier) -> bool:
        self._answer_checks += 1
        return self._answer_checks > self.answered_after

    def answer(self, barrier: Barrier, timed_out: bool) -> None:
        self.asked.append(f"answer timed_out={timed_out}")


def barrier(closing: bool = False, drain_deadline: float = 100.0, deadline: float = 200.0, keep: bool = False) -> Barrier:
    return Barrier(closing=closing, exit_code=0, drain_deadline=drain_deadline, deadline=deadline, started=0.0,
                   keep=keep)


def rounds(b: Barrier, host: Host, times: list[float]) -> list[Phase]:
    phases = []
    for now in times:
        b.advance(host, now)
        phases.append(b.phase)
    return phases


def test_a_flush_ships_settles_calls_and_answers_in_order():
    host, b = Host(shipped_after=1, settled_after=1, answered_after=1), barrier()
    assert rounds(b, host, [1, 2, 3, 4]) == [Phase.SHIP, Phase.SETTLE, Phase.CALL, Phase.DONE]
    assert host.asked == ["ship", "ship", "settled? 10", "settled? 10", "call", "answer timed_out=False"]
    assert b.target == 10


def test_a_keep_barrier_is_answered_once_shipped_and_waits_for_no_lane():
    host, b = Host(shipped_after=1), barrier(keep=True)
    assert rounds(b, host, [1, 2]) == [Phase.SHIP, Phase.DONE]
    assert host.asked == ["ship", "ship", "kept 10"]


def test_past_the_drain_deadline_nothing_more_is_waited_for():
    host, b = Host(shipped_after=5, settled_after=5), barrier(closing=True, drain_deadline=2.0)
    assert rounds(b, host, [1, 3]) == [Phase.SHIP, Phase.DONE]
    assert "call" in host.asked
    assert not any(asked.startswith("settled?") for asked in host.asked)


def test_nothing_to_call_is_answered_at_once_and_the_deadline_answers_timed_out():
    host, b = Host(calls={}), barrier()
    assert rounds(b, host, [1]) == [Phase.DONE] and host.asked[-1] == "answer timed_out=False"
    host, b = Host(answered_after=10), barrier(deadline=5.0)
    assert rounds(b, host, [1, 2, 6]) == [Phase.CALL, Phase.CALL, Phase.DONE]
    assert host.asked[-1] == "answer timed_out=True"
