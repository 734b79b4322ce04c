"""Ray's own view of a lane's actor: waiting to be placed, starting, alive, restarting, or dead.

A lane gives up on its actor only when Ray says it is dead (or its calls keep failing: stream.py), never because a
clock ran out. On a busy node an actor waits minutes for resources (a logging node the autoscaler adds late), for
its ``runtime_env``, or for a CPU to import its SDK and open its tracker: all of that is "not yet", not "never".

The lane asks only while an answer it waits for is overdue, every ``LOOK_EVERY_S``: one lookup in Ray's GCS
(~1 ms here). Ray's public state API (``ray.util.state``) goes through the dashboard, which tracklane's own Ray runs
without, so the GCS's actor table is read directly; if that ever fails, the view is UNKNOWN and the lane goes on
waiting (a call to a dead actor still raises ``ActorDiedError``, which the lane takes as Ray's word).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

log = logging.getLogger("tracklane")

LOOK_EVERY_S = 5.0
"""How often a lane whose actor owes it an answer asks Ray how that actor is."""


class Phase(Enum):
    PENDING = "pending"  # not placed yet: waiting for resources, a node, or its runtime_env
    STARTING = "starting"  # its process runs its constructor: importing the SDK, opening the tracker
    ALIVE = "alive"
    RESTARTING = "restarting"
    DEAD = "dead"  # for good: Ray will not restart it
    UNKNOWN = "unknown"  # Ray's view could not be read


@dataclass(frozen=True, slots=True)
class ActorView:
    phase: Phase
    why: str = ""
    """In words, for the report and the tracker_down alert: what it waits for, or what killed it."""

    def __str__(self) -> str:
        return f"{self.phase.value}: {self.why}" if self.why else self.phase.value


def look(actor: Any) -> ActorView:
    """What Ray's GCS says of ``actor`` now. Never raises."""
    try:
        entry = _table_entry(actor)
    except Exception as exc:  # a private API of Ray's: if it moved, the lane waits as if the actor were slow
        log.debug("tracklane: Ray's view of an actor could not be read", exc_info=True)
        return ActorView(Phase.UNKNOWN, f"Ray's view of it could not be read ({type(exc).__name__})")
    if entry is None:
        return ActorView(Phase.UNKNOWN, "Ray does not know it")
    return _view(entry)


def _table_entry(actor: Any) -> Any:
    """The actor's ``ActorTableData`` in Ray's GCS (None: not there)."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    info = state._connect_and_get_accessor().get_actor_info(actor._actor_id)
    return gcs_pb2.ActorTableData.FromString(info) if info else None  # type: ignore[attr-defined]


def _view(entry: Any) -> ActorView:
    from ray.core.generated import gcs_pb2

    state = gcs_pb2.ActorTableData.ActorState.Name(entry.state)  # type: ignore[attr-defined]
    if state == "DEPENDENCIES_UNREADY":
        return ActorView(Phase.PENDING, "waiting for its dependencies (a runtime_env being set up)")
    if state == "PENDING_CREATION":
        if entry.pid:
            return ActorView(Phase.STARTING, f"its process (pid {entry.pid}) is starting: importing its SDK, "
                                             "opening its tracker")
        return ActorView(Phase.PENDING, waiting_for(dict(entry.required_resources)))
    if state == "ALIVE":
        return ActorView(Phase.ALIVE, f"alive (pid {entry.pid}), busy")
    if state == "RESTARTING":
        return ActorView(Phase.RESTARTING, f"restarting (restart {entry.num_restarts + 1} of {entry.max_restarts})")
    return ActorView(Phase.DEAD, death_cause(entry.death_cause))


def waiting_for(resources: dict[str, float]) -> str:
    """What a pending actor waits for, from the resources it asks for and those the cluster has."""
    import ray

    try:
        offered = ray.cluster_resources()
    except Exception:  # Ray shutting down: say what it asks for
        offered = {}
    missing = sorted(name for name in resources if name not in offered)
    if missing:
        return f"waiting for resource {', '.join(missing)} (no node offers it yet)"
    if resources:
        return "waiting for free resources: " + ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()))
    return "waiting to be placed on a node"


def death_cause(cause: Any) -> str:
    """The words Ray keeps for why an actor died (its ``ActorDeathCause``), first line, capped."""
    try:
        context = cause.WhichOneof("context")
        text = getattr(getattr(cause, context), "error_message", "") if context else ""
    except Exception:  # an older or newer message shape
        text = str(cause)
    text = " ".join(str(text).split())
    return text[:300] if text else "Ray reports it dead"
