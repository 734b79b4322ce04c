"""One tracker's lane as the shipper sees it: its two streams into the same actor, small records before bulk.

A rollout dump of hundreds of MB takes a tracker seconds to store; a step's scalars must not wait behind it. So
each tracker's lane is two ``Stream``s (stream.py), numbered from the one sequence of the spool: the small stream
(metrics, params, text, histograms, the vitals) under the sender's id, the bulk stream (rollouts, tables, media)
under that id plus ``BULK``. The actor keeps a watermark per stream, so each is handed once and in order; Ray runs
an actor's calls in the order they were sent, so a small batch waits at most for the bulk batches already in flight
(``max_inflight_batches``, a chunk each). A judge's lane never gets bulk.

The shipper drives the streams themselves (offer, pump, wait); what is asked of a tracker as a whole is here: a
lane is a list of streams, the small one first, and ``Lanes`` maps each tracker's name to its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tracklane.core.acks import Ack
from tracklane.core.report import LaneInfo, LaneReport

if TYPE_CHECKING:  # stream.py imports Ray; the producers' hub.py reads lanes without it (``import tracklane`` stays light)
    from tracklane.shipping.stream import Reload, Stream, StreamSettings

LaneStreams = Sequence["Stream"]
"""A tracker's streams: small, then bulk."""
Lanes = dict[str, list["Stream"]]
"""Tracker name -> its lane."""


def open_lane(name: str, actor: Any, settings: StreamSettings, *, reload: Reload | None = None, sender: str = "",
              on_output: Callable[[str], None] | None = None) -> list[Stream]:
    """The small and the bulk stream of ``sender`` into ``name``'s actor; ``on_output`` is the small stream's."""
    from tracklane.shipping.stream import Stream

    return [Stream(name, actor, settings, reload=reload, sender=sender, on_output=on_output),
            Stream(name, actor, settings, reload=reload, sender=sender, bulk=True)]


def all_streams(lanes: Lanes) -> Iterator[Stream]:
    for lane in lanes.values():
        yield from lane


def lane_dead(lane: LaneStreams) -> bool:
    return any(stream.dead for stream in lane)


def pump_lane(lane: LaneStreams) -> None:
    """Pump each stream (stream.py ``Stream.pump``); one that gave up on the actor takes the other with it."""
    for stream in lane:
        stream.pump()
    give_up_together(lane)


def give_up_together(lane: LaneStreams) -> None:
    """One stream gave up on the actor: so does the other (what it lacks stays on disk)."""
    if lane_dead(lane):
        why = next(stream.report.error for stream in lane if stream.dead)
        for stream in lane:
            stream.give_up(why or "the lane's other stream gave up")


def lane_stored(lane: LaneStreams) -> int:
    """Every batch up to here that this tracker was offered is in its store (what the spool may forget)."""
    return min(stream.through(stored=True) for stream in lane)


def lane_handed(lane: LaneStreams) -> int:
    """Every batch up to here was handed to the tracker (its store may hold less: ``stored``)."""
    return min(stream.through(stored=False) for stream in lane)


def lane_settled(lane: LaneStreams, through_seq: int) -> bool:
    return lane_dead(lane) or all(stream.settled(through_seq) for stream in lane)


def lane_accept(lane: LaneStreams, ack: Ack) -> None:
    """An answer to a flush or close (to the small stream's sender): each stream takes its own watermarks."""
    small, bulk = lane
    small.accept(ack)
    bulk.accept(ack.for_sender(bulk.sender))


def by_sender(lane: LaneStreams, stored: bool = False) -> dict[str, int]:
    """How far each sender got at the actor (``stored``: in the tracker's store; else handed), as of the newer of
    the streams' answers."""
    merged: dict[str, int] = {}
    for stream in lane:
        for sender, seq in (stream.stored_by_sender if stored else stream.handed_by_sender).items():
            merged[sender] = max(seq, merged.get(sender, 0))
    return merged


def lane_offered(lane: LaneStreams) -> dict[str, int]:
    """Per stream (its sender id), the last batch handed to it: the actor has them all once its senders reach these."""
    return {stream.sender: stream.window.offered for stream in lane if stream.window.offered}


def lane_down(lane: LaneStreams) -> tuple[float, str]:
    """How long and why its tracker has been out of reach (stream.py ``Stream.down``), the longer of its streams'."""
    return max((stream.down() for stream in lane), key=lambda down: down[0])


def unstored_bytes(lane: LaneStreams) -> int:
    return sum(stream.window.nbytes for stream in lane)


def dropped_records(lane: LaneStreams) -> int:
    """Records its streams dropped (their bounds, a full disk)."""
    return sum(stream.report.dropped_records for stream in lane)


def lane_info(lane: LaneStreams) -> LaneInfo:
    small = lane[0]
    return LaneInfo(name=small.name, pid=small.pid, node_id=small.node_id, unstored_bytes=unstored_bytes(lane))


def stream_report(stream: Stream) -> LaneReport:
    """A copy of one stream's report with its window's backlog and lags and its actor's outage as they stand."""
    r, window, liveness = stream.report, stream.window, stream.liveness
    r.stored_seq = window.stored
    r.unstored_batches, r.unstored_records = window.batches(), window.records()
    r.lag_s = window.lag_s()
    r.lag_p50_s, r.lag_p99_s = window.lag_percentiles()
    r.outage_s, r.outage_total_s = stream.outage.down_s, stream.outage.before_s + stream.outage.down_s
    r.down_s, r.down = stream.down()
    r.first_stored_s = liveness.seconds_to(window.first_stored_at)
    r.started_s = liveness.seconds_to(liveness.first_answer_at)
    r.gave_up = stream.dead
    return dataclasses.replace(r)


def lane_report(lane: LaneStreams) -> LaneReport:
    """The small stream's report (the tracker's own figures: both streams' answers carry the same) with the bulk
    stream's backlog, drops, outages and lags."""
    small, bulk = (stream_report(stream) for stream in lane)
    small.stored_seq = lane_stored(lane)
    small.unstored_batches += bulk.unstored_batches
    small.unstored_records += bulk.unstored_records
    small.dropped_records += bulk.dropped_records
    small.retries += bulk.retries
    small.restarts = max(small.restarts, bulk.restarts)
    small.outage_s = max(small.outage_s, bulk.outage_s)
    small.outage_total_s = max(small.outage_total_s, bulk.outage_total_s)
    if bulk.down_s > small.down_s:
        small.down_s, small.down = bulk.down_s, bulk.down
    small.gave_up = small.gave_up or bulk.gave_up
    small.bulk_lag_s, small.bulk_lag_p50_s, small.bulk_lag_p99_s = bulk.lag_s, bulk.lag_p50_s, bulk.lag_p99_s
    if small.error is None and bulk.error is not None:
        small.error = bulk.error
    if bulk.last_error_at > small.last_error_at:
        small.last_error, small.last_error_at = bulk.last_error, bulk.last_error_at
    return small


def lost_on_eviction(lanes: Lanes, seqs: set[int]) -> dict[str, int]:
    """These batches left the disk: each stream keeps those it holds in memory; returns what each tracker lost."""
    return {name: sum(stream.window.evicted(seqs) for stream in lane) for name, lane in lanes.items()}


def lane_preload(lane: LaneStreams, entries: Iterable[Any], through: int = 0) -> None:
    """Batches an earlier process spooled, each to its stream (stream.py ``Stream.preload``)."""
    entries = list(entries)
    for stream in lane:
        stream.preload(entries, through)
