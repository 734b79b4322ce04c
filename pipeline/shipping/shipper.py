"""The shipper thread: buffer -> batches -> msgpack + zstd -> spool -> Ray -> every lane.

Everything slow happens here, never on the caller's thread: cleaning values,
encoding, compression, the spool's appends, ``ray.put``, actor calls, collecting
acknowledgements, re-sending after an actor restart, and the flush/close barriers.
Shutdown is a request like a flush, with a deadline: drain, close each tracker, kill
the actors. A batch is in the spool before any lane sees it, and leaves it once every
lane's tracker acknowledged it.

The shipper is the loop; a flush or close is a ``Barrier`` (barrier.py: its phases) that the loop moves on each
round, asking the shipper what only it knows. What differs between rank 0 and a producer is
the stages it is handed, wired in one place each (async_pipeline.py, producer_pipeline.py):
the converter, the spool (spool_stage.py), the calls that flush and close the trackers
(tracker_calls.py), the producers' hub (hub.py) and a progress callback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import ray

from pipeline.capture.captured import Captured
from pipeline.capture.convert import Converter
from pipeline.config.async_log import AsyncLogConfig
from pipeline.core.acks import Ack
from pipeline.core.records import Metrics, Record, Text
from pipeline.core.reduction import LANE as REDUCE_LANE
from pipeline.core.report import PipelineReport, ProducerReport, ReductionReport
from pipeline.node.busy import ThreadBusy
from pipeline.shipping.barrier import Barrier, producers_settled
from pipeline.shipping.buffer import RecordBuffer
from pipeline.shipping.health import health_figures
from pipeline.shipping.hub import HubWatch
from pipeline.shipping.lane import Entry
from pipeline.shipping.orphans import Orphans
from pipeline.shipping.reduced import ReducedPoints
from pipeline.shipping.spool_stage import SpoolStage
from pipeline.shipping.streams import TrackerLane
from pipeline.shipping.tracker_calls import TrackerCalls
from pipeline.spool.lane_state import StoredCopies
from pipeline.spool.producers import Tally
from pipeline.wire.batch import encode_what_encodes, shared

log = logging.getLogger("tracklane")

_IDLE_WAIT_S = 0.2  # longest sleep while nothing is due; bounds how stale health figures get
_BUSY_WAIT_S = 0.02  # sleep while a barrier is pending or answers are awaited
_ANSWER_S = 0.5
"""How long past its deadline a barrier's answer may take (the report: the producers' last words, the spool's
close) before the caller gets a timed-out report instead: finish() returns within finish_timeout_s + this."""


@dataclass(slots=True)
class _BulkItem:
    """A bulk item being shipped a batch at a time: its records, made lazily (a dump of hundreds of MB is never
    converted, encoded or held whole)."""

    records: Iterator[Record]
    next: Record | None = None  # made, not shipped yet (it did not fit in the last batch)


class Shipper:
    def __init__(self, cfg: AsyncLogConfig, buffer: RecordBuffer, lanes: dict[str, TrackerLane], converter: Converter, *,
                 spool: SpoolStage | None = None, tracker_calls: TrackerCalls | None = None,
                 progress: Callable[[Shipper, bool], None] | None = None, tally: Tally | None = None,
                 orphans: Orphans | None = None, copies: StoredCopies | None = None,
                 reduced: ReducedPoints | None = None) -> None:
        """``converter``: captured calls -> records (a producer's puts its name before every key).
        ``spool``: rank 0's; batches are numbered after what an earlier process of the run used.
        ``tracker_calls``: rank 0's, to flush and close the trackers at barriers; a producer's shipper only drains.
        ``progress(shipper, force)`` runs after each round (a producer tells the hub how far it got).
        ``tally``: a producer's exact counts on disk, told which calls each batch holds before it is spooled.
        ``orphans``: rank 0's; the spools of producers that died, delivered to the lanes (its close waits for them).
        ``copies``: rank 0's copy of each lane's state in its spool (for lanes on other nodes' disks).
        ``reduced``: rank 0's, with a reduce lane: the points it completes, sent on into every tracker.
        ``hub`` (set with ``watch_producers``): rank 0's view of its producers; its close waits for them."""
        self._cfg = cfg
        self._tracker_calls = tracker_calls
        self._progress = progress
        self.hub: HubWatch | None = None
        self.shipped_records = 0  # records handed to the lanes (health records included)
        self.taken = 0  # items taken out of the buffer
        self._settled = 0  # items in a batch handed on (spooled), or refused whole
        self._tally = tally
        self._orphans = orphans
        self._copies = copies
        self._reduced = reduced
        self._next_hub_look = 0.0
        self._buffer = buffer
        self._lanes = lanes
        self._converter = converter
        self._spool = spool
        self._dead_told: set[str] = set()  # lanes whose giving up was logged to the others
        self._seq = spool.first_seq if spool is not None else 0
        self._bulk: deque[_BulkItem] = deque()  # big parts of calls already taken, shipped a batch a round
        self._barriers: list[Barrier] = []  # guarded by the buffer's lock
        self._finished = False
        self._closing = False  # set once trackers are being closed: nothing more is shipped
        self._last_step = 0
        self.late_drops = 0  # records logged after finish()
        self.health: dict[str, float | int] = {}
        """The latest ``tracklane/*`` figures, replaced whole at each batch (a reader never sees half)."""
        # built on the thread that logs (the trainer's; a producer actor's): while it computes, batch longer
        self._busy = ThreadBusy() if cfg.busy_flush_interval_s > cfg.flush_interval_s else None
        self._thread = threading.Thread(target=self._run, name="tracklane-shipper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch_producers(self, hub: Any) -> None:
        """Rank 0 made its first producer: its close waits for what they shipped (``hub``: the ProducerHub actor)."""
        self.hub = HubWatch(hub)

    @property
    def seq(self) -> int:
        """The last batch handed to the lanes."""
        return self._seq

    @property
    def lanes(self) -> dict[str, TrackerLane]:
        return self._lanes

    @property
    def rejected_records(self) -> int:
        return self._converter.rejected

    # -- called from the trainer's thread (they only post a request and wait) ------------
    def flush(self, timeout: float) -> PipelineReport:
        return self._await(self._post(closing=False, exit_code=0, timeout=timeout, drain_share=1.0), timeout)

    def close(self, exit_code: int, timeout: float) -> PipelineReport:
        # Keep a quarter of the deadline (up to 15 s) for the trackers to close properly.
        share = 1.0 - min(0.25, 15.0 / max(timeout, 1e-9))
        return self._await(self._post(closing=True, exit_code=exit_code, timeout=timeout, drain_share=share), timeout)

    def _post(self, *, closing: bool, exit_code: int, timeout: float, drain_share: float) -> Barrier:
        now = time.monotonic()
        barrier = Barrier(closing=closing, exit_code=exit_code,
                           drain_deadline=now + timeout * drain_share, deadline=now + timeout)
        with self._buffer.ready:
            self._barriers.append(barrier)
            self._buffer.ready.notify()
        return barrier

    def _await(self, barrier: Barrier, timeout: float) -> PipelineReport:
        if not self._thread.is_alive() and not barrier.done.is_set():
            return self._report(barrier, timed_out=True)
        if barrier.done.wait(timeout + _ANSWER_S) and barrier.report is not None:
            return barrier.report
        log.warning("tracklane: the shipper thread did not answer within %.1f s", timeout)
        return self._report(barrier, timed_out=True)

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while not self._finished:
            try:
                self._sleep()
                self._ship(force=bool(self._barriers))
                for lane in self._lanes.values():
                    lane.pump()
                if self._orphans is not None:
                    self._orphans.pump()
                if self._reduced is not None:
                    self._send_reduced()
                self._tell_about_dead_lanes()
                self._release()
                self._serve_barriers()
                if self._progress is not None:
                    self._progress(self, False)
                failures = 0
            except Exception:  # a bug here must not end delivery: log it, back off, go on
                failures += 1
                if failures == 1:
                    log.exception("tracklane: the shipper thread hit an error; retrying")
                time.sleep(min(1.0, 0.01 * failures))

    def _sleep(self) -> None:
        if self._bulk:  # a dump is being shipped: on with it (its batches, and what comes meanwhile)
            return
        wait = min(self._buffer.due(self._interval()), _IDLE_WAIT_S)
        refs = [ref for lane in self._lanes.values() for ref in lane.waitables()]
        if self._orphans is not None:
            refs += self._orphans.waitables()
        if self._barriers or refs:
            wait = min(wait, _BUSY_WAIT_S if self._barriers else 0.05)
        if wait <= 0:
            return
        if refs:
            ray.wait(refs, num_returns=1, timeout=wait)  # wakes as soon as any actor answers
        else:
            with self._buffer.ready:
                self._buffer.ready.wait(wait)

    def _interval(self) -> float:
        """How long records may wait: ``flush_interval_s``, or ``busy_flush_interval_s`` while the logging thread
        keeps its CPU busy (fewer batches: the CPU each costs the lanes, Ray and the trackers goes to the trainer)."""
        if self._busy is not None and self._busy.busy():
            return self._cfg.busy_flush_interval_s
        return self._cfg.flush_interval_s

    def _ship(self, force: bool) -> None:
        """The due calls, in their order, to every tracker's small stream; then one batch of bulk (a dump's big
        part, an artifact): a dump goes a chunk a round, so what is logged meanwhile never waits behind it."""
        self._buffer.disk_ok = self._spool is not None and self._spool.durable
        while not self._closing and self._buffer and (force or self._buffer.due(self._interval()) == 0):
            items = self._buffer.take(self._cfg.max_batch_bytes)
            self.taken += len(items)
            records, whole = self._records(items)
            if records:
                self._send(records, items=whole)
            self._settled += whole
        if not self._closing and self._bulk:
            self._ship_bulk()

    def _records(self, items: list[Captured]) -> tuple[list[Record], int]:
        """The records to send now, and how many of ``items`` they complete; what is too big to send now is queued
        for the bulk stream."""
        records: list[Record] = []
        whole = 0
        for item in items:
            now, later = self._converter.staged(item, self._cfg.max_batch_bytes, BULK_BYTES)
            for record in now:
                records.append(record)
                if getattr(record, "axis", None) is None:  # the health figures go at the trainer's step
                    self._last_step = record.step
            if later:
                self._bulk.append(_BulkItem(records=chain.from_iterable(later)))
            else:
                whole += 1
        if records:
            self.health = health_figures(self._buffer, self._converter, self._lanes.values(), self.late_drops,
                                         self._spool.spool.nbytes if self._spool is not None else None,
                                         self._spool.durable if self._spool is not None else None)
            if self._cfg.health_metrics:
                records.append(Metrics(step=self._last_step, values=dict(self.health), time=time.time()))
        return records, whole

    def _ship_bulk(self) -> None:
        """One batch of the oldest bulk item (about ``max_batch_bytes``); the item counts as shipped with its last."""
        bulk = self._bulk[0]
        records: list[Record] = []
        nbytes = 0
        while nbytes < self._cfg.max_batch_bytes:
            record = bulk.next if bulk.next is not None else next(bulk.records, None)
            bulk.next = None
            if record is None:
                break
            size = record_bytes(record)
            if records and nbytes + size > self._cfg.max_batch_bytes:
                bulk.next = record  # the next batch's
                break
            records.append(record)
            nbytes += size
        if bulk.next is None:  # is this the item's last batch?
            bulk.next = next(bulk.records, None)
        done = bulk.next is None
        if records:
            self._send(records, items=int(done), bulk=True)
        if done:
            self._settled += 1
            self._bulk.popleft()

    def bulk_pending(self) -> bool:
        """A bulk item is being shipped."""
        return bool(self._bulk)

    def _send(self, records: list[Record], items: int = 0, bulk: bool = False) -> None:
        """One batch of ``records`` (``bulk``: for the lanes' bulk stream) to the spool and every lane it is for;
        ``items``: the captured calls it completes."""
        blob = self._encode(records, self._cfg.bulk_compression_level if bulk else self._cfg.compression_level)
        if blob is None:
            return
        oldest = min(r.time for r in records)
        audience = _audience(records, bulk, self._lanes)
        if self._tally is not None:
            self._tally.spooling(self._seq, self._settled, self._settled + items, self._buffer.dropped)
        # On disk before any lane can see it; a disk fault leaves it in the lanes' memory only (spool_stage.py).
        spooled = self._spool is not None and self._spool.append(self._seq, len(records), oldest, blob,
                                                                 self._lanes.values(), bulk, audience)
        if self._spool is not None and not spooled and self._tally is not None:
            self._tally.unspooled(self._seq, len(records))
        entry = Entry(seq=self._seq, ref=None, nbytes=len(blob), records=len(records), oldest_log_time=oldest,
                      spooled=spooled, bulk=bulk, audience=audience)
        # Into Ray only if a lane holds it in memory: past their bounds, lanes read it back from the spool.
        if not spooled or any(lane.holds(entry) for lane in self._lanes.values()):
            entry.ref = ray.put(shared(blob))
        self.shipped_records += len(records)
        for lane in self._lanes.values():
            if self._cfg.overflow == "block":
                self._wait_for_room(lane, entry.nbytes, bulk)
            lane.offer(entry)

    def _encode(self, records: list[Record], level: int | None) -> bytes | None:
        """The batch's bytes (its seq taken). A record msgpack cannot take (an int past 64 bits, say) is
        rejected and counted alone, not with the batch around it; the records list is trimmed in place."""
        blob, kept, refused = encode_what_encodes(records, self._seq + 1, time.time(), level)
        for record, exc in refused:
            self._converter.rejected += 1
            log.warning("tracklane: a %s record at step %s cannot be encoded; skipped (counted)", record.kind,
                        record.step, exc_info=exc)
        records[:] = kept
        if blob is not None:
            self._seq += 1
        return blob

    def _wait_for_room(self, lane: TrackerLane, nbytes: int, bulk: bool) -> None:
        deadline = time.monotonic() + self._cfg.block_timeout_s
        while not lane.has_room(nbytes, bulk) and time.monotonic() < deadline:
            refs = lane.waitables()
            if refs:
                ray.wait(refs, num_returns=1, timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            else:
                time.sleep(0.01)
            lane.pump()

    def _send_reduced(self) -> None:
        """The reduce lane's new points (and rank 0's notices to it) into the stream, and producers that closed."""
        assert self._reduced is not None
        now = time.monotonic()
        if self.hub is not None and now >= self._next_hub_look:
            self._next_hub_look = now + 1.0
            for source, last in self.hub.closed().items():
                self._reduced.ended(source, last)
        if self._closing:  # the trackers are closing: what comes now stays unconfirmed in the reducer (reported)
            return
        records = self._reduced.drain()
        if records:
            self._send(records)

    def _tell_about_dead_lanes(self) -> None:
        """A lane that gave up leaves its last error in every other tracker, as text ``error/lane/<name>``."""
        records: list[Record] = []
        for lane in self._lanes.values():
            if lane.dead and lane.name not in self._dead_told:
                self._dead_told.add(lane.name)
                log.warning("tracklane: lane %s gave up: %s", lane.name, lane.report.error)
                records.append(Text(step=self._last_step, name=f"error/lane/{lane.name}", time=time.time(),
                                    text=f"tracklane: the {lane.name} lane gave up: {lane.report.error}"))
        if records and not self._closing:
            self._send(records)

    # -- the spool -----------------------------------------------------------------------
    def _release(self) -> None:
        if self._spool is not None:
            self._spool.release(self._acked_by_all())
        if self._copies is not None:
            for lane in self._lanes.values():
                self._copies.update(lane.name, lane.stored_by_source)

    def _acked_by_all(self) -> int:
        """Every lane's tracker holds the batches up to here: the spool may forget them."""
        return min((lane.stored for lane in self._lanes.values()), default=self._seq)

    # -- barriers ------------------------------------------------------------------------
    def _serve_barriers(self) -> None:
        if not self._barriers:
            return
        now = time.monotonic()
        for barrier in list(self._barriers):
            barrier.advance(self, now)

    # -- what a barrier asks of the shipper (barrier.py's BarrierHost) ------------------------
    def ship_before(self, barrier: Barrier, now: float) -> bool:
        self._ship(force=True)
        return not (self.bulk_pending() and now < barrier.drain_deadline)  # a dump: a batch a round, lanes pumped

    def settled(self, barrier: Barrier) -> bool:
        target = barrier.target if barrier.target is not None else self._seq
        return self._all_settled(target) and producers_settled(barrier, self.hub, self._lanes) \
            and self._orphans_settled(barrier)

    def finish_reductions(self) -> bool:
        if self._reduced is None:
            return False
        self._send([self._reduced.finish()])
        return True

    def call_trackers(self, barrier: Barrier) -> dict[str, Any]:
        if barrier.closing:
            self._closing = True
            for lane in self._lanes.values():
                lane.freeze()  # nothing may reach a tracker after its close
        return {} if self._tracker_calls is None else \
            self._tracker_calls.call(self._lanes, barrier.closing, barrier.exit_code)

    def calls_answered(self, barrier: Barrier) -> bool:
        return TrackerCalls.all_answered({name: ref for name, ref in barrier.calls.items() if ref is not None})

    def _all_settled(self, target: int) -> bool:
        return all(lane.settled(target) for lane in self._lanes.values())

    def _orphans_settled(self, barrier: Barrier) -> bool:
        """Closing: the lanes hold every batch dead producers spooled (their spools found so far)."""
        return not barrier.closing or self._orphans is None or self._orphans.settled()

    def answer(self, barrier: Barrier, timed_out: bool) -> None:
        results = TrackerCalls.collect({name: ref for name, ref in barrier.calls.items() if ref is not None})
        for name, result in results.items():
            if isinstance(result, Ack):
                self._lanes[name].accept(result)
            else:
                self._lanes[name].report.note_error(result)
        for name in barrier.calls:
            if name not in results and barrier.closing:  # a flush that timed out is only late (timed_out)
                self._lanes[name].report.note_error("did not answer before the deadline")
        unsettled = not self._all_settled(barrier.target if barrier.target is not None else self._seq)
        if barrier.closing and self._spool is not None:
            self._spool.close(barrier.exit_code, self._acked_by_all())
        if barrier.closing and self._orphans is not None:
            self._orphans.close()
        barrier.report = self._report(barrier, timed_out=timed_out or unsettled)
        if self._progress is not None:
            self._progress(self, True)
        if barrier.closing:
            if self._tracker_calls is not None:
                self._tracker_calls.end(self._lanes)
            self._finished = True
        with self._buffer.ready:
            self._barriers.remove(barrier)
        barrier.done.set()

    def _report(self, barrier: Barrier, timed_out: bool) -> PipelineReport:
        return self._converter.counted(PipelineReport(
            lanes={name: lane.snapshot() for name, lane in self._lanes.items()},
            buffered_records=len(self._buffer) + len(self._bulk),
            dropped_records=self._buffer.dropped + self.late_drops,
            elapsed_s=time.monotonic() - barrier.started,
            timed_out=timed_out,
            spool=self._spool.report() if self._spool is not None else None,
            producers=self._producer_reports(barrier.closing, barrier.deadline),
            reductions=ReductionReport.of(self._reduced.figures, self._reduced.repeats, self._reduced.unlogged)
            if self._reduced is not None else None,
        ))

    def _producer_reports(self, final: bool, deadline: float) -> dict[str, ProducerReport]:
        wait = max(0.1, min(2.0, deadline + _ANSWER_S / 2 - time.monotonic()))  # finish's deadline holds
        reports = self.hub.reports(self._lanes, final=final, timeout=wait) if self.hub is not None else {}
        return self._orphans.merged(reports) if self._orphans is not None else reports


BULK_BYTES = 2**20
"""A group of samples this big (a rollout dump, to the trackers that keep all of it) goes in the bulk stream, a chunk
at a time; smaller ones (the dashboards' samples) go with the step's other records, in the order of the calls.
Measured: a 256-row table took wandb's lane ~50 ms, a 64 MB dump the file lane ~1 s."""


def record_bytes(record: Record) -> int:
    """About how many bytes a bulk record encodes to (its chunk's size), to fill a batch."""
    rows = getattr(record, "trajectories", None)
    if rows is not None:
        lines = getattr(rows, "lines", None)
        return len(lines) if lines is not None else 4096 * len(rows)
    samples = getattr(record, "samples", None)
    if samples is not None:
        return sum(len(row[0]) + len(row[1]) + 32 for row in samples)
    return len(getattr(record, "png", b"")) + 256


def _audience(records: list[Record], bulk: bool, lanes: dict[str, TrackerLane]) -> frozenset[str] | None:
    """The lanes with a record in the batch (None: every lane); a bulk batch never goes to the reduce lane."""
    names: set[str] = set()
    for record in records:
        if record.only is None:
            if not bulk:
                return None
            names.update(lanes)
            break
        names.update(record.only)
    if bulk:
        names.discard(REDUCE_LANE)
    return frozenset(names)
