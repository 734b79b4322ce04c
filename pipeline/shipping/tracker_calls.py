"""Rank 0's part at a barrier: ask each live lane's actor to flush or close its tracker, read the answers,
and after the close end the actors. A producer's shipper has none of this: its lanes settling is enough."""

from __future__ import annotations

from typing import Any

import ray

from tracklane.core.acks import Ack
from tracklane.shipping.lane import Lanes, lane_accept, lane_dead
from tracklane.wire.ack import unpack_ack


class TrackerCalls:
    def __init__(self, calls_trackers: bool = True) -> None:
        """``calls_trackers``: rank 0's; False for a producer's shipper, which only drains its lanes."""
        self._calls_trackers = calls_trackers

    def call(self, lanes: Lanes, closing: bool, exit_code: int) -> dict[str, Any]:
        """lane -> the ref of its actor's ``close(exit_code)`` or ``flush()``; dead lanes are not asked."""
        calls: dict[str, Any] = {}
        if not self._calls_trackers:
            return calls
        for name, lane in lanes.items():
            if not lane_dead(lane):
                actor = lane[0].actor
                calls[name] = actor.close.remote(exit_code) if closing else actor.flush.remote()
        return calls

    @staticmethod
    def collect(calls: dict[str, Any]) -> dict[str, Ack | str]:
        """Each answered call's ``Ack``, or the error that stood in for it."""
        results: dict[str, Ack | str] = {}
        for name, ref in calls.items():
            if ray.wait([ref], timeout=0)[0]:
                try:
                    results[name] = unpack_ack(ray.get(ref))
                except Exception as exc:  # the actor died while closing
                    results[name] = f"{type(exc).__name__} while closing"
        return results

    @classmethod
    def take_answers(cls, lanes: Lanes, calls: dict[str, Any], closing: bool) -> None:
        """Each lane takes its tracker's answer (its watermarks, its figures) or the error that stood in for it; a
        close that did not answer is an error (a flush that did not is only late: the report says timed out)."""
        results = cls.collect(calls)
        for name, result in results.items():
            if isinstance(result, Ack):
                lane_accept(lanes[name], result)
            else:
                lanes[name][0].report.note_error(result)
        for name in calls:
            if name not in results and closing:
                lanes[name][0].report.note_error("did not answer before the deadline")

    @staticmethod
    def all_answered(calls: dict[str, Any]) -> bool:
        refs = list(calls.values())
        return not refs or len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == len(refs)

    def end(self, lanes: Lanes) -> None:
        """The trackers are closed: end the lane actors (no restart)."""
        for lane in lanes.values() if self._calls_trackers else ():
            try:
                ray.kill(lane[0].actor, no_restart=True)
            except Exception:  # already gone
                pass
