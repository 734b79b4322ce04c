"""The run's producers as rank 0 sees them: one small hub actor every producer reports to, and what it says.

Every producer (``Tracking.producer``) tells the hub what it logged, shipped and dropped, and the last batch it
handed its lanes. Rank 0's ``finish()`` reads a snapshot to wait until the lanes have what live producers
shipped before it was called, and to count what they lost. Everything crosses Ray as msgpack, never pickle.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.report import ProducerReport
from tracklane.shipping.lane import Lanes, LaneStreams, by_sender, lane_dead

log = logging.getLogger("tracklane")


@dataclass(slots=True, frozen=True)
class ProducerSpec:
    """What a producer needs of its run, handed out by the asynchronous path (``Tracking.producer`` builds it)."""

    lanes: dict[str, Any]
    """Lane name -> its lane actor's Ray handle."""
    hub: Any
    """The run's ``ProducerHub`` actor handle."""
    cfg: AsyncLogConfig
    limits: RecordLimits
    run: tuple[str, float]
    """The run's id and start time (for the node's system metrics)."""
    traits: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    """Each sink trait -> the lanes whose sink has it (host/registry.py ``backend_traits``)."""


REPORT_EVERY_S = 0.25  # how often a producer tells the hub how far it got (and at each barrier)
GONE_AFTER_S = 3.0
"""A producer that has not reported for this long is taken for dead: finish() stops waiting for its batches."""


class ProducerHub:
    """The run's record of its producers (a Ray actor with no CPU): sender id -> latest figures. It also holds each
    judge's ``ProducerSpec``, which a judge's lane actor asks for by the hub's name when it starts (again after a
    restart): an actor handle among a restartable actor's constructor arguments could be gone when Ray restarts it
    (ray-project/ray#53727)."""

    def __init__(self) -> None:
        self._figures: dict[str, dict[str, Any]] = {}
        self._at: dict[str, float] = {}  # sender -> monotonic time of its latest report
        self._specs: dict[str, ProducerSpec] = {}

    def hold_spec(self, lane: str, spec: ProducerSpec) -> None:
        self._specs[lane] = spec

    def spec_for(self, lane: str) -> ProducerSpec | None:
        """None until rank 0's ``hold_spec`` for it arrived (rank 0 never waits for the hub to start)."""
        return self._specs.get(lane)

    def update(self, sender: str, figures: bytes) -> None:
        self._figures[sender] = msgpack.unpackb(figures, raw=False)
        self._at[sender] = time.monotonic()

    def snapshot(self) -> bytes:
        now = time.monotonic()
        return msgpack.packb({sender: {**f, "age_s": now - self._at[sender]} for sender, f in self._figures.items()},
                             use_bin_type=True)


@dataclass(slots=True, kw_only=True)
class ProducerFigures:
    """What a producer tells the hub; msgpack of these fields, never pickle."""

    name: str
    logged: int = 0
    """Records put into its buffer (calls that passed the copy)."""
    shipped: int = 0
    """Records encoded and handed to its lanes."""
    buffer_dropped: int = 0
    """Records its buffer dropped (overflow) before they were shipped."""
    lane_dropped: int = 0
    """Shipped records a lane dropped (its bound, a dead actor), the most of any lane."""
    rejected: int = 0
    """Records the converter refused whole (not a mapping, a bad step ...)."""
    seq: int = 0
    """Its last batch handed to the lanes."""
    lanes: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """Lane -> its stream (sender id: the producer's, or its bulk stream's) -> the last batch handed to it: rank 0's
    finish waits until every live lane's actor has them (a lane gets only the batches it has records in)."""
    closed: bool = False
    """It flushed and stopped (its process is ending)."""
    judged: dict[str, Any] = dataclasses.field(default_factory=dict)
    """A judge's figures for the run's report (host/sink.py ``Judging.judged``); {} for a producer."""

    def pack(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self), use_bin_type=True)


def producer_reports(snapshot: bytes, lanes: Lanes) -> dict[str, ProducerReport]:
    """Rank 0's view of every producer at finish: ``ProducerReport`` by sender id (the judges are reported as what
    they judged: ``judged``)."""
    figures: dict[str, dict[str, Any]] = msgpack.unpackb(snapshot, raw=False)
    out = {}
    for sender, f in figures.items():
        if is_judge(sender):
            continue
        behind = sorted(name for name, lane in lanes.items()
                        if not lane_dead(lane) and _lags(lane, f["lanes"].get(name, {})))
        out[sender] = ProducerReport(
            name=f["name"], sender=sender, logged=f["logged"], shipped=f["shipped"],
            dropped=f["buffer_dropped"] + f["lane_dropped"], rejected=f["rejected"], closed=f["closed"],
            unshipped=max(0, f["logged"] - f["shipped"] - f["buffer_dropped"] - f["rejected"]), lanes_behind=behind)
    return out


def is_judge(sender: str) -> bool:
    """A judge's producer is named after its lane; every other producer's name ends in ``#`` and 10 hex digits."""
    return "#" not in sender


def judged(snapshot: bytes | None) -> dict[str, dict[str, Any]]:
    """Judge (its lane) -> its figures for the report, as it last told the hub."""
    if snapshot is None:
        return {}
    return {sender: f.get("judged") or {} for sender, f in msgpack.unpackb(snapshot, raw=False).items()
            if is_judge(sender)}


def _lags(lane: LaneStreams, handed: dict[str, int]) -> bool:
    """Whether ``lane``'s actor lacks some of what a producer handed it (stream sender id -> last batch)."""
    got = by_sender(lane)
    return any(got.get(sender, 0) < seq for sender, seq in handed.items())


Targets = dict[str, dict[str, int]]
"""Lane -> stream sender id -> the last batch handed to it."""


def targets(snapshot: bytes) -> Targets:
    """What the producers still alive (reporting) handed each lane, from a hub snapshot. A dead producer's calls
    in flight died with it: nothing to wait for."""
    out: Targets = {}
    for f in msgpack.unpackb(snapshot, raw=False).values():
        if f["closed"] or f["age_s"] < GONE_AFTER_S:
            for lane, handed in f["lanes"].items():
                out.setdefault(lane, {}).update(handed)
    return out


def behind(lanes: Lanes, wanted: Targets) -> list[LaneStreams]:
    """The live lanes whose actor lacks some of what producers handed them (``targets``)."""
    return [lane for name, lane in lanes.items() if not lane_dead(lane) and _lags(lane, wanted.get(name, {}))]


class HubWatch:
    """Rank 0's view of its producers' hub, read by the shipper thread: polled without blocking while a close
    waits for what live producers shipped, and read once more (a wait of a few ms) for the final report."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self._ref: Any = None  # a snapshot() call in flight
        self._view: bytes | None = None  # the latest snapshot
        self._asked = 0.0  # when the call in flight was made (time.monotonic)
        self._view_asked = 0.0  # when the latest snapshot was asked for

    def waitables(self) -> list[Any]:
        """The hub's answer in flight, if any (the shipper wakes for it)."""
        return [self._ref] if self._ref is not None else []

    def targets(self) -> Targets | None:
        """What each live producer handed each lane (``targets``); None until the hub has answered."""
        view = self._poll()
        return targets(view) if view is not None else None

    def _poll(self) -> bytes | None:
        """The hub's latest snapshot, asking again when the last answer came (never blocks)."""
        import ray

        if self.hub is None:
            return self._view
        if self._ref is None:
            self._ref, self._asked = self.hub.snapshot.remote(), time.monotonic()
        if ray.wait([self._ref], timeout=0)[0]:
            try:
                self._view, self._view_asked = ray.get(self._ref), self._asked
            except Exception as exc:  # the hub died: producers cannot be waited for
                log.warning("tracklane: the producers' hub cannot be read (%s); not waiting for producers", exc)
                self.hub, self._view = None, b"\x80"
            self._ref = None
        return self._view

    def unshipped(self, since: dict[str, int] | None, asked_after: float) -> dict[str, int] | None:
        """Live producers (reporting, not closed) holding records they logged but have not shipped, as the hub last
        said (never blocks): sender id -> how many they had logged. With ``since`` (an earlier answer), only those
        that have not yet shipped what they had logged then. None until the hub has answered. Rank 0's close waits
        for these too (a rollout worker traced the last step's calls a moment before ``finish()``), and only for
        what was logged before it began (``asked_after``: a snapshot asked for after then, so that a producer's last
        report is in it): a producer that goes on logging does not hold it to its deadline."""
        view = self._poll()
        if view is None or (self.hub is not None and self._view_asked < asked_after):
            return None
        out = {}
        for sender, f in msgpack.unpackb(view, raw=False).items():
            done = f["shipped"] + f["buffer_dropped"] + f["rejected"]
            wanted = f["logged"] if since is None else since.get(sender, 0)
            if not f["closed"] and f["age_s"] < GONE_AFTER_S and wanted > done:
                out[sender] = wanted
        return out

    def closed(self, lane: str) -> dict[str, int]:
        """sender id -> the last batch it handed ``lane``, for the producers that closed, as the hub last said (never
        blocks)."""
        view = self._poll()
        if view is None:
            return {}
        return {sender: int(f["lanes"].get(lane, {}).get(sender, 0))
                for sender, f in msgpack.unpackb(view, raw=False).items() if f["closed"]}

    def reports(self, lanes: Lanes, final: bool, timeout: float = 2.0) -> dict[str, ProducerReport]:
        """Every producer as the hub last said; ``final``: ask it for the producers' last words first (waiting up to
        ``timeout``)."""
        import ray

        if final and self.hub is not None:
            try:
                self._view = ray.get(self.hub.snapshot.remote(), timeout=timeout)
            except Exception as exc:
                log.warning("tracklane: the producers' hub cannot be read (%s)", exc)
        return producer_reports(self._view, lanes) if self._view is not None else {}

    def judged(self) -> dict[str, dict[str, Any]]:
        """The judges' figures as of the latest snapshot (``reports`` reads the final one)."""
        return judged(self._view)
