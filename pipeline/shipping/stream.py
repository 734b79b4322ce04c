"""The trainer-side end of one lane's stream: its window (stream_window.py) and the actor that drains it.

Used only by the shipper thread. A lane submits at most ``max_inflight`` batches to its actor, each naming the
batch sent before it, so the actor can refuse gaps and skip re-sends. If the actor dies, Ray restarts it; the lane
probes until it answers, then sends again every batch its tracker has not stored, in order. If the tracker is down
the actor answers "held" and the lane sends the batch again after a capped, doubling backoff; after
``max_outage_s`` of one outage the actor counts failures instead of holding.

Pending is not dead. An actor that has not answered yet may wait for resources, a node, its runtime_env or a CPU;
while an answer is overdue the lane asks Ray how the actor is (actor_view.py) and waits on, saying what it waits
for. It gives up only when Ray reports the actor dead, or after repeated failed calls; then its window keeps on
disk what the tracker's store lacks, for ``tracklane replay`` and the next resume.

The window knows which batches wait and the two watermarks (handed, stored); this class knows the actor: its calls
in flight, the probe, the backoff and the outage, and when to give up on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError

from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.acks import Ack
from tracklane.core.report import LaneReport
from tracklane.shipping.actor_view import LOOK_EVERY_S
from tracklane.shipping.liveness import Liveness, Outage
from tracklane.shipping.stream_window import Entry, Reload, StreamWindow
from tracklane.spool.lane_state import bulk_sender
from tracklane.spool.segments import SpoolEntry
from tracklane.wire.ack import unpack_ack

log = logging.getLogger("tracklane")
_TASK_ERRORS_TOLERATED = 5  # consecutive failed apply() calls before the lane gives up

__all__ = ["Entry", "Stream", "StreamSettings", "Reload"]


@dataclass(slots=True, kw_only=True, frozen=True)
class StreamSettings:
    """A lane's bounds, deadlines and backoff; ``StreamSettings.of(cfg)`` takes them from ``trainer.async_log``."""

    max_bytes: int
    """Encoded bytes of batches not stored yet held in Ray for this lane (beyond it they wait in the spool)."""
    max_inflight: int
    """Batches submitted to the actor and not answered yet."""
    look_every_s: float = LOOK_EVERY_S
    """While an answer of the actor is overdue by this much, and every as long again, the lane asks Ray how the actor
    is (actor_view.py); it gives up only if Ray says dead."""
    backoff_s: float = 0.5
    """First wait before sending again to a tracker that is down (doubling)."""
    max_backoff_s: float = 30.0
    max_outage_s: float | None = None
    """A tracker down this long makes the lane give up (None: never)."""

    @classmethod
    def of(cls, cfg: AsyncLogConfig) -> StreamSettings:
        return cls(max_bytes=cfg.lane_max_bytes, max_inflight=cfg.max_inflight_batches,
                   backoff_s=max(cfg.retry_backoff_s, 0.05), max_backoff_s=cfg.max_retry_backoff_s,
                   max_outage_s=cfg.max_outage_s)


class Stream:
    def __init__(self, name: str, actor: Any, settings: StreamSettings, *, reload: Reload | None = None,
                 sender: str = "", bulk: bool = False, on_output: Callable[[str], None] | None = None) -> None:
        """``name``: its tracker's. ``reload``: reads a batch back from the spool. ``sender``: "" for the trainer; else
        a producer's id (its own sequence numbers at the same actor), plus ``BULK`` for its ``bulk`` stream.
        ``on_output``: where the console's lines go (``Ack.output``: to the terminal, in the order they arrive)."""
        self.name, self.actor, self.bulk, self._settings = name, actor, bulk, settings
        self._sender = bulk_sender(sender) if bulk else sender
        self._on_output = on_output
        self.report = LaneReport(name=name)
        self.window = StreamWindow(settings.max_bytes, self.report, reload)
        self.outage = Outage(settings.backoff_s, settings.max_backoff_s, settings.max_outage_s)
        # result ref -> seq. A recovery forgets every call: their batches are sent again in order
        # and the actor skips what it was handed already, so an older answer is never needed.
        self._calls: dict[Any, int] = {}
        self._dead, self._frozen = False, False  # frozen: the tracker is being closed
        self._task_errors = 0  # consecutive apply() calls that raised inside the actor
        self.pid, self.node_id = 0, ""  # of the actor, from its latest answer
        self._probe: Any = self._ready()  # the first answer we wait for is the actor opening its tracker
        self.liveness = Liveness(actor, settings.look_every_s)
        # As of the actor's latest answer, the last batch of each sender ("": the trainer's) its tracker was handed,
        # and the last its store holds.
        self.handed_by_sender: dict[str, int] = {}
        self.stored_by_sender: dict[str, int] = {}
        self.answered = False  # its actor answered once (it is up, its tracker opened or failed to); other threads read it
        self._seen = 0  # the newest batch offered, taken or not

    # -- feeding -------------------------------------------------------------------------
    def takes(self, entry: Entry | SpoolEntry) -> bool:
        """Whether a batch is for this stream: of its kind (small or bulk), with a record for its tracker (its
        ``audience`` leaves it out: the file's share of a dump, when the dashboards keep a sample)."""
        return entry.bulk == self.bulk and (entry.audience is None or self.name in entry.audience)

    def holds(self, entry: Entry) -> bool:
        """Whether it would keep ``entry`` in memory: it takes it and it fits the bound (none after giving up)."""
        return self.takes(entry) and self.window.fits(entry.nbytes)

    def offer(self, entry: Entry) -> None:
        """Every batch the shipper numbers: this stream keeps those it takes (one that gave up, on disk)."""
        self._seen = max(self._seen, entry.seq)
        if self.takes(entry):
            self.window.offer(entry)

    def preload(self, entries: Iterable[SpoolEntry], through: int = 0) -> None:
        """Batches an earlier process spooled (those for it). ``through``: the last batch an earlier process
        numbered; those not in ``entries`` its tracker's store holds already."""
        entries = list(entries)
        self.window.preload(e for e in entries if self.takes(e))
        self._seen = max([self._seen, through] + [e.seq for e in entries])

    # -- progress ------------------------------------------------------------------------
    def waitables(self) -> list[Any]:
        refs = list(self._calls)
        if self._probe is not None:
            refs.append(self._probe)
        return refs

    def pump(self) -> None:
        """Collect answers, recover from a dead actor, submit what the window allows. Never blocks."""
        if self._calls:
            done, _ = ray.wait(list(self._calls), num_returns=len(self._calls), timeout=0)
            for ref in done:
                if ref in self._calls:  # a recovery during this loop forgets older calls
                    self._answer(ref)
        if self._probe is not None:
            self._check_probe()
        if self._probe is None and not self._dead and not self._frozen:
            self._submit()

    def _answer(self, ref: Any) -> None:
        del self._calls[ref]
        try:
            ack = unpack_ack(ray.get(ref))
        except RayActorError as exc:
            self._actor_lost(exc)
            return
        except Exception as exc:  # the actor's own code failed (e.g. its disk is full): re-send, then give up
            self._task_failed(exc)
            return
        self._task_errors = 0
        progressed = ack.handed > self.window.handed
        self.accept(ack)
        if ack.held:  # the tracker is down: nothing of the batch was handed; send it again after a backoff
            self.outage.held()
            self.report.retries += 1
            self.report.note_error(f"tracker down, retrying in {self.outage.hold_s:.1f} s: {ack.error}")
            self._send_again()
        elif (progressed or not ack.gap) and (down_s := self.outage.over()) is not None:  # the tracker is back
            self.report.recovered_outages += 1
            log.warning("tracklane: lane %s: the tracker is back after %.1f s down", self.name, down_s)
        if ack.gap:
            self._send_again()
            self._catch_up(ack)

    def _task_failed(self, exc: Exception) -> None:
        self._task_errors += 1
        cause = getattr(exc, "cause", None) or exc  # RayTaskError carries the actor's own exception
        self.report.retries += 1
        self.report.note_error(f"actor call failed: {type(cause).__name__}: {str(cause)[:200]}")
        if self._task_errors > _TASK_ERRORS_TOLERATED:
            self.give_up(f"{self._task_errors} failed actor calls in a row; last: {self.report.error}")
        else:
            self._send_again()

    def accept(self, ack: Ack) -> None:
        """Take an answer of the actor: move the window's watermarks, merge its figures into the report."""
        if ack.output and self._on_output is not None:
            self._on_output(ack.output)
        self.window.take(ack.handed, ack.stored_seq)
        self.pid, self.node_id = ack.pid, ack.node_id
        self.liveness.answered()
        self.handed_by_sender = ack.handed_by_sender
        self.stored_by_sender = ack.stored_by_sender or self.stored_by_sender
        _tell_state_disk(self.name, self.report, ack.state_unsaved_since)
        self.report.take(ack)
        self.answered = True

    def _actor_lost(self, exc: Exception) -> None:
        if isinstance(exc, ActorDiedError) and self._dead_for_good(exc):
            return
        self.report.restarts += 1
        self.report.note_error(f"actor restarting after {type(exc).__name__}")
        self.liveness.waiting()
        self.window.actor_restarted()
        self._calls.clear()
        self._probe = self._ready()

    def _dead_for_good(self, exc: Exception) -> bool:
        """A call said the actor died: Ray's view decides whether for good (liveness.py); said again and again while
        Ray still calls it alive, it counts as a failed call."""
        why = self.liveness.dead_after(exc)
        self._task_errors += why is None
        if why is None and self._task_errors > _TASK_ERRORS_TOLERATED:
            why = f"{self._task_errors} calls in a row said the actor died while Ray calls it {self.liveness.view}"
        if why is not None:
            self.give_up(why)
        return why is not None

    def _check_probe(self) -> None:
        done, _ = ray.wait([self._probe], timeout=0)
        if not done:  # overdue: pending, starting, alive but busy or restarting, it is waited for; dead, given up
            if (why := self.liveness.overdue_and_dead()) is not None:
                self.give_up(why)
            return
        try:
            ack = unpack_ack(ray.get(self._probe))
        except ActorDiedError as exc:
            if not self._dead_for_good(exc):
                self.liveness.waiting()
                self._probe = self._ready()
            return
        except RayActorError:
            self._probe = self._ready()  # still restarting: ask again
            return
        except Exception as exc:  # ready() itself raised, or answered garbage: ask again, then give up
            self._task_failed(exc)
            if not self._dead:
                self._probe = self._ready()
            return
        self._probe = None
        self.accept(ack)
        self._catch_up(ack)

    def _catch_up(self, ack: Ack) -> None:
        """An actor behind what an earlier one reported stored (its state could not be saved) is told so, as a
        probe: nothing is sent until it answers, then sending goes on from there."""
        stored = self.window.stored
        if ack.handed < stored and self._probe is None and not self._dead:
            log.warning("tracklane: lane %s%s: its actor's state is behind what the tracker stored (%d < %d); told so",
                        self.name, f" ({self._sender})" if self._sender else "", ack.handed, stored)
            self.liveness.asked()
            self._probe = self.actor.catch_up.remote(self._sender, stored)

    def refresh(self) -> None:
        """Ask the actor for fresh figures (how far each producer got) unless a question is out already."""
        if self._probe is None and not self._dead:
            self.liveness.asked()
            self._probe = self._ready()

    def _ready(self) -> Any:
        return self.actor.ready.remote(self._sender)

    def _send_again(self) -> None:
        self._calls.clear()
        self.window.send_again()

    def wake_at(self) -> float:
        """When (time.monotonic) this lane next has something to do that no answer will announce: its backoff ends,
        or it asks Ray about an answer still owed (inf: nothing)."""
        if self._dead:
            return float("inf")
        if self._probe is not None:
            return self.liveness.look_at
        return self.outage.until if self.outage.until > time.monotonic() else float("inf")

    def down(self) -> tuple[float, str]:
        """How long its tracker has been out of reach, and why in words (0, "": it takes batches): the lane gave up,
        its actor has not started (or restarted) yet, or the tracker is down (liveness.py)."""
        return self.liveness.down(self.report.error, self.outage)

    def _submit(self) -> None:
        now = time.monotonic()
        if now < self.outage.until or len(self._calls) >= self._settings.max_inflight:
            return
        final = self.outage.final(now)
        for entry in self.window.to_send():
            previous = self.window.sent
            ref = self.actor.apply.remote(entry.seq, previous, entry.ref, final, self._sender)
            self._calls[ref] = entry.seq
            self.window.sent_through(entry.seq)
            if len(self._calls) >= self._settings.max_inflight:
                return

    def give_up(self, why: str) -> None:
        """Give up on the actor (Ray says it is dead, its calls keep failing, or the lane's other stream gave up):
        nothing more is sent; what the tracker lacks stays on disk (the window's give_up)."""
        if self._dead:
            return
        self.answered = True  # nothing to wait for
        self._dead = True
        self.liveness.died()
        self._probe = None
        self._calls.clear()
        self.report.note_error(why)
        self.window.give_up()  # said once per lane by the shipper's DeadLanesStage

    def freeze(self) -> None:
        """Submit nothing more: the tracker is about to be closed."""
        self._frozen = True

    # -- state ---------------------------------------------------------------------------
    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def sender(self) -> str:
        """The sender id its batches go under at the actor ("": the trainer's small stream)."""
        return self._sender

    def settled(self, through_seq: int) -> bool:
        """True once nothing up to ``through_seq`` waits in this stream (handed, dropped, or it gave up)."""
        return self.window.settled(through_seq)

    def through(self, stored: bool = True) -> int:
        """Every batch up to here was handed to the tracker (``stored``: is in its store, what the spool may forget),
        or was not for this stream."""
        first = self.window.first_pending(stored)
        return self._seen if first is None else first - 1


def _tell_state_disk(name: str, report: LaneReport, unsaved_since: float) -> None:
    """One warning when the actor's acknowledgement state stops being saved (its disk), one when it is again."""
    if unsaved_since and not report.state_unsaved_since:
        log.warning("tracklane: lane %s: its actor cannot save its acknowledgement state since %s (its disk); "
                    "the lane delivers on, but an actor restart meanwhile may apply a batch twice", name,
                    time.strftime("%H:%M:%S", time.localtime(unsaved_since)))
    elif report.state_unsaved_since and not unsaved_since:
        log.warning("tracklane: lane %s: its acknowledgement state is saved again", name)
