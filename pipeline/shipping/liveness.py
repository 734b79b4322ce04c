"""Whether a lane's tracker is within reach, and if not since when and why: its actor not started (or restarting)
yet, the tracker down, or the lane given up. A lane (stream.py) keeps one ``Liveness`` and one ``Outage``.

``Liveness`` knows the actor: an answer it owes (its first, or its first after a restart), what Ray said of it
while that answer was overdue (actor_view.py), and when the lane gave up on it. ``Outage`` knows the tracker: the
actor answers "held" while the tracker cannot be reached, and the lane sends again after a capped, doubling backoff.
``down`` puts them into the words the report and the tracker_down rule use.
"""

from __future__ import annotations

import time
from typing import Any

from tracklane.shipping.actor_view import ActorView, Phase, look


class Liveness:
    def __init__(self, actor: Any, look_every_s: float) -> None:
        self._actor, self._every = actor, look_every_s
        now = time.monotonic()
        self.look_at = now + look_every_s
        """When (time.monotonic) to ask Ray about an answer still owed."""
        self.since: float | None = now
        """Since when the actor owes an answer that says it is up (None: it answered)."""
        self.view: ActorView | None = None
        """What Ray said of it while that answer was overdue."""
        self._answered_once = False  # a wait after its first answer is a restart
        self.dead_at: float | None = None
        self._started = now
        self.first_answer_at: float | None = None
        """When (time.monotonic) its actor first answered: it had started."""

    def seconds_to(self, when: float | None) -> float:
        """Seconds from the lane's start to ``when`` (time.monotonic; None: 0, not yet)."""
        return 0.0 if when is None else when - self._started

    def answered(self) -> None:
        if self.first_answer_at is None:
            self.first_answer_at = time.monotonic()
        self.since, self.view, self._answered_once = None, None, True

    def waiting(self) -> None:
        """The actor owes an answer that says it is up (again): from now on, ask Ray when it is overdue."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        self.look_at = now + self._every

    def asked(self) -> None:
        """An answer from a live actor is owed (fresh figures): Ray is asked about it only once it is overdue."""
        self.look_at = time.monotonic() + self._every

    def look(self) -> ActorView:
        """An answer is overdue: ask Ray how the actor is (again after ``look_every_s``)."""
        self.look_at = time.monotonic() + self._every
        self.view = look(self._actor)
        return self.view

    def overdue_and_dead(self) -> str | None:
        """While an answer is owed: once it is overdue, ask Ray; the words for it if Ray says the actor is dead."""
        if time.monotonic() < self.look_at:
            return None
        view = self.look()
        return f"actor died: {view.why}" if view.phase is Phase.DEAD else None

    def dead_after(self, exc: Exception) -> str | None:
        """A call said the actor died: the words for it if Ray says so too, or cannot say; None while Ray restarts it
        (or has not heard yet)."""
        view = self.look()
        if view.phase is Phase.DEAD:
            return f"actor died: {view.why}"
        return f"actor died: {type(exc).__name__}" if view.phase is Phase.UNKNOWN else None

    def died(self) -> None:
        self.dead_at = time.monotonic()

    def down(self, error: str | None, outage: Outage) -> tuple[float, str]:
        """How long its tracker has been out of reach, and why in words (0, "": it takes batches)."""
        now = time.monotonic()
        if self.dead_at is not None:
            return now - self.dead_at, f"gave up: {error}"
        if self.since is not None:
            waited = now - self.since
            said = f" ({self.view})" if self.view is not None else ""
            return waited, f"{'restarting' if self._answered_once else 'not started'} after {waited:.0f} s{said}"
        if outage.since is not None:
            return outage.down_s, f"tracker down for {outage.down_s:.0f} s: {error}"
        return 0.0, ""


class Outage:
    """How long the tracker has been down, and when to send to it again (a capped, doubling backoff)."""

    def __init__(self, backoff_s: float, max_backoff_s: float, max_outage_s: float | None) -> None:
        self._backoff_s, self._max_backoff_s, self._max_outage_s = backoff_s, max_backoff_s, max_outage_s
        self.hold_s = 0.0  # current backoff
        self.until = 0.0  # monotonic time before which nothing is submitted
        self.since: float | None = None  # monotonic time of the first "held" of this outage
        self.before_s = 0.0  # seconds of the outages the tracker recovered from

    def held(self) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        self.hold_s = min(self._max_backoff_s, max(self._backoff_s, self.hold_s * 2))
        self.until = now + self.hold_s

    def over(self) -> float | None:
        """The tracker took a batch again: how long it was down (None: it was not)."""
        down_s = None if self.since is None else time.monotonic() - self.since
        self.before_s += down_s or 0.0
        self.since, self.hold_s, self.until = None, 0.0, 0.0
        return down_s

    @property
    def down_s(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def final(self, now: float) -> bool:
        """Past ``max_outage_s`` of one outage: the actor counts failures instead of holding."""
        limit = self._max_outage_s
        return limit is not None and self.since is not None and now - self.since >= limit
