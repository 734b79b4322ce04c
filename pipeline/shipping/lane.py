"""The trainer-side end of one lane: the batches its tracker has not acknowledged yet.

Used only by the shipper thread. A lane submits at most ``max_inflight`` batches to its
actor, each naming the batch sent before it, so the actor can refuse gaps and skip
re-sends. If the actor dies, Ray restarts it; the lane probes until it answers, then
re-sends every unacknowledged batch in order. If the tracker is down the actor answers
"held" and the lane sends the batch again after a capped, doubling backoff.

The lane's memory is bounded by bytes. With the spool on, a batch that does not fit is kept
only on disk (its entry holds no Ray object) and is read back when its turn comes, so an outage
costs disk, not memory, and loses nothing until the spool's own bound. Without the spool, the
oldest batches not yet submitted are dropped and counted; so are batches the spool's disk refused
(durability off, spool_stage.py), once the batches that are on disk gave up their memory to them.

Two watermarks: ``applied``, the last batch the tracker was handed (the window moves on, a flush
is answered), and ``durable``, the last its own store holds (what the spool may forget). They
differ for wandb, whose wandb-core keeps its newest rows in memory; with the spool on, a batch
between the two is remembered (spool-only) and sent again if the actor dies.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError

from pipeline.config.async_log import AsyncLogConfig
from pipeline.core.acks import Ack
from pipeline.core.report import LaneInfo, LaneReport
from pipeline.spool.segments import SpoolEntry
from pipeline.wire.ack import unpack_ack

log = logging.getLogger("tracklane")
_LAGS_KEPT = 10_000
_TASK_ERRORS_TOLERATED = 5  # consecutive failed apply() calls before the lane gives up


@dataclass(slots=True)
class Entry:
    """One encoded batch as a lane holds it."""

    seq: int
    ref: Any  # ray.ObjectRef of the encoded bytes, shared by every lane; None: only in the spool
    nbytes: int
    records: int
    oldest_log_time: float  # time.time() of the batch's first log() call
    spooled: bool = True  # on disk (False: the spool's disk refused it, or it is off); only memory holds it
    bulk: bool = False  # travels in the bulk stream (streams.py)
    audience: frozenset[str] | None = None  # the lanes it holds records for (None: all)


Reload = Callable[[int], Any]
"""seq -> a Ray object of that batch read back from the spool, or None if the spool lost it."""


@dataclass(slots=True, kw_only=True, frozen=True)
class LaneSettings:
    """A lane's bounds, deadlines and backoff; ``LaneSettings.of(cfg)`` takes them from ``trainer.async_log``."""

    max_bytes: int
    """Encoded bytes of unacknowledged batches held in Ray for this lane (beyond it they wait in the spool)."""
    max_inflight: int
    """Batches submitted to the actor and not answered yet."""
    dead_after_s: float
    """An actor silent this long (its calls unanswered) is taken for dead and the lane recovers."""
    startup_timeout_s: float
    """How long the actor may take to open its tracker before the lane gives up on it."""
    backoff_s: float = 0.5
    """First wait before sending again to a tracker that is down (doubling)."""
    max_backoff_s: float = 30.0
    max_outage_s: float | None = None
    """A tracker down this long makes the lane give up (None: never)."""

    @classmethod
    def of(cls, cfg: AsyncLogConfig) -> LaneSettings:
        return cls(max_bytes=cfg.lane_max_bytes, max_inflight=cfg.max_inflight_batches,
                   dead_after_s=max(30.0, cfg.startup_timeout_s / 2), startup_timeout_s=cfg.startup_timeout_s,
                   backoff_s=max(cfg.retry_backoff_s, 0.05), max_backoff_s=cfg.max_retry_backoff_s,
                   max_outage_s=cfg.max_outage_s)


class Lane:
    def __init__(self, name: str, actor: Any, settings: LaneSettings, *, reload: Reload | None = None,
                 source: str = "", on_output: Callable[[str], None] | None = None,
                 on_reduced: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``reload``: reads a batch back from the spool (rank 0's lanes). ``source``: "" for the trainer's lane;
        a producer's source id for a producer's lane (its own sequence numbers at the same actor). ``on_output``:
        where the lines the tracker printed go (the console's, in the order its answers arrive: batch order).
        ``on_reduced``: where the reduce lane's points go (rank 0's ``ReducedPoints``)."""
        self.name = name
        self.actor = actor
        self._source = source
        self._on_output = on_output
        self._on_reduced = on_reduced
        self._max_bytes = settings.max_bytes
        self._max_inflight = settings.max_inflight
        self._dead_after_s = settings.dead_after_s
        self._reload = reload
        self._backoff_s = settings.backoff_s
        self._max_backoff_s = settings.max_backoff_s
        self._max_outage_s = settings.max_outage_s
        startup_timeout_s = settings.startup_timeout_s
        self._hold_s = 0.0  # current backoff while the tracker is down
        self._hold_until = 0.0  # monotonic time before which nothing is submitted
        self._down_since: float | None = None  # monotonic time of the first "held" of this outage
        self._down_before_s = 0.0  # seconds of the outages the tracker recovered from
        self._window: OrderedDict[int, Entry] = OrderedDict()  # unacknowledged, in seq order
        self._bytes = 0  # of the window's entries that hold a Ray object
        self._acked = 0  # applied: the tracker was handed it
        self._durable = 0  # the tracker's store holds it
        self._handed: OrderedDict[int, Entry] = OrderedDict()  # applied, not durable yet: sent again after a restart
        self._last_sent = 0  # seq of the last batch submitted since the last recovery
        # result ref -> seq. A recovery forgets every call: their batches are sent again in order
        # and the actor skips what it applied already, so an older answer is never needed.
        self._calls: dict[Any, int] = {}
        self._dead = False
        self._frozen = False  # set when the tracker is being closed
        self._task_errors = 0  # consecutive apply() calls that raised inside the actor
        self._pid = 0  # of the actor, from its latest answer
        self._node_id = ""
        # The first answer we wait for is the actor opening its tracker.
        self._probe: Any = self._ready()
        self._probe_deadline = time.monotonic() + startup_timeout_s
        self._lags: deque[float] = deque(maxlen=_LAGS_KEPT)
        self.report = LaneReport(name=name)
        self.sources: dict[str, int] = {}
        """How far each producer's batches got at this lane's actor, as of its latest answer."""
        self.offered = 0
        """The last batch put in its window (what a producer's lanes must reach before rank 0 finishes)."""
        self.stored: dict[str, int] = {}
        """What its tracker's store holds of each source ("": the trainer's), as of the actor's latest answer."""
        self.answered = False
        """Its actor answered at least once (it is up, its tracker opened or failed to); read by other threads."""

    # -- feeding -------------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        """Whether a batch of ``nbytes`` fits in the memory bound now."""
        return not self._dead and self._bytes + nbytes <= self._max_bytes

    def has_room(self, nbytes: int) -> bool:
        return self._dead or self._reload is not None or self._bytes + nbytes <= self._max_bytes

    def offer(self, entry: Entry) -> None:
        if self._dead:
            self.report.dropped_records += entry.records
            return
        if self._reload is not None and entry.spooled:  # over the bound, the batch waits on disk only
            fits = entry.ref is not None and self._bytes + entry.nbytes <= self._max_bytes
            self._window[entry.seq] = dataclasses.replace(entry, ref=entry.ref if fits else None)
            self._bytes += entry.nbytes if fits else 0
            self.offered = entry.seq
            return
        if self._reload is not None:
            self._spill(entry.nbytes)
        submitted = sum(e.nbytes for seq, e in self._window.items() if seq <= self._last_sent and e.ref is not None)
        if submitted + entry.nbytes > self._max_bytes:  # cannot fit even alone: keep what waits
            self.report.dropped_records += entry.records
            return
        while self._bytes + entry.nbytes > self._max_bytes and self._drop_oldest_unsent():
            pass
        self._window[entry.seq] = entry
        self._bytes += entry.nbytes
        self.offered = entry.seq

    def preload(self, entries: Iterable[SpoolEntry]) -> None:
        """Batches an earlier process spooled (recovery): waiting on disk; the actor's first answer
        says which its tracker already holds."""
        for e in entries:
            self._window[e.seq] = Entry(seq=e.seq, ref=None, nbytes=e.nbytes, records=e.records,
                                        oldest_log_time=e.oldest_log_time)
            self.offered = max(self.offered, e.seq)
        self._window = OrderedDict(sorted(self._window.items()))

    def evicted(self, seqs: set[int]) -> int:
        """The spool deleted these batches: those this lane holds only there are lost. Returns how many records."""
        lost = 0
        for seq in [s for s in self._window if s in seqs]:
            entry = self._window[seq]
            if entry.ref is None:
                del self._window[seq]
                lost += entry.records
            else:  # memory holds the only copy now: it must not be spilled
                self._window[seq] = dataclasses.replace(entry, spooled=False)
        self.report.dropped_records += lost
        return lost

    def _spill(self, nbytes: int) -> None:
        """A batch the spool's disk refused needs memory: batches that are on disk give theirs up (read back in
        their turn), oldest first."""
        for seq, entry in list(self._window.items()):
            if self._bytes + nbytes <= self._max_bytes:
                return
            if entry.ref is not None and entry.spooled:
                self._window[seq] = dataclasses.replace(entry, ref=None)
                self._bytes -= entry.nbytes

    def _drop_oldest_unsent(self) -> bool:
        for seq, entry in self._window.items():
            if seq > self._last_sent and entry.ref is not None:  # one only on disk holds no memory
                del self._window[seq]
                self._bytes -= entry.nbytes
                self.report.dropped_records += entry.records
                return True
        return False

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
        progressed = ack.applied > self._acked
        self.accept(ack)
        if ack.held:
            self._hold(ack)
        elif progressed or not ack.gap:
            self._up()
        if ack.gap:
            self._restart_sending()
            self._catch_up(ack)

    def _hold(self, ack: Ack) -> None:
        """The tracker is down: nothing of the batch was applied; send it again after a backoff."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        self._hold_s = min(self._max_backoff_s, max(self._backoff_s, self._hold_s * 2))
        self._hold_until = now + self._hold_s
        self.report.retries += 1
        self.report.note_error(f"tracker down, retrying in {self._hold_s:.1f} s: {ack.error}")
        self._restart_sending()

    def _up(self) -> None:
        if self._down_since is not None:  # the tracker took a batch again: the outage is over
            self._down_before_s += time.monotonic() - self._down_since
            self.report.recovered_outages += 1
            log.warning("tracklane: lane %s: the tracker is back after %.1f s down", self.name,
                        time.monotonic() - self._down_since)
        self._down_since = None
        self._hold_s = 0.0
        self._hold_until = 0.0

    def _task_failed(self, exc: Exception) -> None:
        self._task_errors += 1
        cause = getattr(exc, "cause", None) or exc  # RayTaskError carries the actor's own exception
        self.report.retries += 1
        self.report.note_error(f"actor call failed: {type(cause).__name__}: {str(cause)[:200]}")
        if self._task_errors > _TASK_ERRORS_TOLERATED:
            self._die(f"{self._task_errors} failed actor calls in a row; last: {self.report.error}")
        else:
            self._restart_sending()

    def accept(self, ack: Ack) -> None:
        """Take an answer of the actor: trim what it applied, merge its figures into the report."""
        if ack.output and self._on_output is not None:
            self._on_output(ack.output)
        if ack.reduced and self._on_reduced is not None:
            self._on_reduced(ack.reduced)
        applied, durable = ack.applied, ack.durable_seq
        now = time.time()
        while self._window:
            seq, entry = next(iter(self._window.items()))
            if seq > applied:
                break
            del self._window[seq]
            self._bytes -= entry.nbytes if entry.ref is not None else 0
            self._lags.append(now - entry.oldest_log_time)
            if seq > durable:  # sent again if the actor dies: from the spool, or from memory if it is not on disk
                keep = self._reload is None or not entry.spooled
                self._handed[seq] = entry if keep else dataclasses.replace(entry, ref=None)
        self._acked = max(self._acked, applied)
        self._durable = max(self._durable, durable)  # durable <= applied <= self._acked
        while self._handed and next(iter(self._handed)) <= self._durable:
            self._handed.popitem(last=False)
        self._last_sent = max(self._last_sent, self._acked)
        self._pid, self._node_id = ack.pid, ack.node_id
        self.sources = ack.sources
        self.stored = ack.stored or self.stored
        self._tell_state_disk(ack.state_unsaved_since)
        self.report.take(ack)
        self.answered = True

    def _tell_state_disk(self, unsaved_since: float) -> None:
        """One warning when the actor's acknowledgement state stops being saved (its disk), one when it is again."""
        if unsaved_since and not self.report.state_unsaved_since:
            log.warning("tracklane: lane %s: its actor cannot save its acknowledgement state since %s (its disk); "
                        "the lane delivers on, but an actor restart meanwhile may apply a batch twice", self.name,
                        time.strftime("%H:%M:%S", time.localtime(unsaved_since)))
        elif self.report.state_unsaved_since and not unsaved_since:
            log.warning("tracklane: lane %s: its acknowledgement state is saved again", self.name)

    def _actor_lost(self, exc: Exception) -> None:
        if isinstance(exc, ActorDiedError):  # Ray will not restart it: the lane is dead for good
            self._die(f"actor died: {type(exc).__name__}")
            return
        self.report.restarts += 1
        self.report.note_error(f"actor restarting after {type(exc).__name__}")
        self._probe_deadline = time.monotonic() + self._dead_after_s
        if self._handed:  # its tracker may have lost them with the actor: they go again (the actor skips
            # what its store holds), from memory or from the spool
            self._bytes += sum(e.nbytes for e in self._handed.values() if e.ref is not None)
            self._window = OrderedDict(sorted({**self._handed, **self._window}.items()))
        self._handed.clear()
        self._acked = self._durable  # the successor starts from what the store holds
        self._restart_sending()
        self._probe = self._ready()

    def _check_probe(self) -> None:
        done, _ = ray.wait([self._probe], timeout=0)
        if not done:
            if time.monotonic() > self._probe_deadline:
                self._die("actor did not answer before its deadline")
            return
        try:
            ack = unpack_ack(ray.get(self._probe))
        except ActorDiedError as exc:
            self._die(f"actor died: {type(exc).__name__}")
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
        """An actor behind what an earlier one acknowledged as stored (its state could not be saved) is told so,
        as a probe: nothing is sent until it answers, then sending goes on from there."""
        if ack.applied < self._durable and self._probe is None and not self._dead:
            log.warning("tracklane: lane %s%s: its actor's state is behind what the tracker stored (%d < %d); told so",
                        self.name, f" ({self._source})" if self._source else "", ack.applied, self._durable)
            self._probe_deadline = time.monotonic() + self._dead_after_s
            self._probe = self.actor.catch_up.remote(self._source, self._durable)

    def refresh(self) -> None:
        """Ask the actor for fresh figures (how far each producer got) unless a question is out already."""
        if self._probe is None and not self._dead:
            self._probe_deadline = time.monotonic() + self._dead_after_s
            self._probe = self._ready()

    def _ready(self) -> Any:
        return self.actor.ready.remote(self._source) if self._source else self.actor.ready.remote()

    def _restart_sending(self) -> None:
        self._calls.clear()
        self._last_sent = self._acked

    @property
    def applied(self) -> int:
        """The last batch its tracker was handed (its store may hold less: ``acked``)."""
        return self._acked

    @property
    def acked(self) -> int:
        """The last batch this lane's tracker holds durably."""
        return self._durable

    @property
    def outage_s(self) -> float:
        """How long the tracker has been down (0 while it answers)."""
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    def _submit(self) -> None:
        now = time.monotonic()
        if now < self._hold_until:
            return
        # After max_outage_s of a continuous outage the actor counts failures instead of holding.
        final = () if self._max_outage_s is None or self._down_since is None \
            or now - self._down_since < self._max_outage_s else (True,)
        for seq, entry in list(self._window.items()):
            if len(self._calls) >= self._max_inflight:
                return
            if seq <= self._last_sent:
                continue
            if entry.ref is None and not self._load(entry):
                continue
            ref = self.actor.apply.remote(seq, self._last_sent, entry.ref, bool(final), self._source) if self._source \
                else self.actor.apply.remote(seq, self._last_sent, entry.ref, *final)
            self._calls[ref] = seq
            self._last_sent = seq

    def _load(self, entry: Entry) -> bool:
        """Read a batch that waited on disk back into Ray; False (dropped, counted) if the spool lost it."""
        ref = self._reload(entry.seq) if self._reload is not None else None
        if ref is None:
            del self._window[entry.seq]
            self.report.dropped_records += entry.records
            self.report.note_error(f"batch {entry.seq} is no longer in the spool ({entry.records} records lost)")
            return False
        entry.ref = ref
        self._bytes += entry.nbytes
        return True

    def _die(self, why: str) -> None:
        self.answered = True  # nothing to wait for
        self._dead = True
        self._probe = None
        self._calls.clear()
        self.report.note_error(why)
        self.report.dropped_records += sum(e.records for e in self._window.values()) \
            + sum(e.records for e in self._handed.values())  # the dead actor's tracker may not have stored them
        self._window.clear()
        self._handed.clear()
        self._bytes = 0

    def give_up(self, why: str) -> None:
        """Stop for good (the lane's other stream gave up on the actor): what waits is counted dropped."""
        if not self._dead:
            self._die(why)

    def freeze(self) -> None:
        """Submit nothing more: the tracker is about to be closed."""
        self._frozen = True

    # -- state ---------------------------------------------------------------------------
    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def source(self) -> str:
        """The source id its batches go under at the actor ("": the trainer's small stream)."""
        return self._source

    def first_pending(self, stored: bool = True) -> int | None:
        """The oldest batch its tracker's store lacks (``stored``), or was not handed; None if there is none."""
        seqs = [next(iter(self._window), None)] + ([next(iter(self._handed), None)] if stored else [])
        return min((seq for seq in seqs if seq is not None), default=None)

    def settled(self, through_seq: int) -> bool:
        """True once nothing up to ``through_seq`` waits in this lane (acknowledged, dropped, or dead)."""
        return self._dead or not any(seq <= through_seq for seq in self._window)

    @property
    def unacked_bytes(self) -> int:
        return self._bytes

    def info(self) -> LaneInfo:
        return LaneInfo(name=self.name, pid=self._pid, node_id=self._node_id, unacked_bytes=self._bytes)

    def lag_s(self) -> float:
        if not self._window:
            return 0.0
        return time.time() - next(iter(self._window.values())).oldest_log_time

    def snapshot(self) -> LaneReport:
        lags = sorted(self._lags)
        r = self.report
        r.acked_seq = self._durable
        r.unacked_batches = len(self._window) + len(self._handed)
        r.unacked_records = sum(e.records for e in self._window.values()) + sum(e.records for e in self._handed.values())
        r.lag_s = self.lag_s()
        r.outage_s = self.outage_s
        r.outage_total_s = self._down_before_s + r.outage_s
        r.lag_p50_s = lags[len(lags) // 2] if lags else 0.0
        r.lag_p99_s = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else 0.0
        return dataclasses.replace(r)
