"""The shipper thread: buffer -> batches -> msgpack + zstd -> spool -> Ray -> every lane.

Everything slow happens here, never on the caller's thread: cleaning values,
encoding, compression, the spool's appends, ``ray.put``, actor calls, collecting
acknowledgements, re-sending after an actor restart, and the flush/close barriers.
Shutdown is a request like a flush, with a deadline: drain, close each tracker, kill
the actors. A batch is in the spool before any lane sees it, and leaves it once every
lane's tracker stored it.

The shipper is the loop; a flush or close is a ``Barrier`` (barrier.py: its phases) that the loop moves on each
round, asking the shipper what only it knows. It sleeps in one wait for every reason it has to wake (wakeup.py).
What differs between rank 0 and a producer is what it is handed, wired in one place each (async_pipeline.py,
producer_pipeline.py): the converter, the spool (spool_keeper.py), the calls that flush and close the trackers
(tracker_calls.py), a producer's tally, and the stages (stages.py: producers, orphans, reductions, the stored
copies, a producer's progress).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray

from tracklane.capture.captured import Captured
from tracklane.capture.convert import Converter
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.records import Metrics, Record
from tracklane.core.report import PipelineReport
from tracklane.node.busy import ThreadBusy
from tracklane.shipping.barrier import ANSWER_S, Barrier, Requests
from tracklane.shipping.buffer import RecordBuffer
from tracklane.shipping.bulk_queue import BULK_BYTES, BulkQueue
from tracklane.shipping.lane import Lanes, all_streams, lane_report, lane_settled, lane_stored, pump_lane
from tracklane.shipping.spool_keeper import SpoolKeeper
from tracklane.shipping.stages import DeadLanesStage, Stage
from tracklane.shipping.stream import Entry, Stream
from tracklane.shipping.tracker_calls import TrackerCalls
from tracklane.shipping.vitals import read_vitals
from tracklane.shipping.wakeup import Wakeup
from tracklane.wire.batch import encode_what_encodes, shared

log = logging.getLogger("tracklane")

_IDLE_WAIT_S = 0.2  # longest sleep while nothing is due; bounds how stale vitals get


class Shipper:
    def __init__(self, cfg: AsyncLogConfig, buffer: RecordBuffer, lanes: Lanes, converter: Converter, *,
                 spool: SpoolKeeper | None = None, tracker_calls: TrackerCalls | None = None,
                 stages: Sequence[Stage] = ()) -> None:
        """``converter``: captured calls -> records (a producer's puts its name before every key). ``spool``: batches
        are numbered after what an earlier process of the run used (None: a producer whose disk refused its spool).
        ``tracker_calls``: rank 0's, to flush and close the trackers at barriers (a producer's shipper only drains).
        ``stages``: what the loop drives besides the lanes (stages.py), in the order they report."""
        self._cfg, self._buffer, self._lanes, self._converter = cfg, buffer, lanes, converter
        self._spool, self._stages = spool, [*stages, DeadLanesStage()]
        self._tracker_calls = tracker_calls or TrackerCalls(calls_trackers=False)
        # records handed to the lanes (vitals included); items taken from the buffer; calls done (spooled, refused)
        self.shipped_records, self.taken, self._calls_done = 0, 0, 0
        self._seq = spool.first_seq if spool is not None else 0
        self._bulk = BulkQueue()  # big parts of calls already taken, shipped a batch a round
        self._requests = Requests(buffer.ready)  # flush() and finish() waiting
        self._finished, self.closing = False, False  # closing: set once trackers are being closed, nothing more ships
        self.last_step = 0  # the trainer's latest step, as the records shipped said: the vitals go at it
        self.late_drops = 0  # records logged after finish()
        self.vitals: dict[str, float | int] = {}  # the latest ``tracklane/*`` figures, replaced whole at each batch
        # built on the thread that logs (the trainer's; a producer actor's): while it computes, batch longer
        self._busy = ThreadBusy() if cfg.busy_flush_interval_s > cfg.flush_interval_s else None
        self._wakeup = Wakeup(buffer.ready)
        self._thread = threading.Thread(target=self._run, name="tracklane-shipper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def seq(self) -> int:
        """The last batch handed to the lanes."""
        return self._seq

    @property
    def lanes(self) -> Lanes:
        return self._lanes

    @property
    def rejected_records(self) -> int:
        return self._converter.rejected

    # -- called from the trainer's thread (they only post a request and wait) ------------
    def flush(self, timeout: float) -> PipelineReport:
        return self._await(self._requests.post(closing=False, exit_code=0, timeout=timeout), timeout)

    def close(self, exit_code: int, timeout: float) -> PipelineReport:
        return self._await(self._requests.post(closing=True, exit_code=exit_code, timeout=timeout), timeout)

    def keep(self, timeout: float) -> bool:
        """Wait until what was put so far is in a spooled batch (or counted as not spooled); False on timeout."""
        return self._requests.post(closing=False, exit_code=0, timeout=timeout, keep=True).done.wait(timeout)

    def _await(self, barrier: Barrier, timeout: float) -> PipelineReport:
        if not self._thread.is_alive() and not barrier.done.is_set():
            return self._report(barrier, timed_out=True)
        if barrier.done.wait(timeout + ANSWER_S) and barrier.report is not None:
            return barrier.report
        log.warning("tracklane: the shipper thread did not answer within %.1f s", timeout)
        return self._report(barrier, timed_out=True)

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while not self._finished:
            try:
                self._sleep()
                self._ship(force=bool(self._requests))
                for lane in self._lanes.values():
                    pump_lane(lane)
                for stage in self._stages:
                    stage.round(self)
                self._release()
                self._serve_barriers()
                failures = 0
            except Exception:  # a bug here must not end delivery: log it, back off, go on
                failures += 1
                if failures == 1:
                    log.exception("tracklane: the shipper thread hit an error; retrying")
                time.sleep(min(1.0, 0.01 * failures))

    def _sleep(self) -> None:
        """The one wait (wakeup.py): for records due, a request posted, any awaited answer, or the earliest timed
        reason."""
        if self._bulk:  # a dump is being shipped: on with it (its batches, and what comes meanwhile)
            return
        now = time.monotonic()
        interval = self._interval()
        # an empty buffer is not due; a record put meanwhile wakes no one (log() stays lock-free), so look again
        # within an interval: it is shipped no later than one interval after it was logged
        wake_at = [now + self._buffer.due(interval), now + min(_IDLE_WAIT_S, interval)]
        wake_at += [stream.wake_at() for stream in all_streams(self._lanes)]
        wake_at += [d for b in self._requests.pending() for d in (b.drain_deadline, b.deadline) if d > now]
        self._wakeup.watch(self._waitables())
        self._wakeup.wait(min(wake_at) - now)

    def _waitables(self) -> list[Any]:
        refs = [ref for stream in all_streams(self._lanes) for ref in stream.waitables()]
        refs += [ref for stage in self._stages for ref in stage.waitables()]
        return refs + [ref for barrier in self._requests.pending() for ref in barrier.calls.values() if ref is not None]

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
        while not self.closing and self._buffer and (force or self._buffer.due(self._interval()) == 0):
            items = self._buffer.take(self._cfg.max_batch_bytes)
            self.taken += len(items)
            records, whole = self._records(items)
            if records:
                self.send(records, items=whole)
            self._calls_done += whole
        if not self.closing and self._bulk:
            records, done = self._bulk.next_batch(self._cfg.max_batch_bytes)
            if records:
                self.send(records, items=int(done), bulk=True)
            self._calls_done += int(done)

    def _records(self, items: list[Captured]) -> tuple[list[Record], int]:
        """The records to send now, and how many of ``items`` they complete; what is too big to send now is queued
        for the bulk stream."""
        records: list[Record] = []
        whole = 0
        for item in items:
            now, later = self._converter.staged(item, self._cfg.max_batch_bytes, BULK_BYTES)
            for record in now:
                records.append(record)
                if getattr(record, "axis", None) is None:  # the vitals go at the trainer's step
                    self.last_step = record.step
            if later:
                self._bulk.add(later)
            else:
                whole += 1
        if records and self._spool is not None and self._spool.logged is not None:
            records = self._spool.logged.keep_new(records)  # rank 0: a resumed run repeats no point of the trainer's
        if records:  # the pipeline's own figures, with every batch of calls (each process's own: not filtered)
            self.vitals = read_vitals(self._buffer, self._converter, self._lanes, self.late_drops, self._spool)
            if self._cfg.log_vitals:
                records.append(Metrics(step=self.last_step, values=dict(self.vitals), time=time.time()))
        return records, whole

    def send(self, records: list[Record], items: int = 0, bulk: bool = False) -> None:
        """One batch of ``records`` (``bulk``: for the bulk streams) to the spool and every stream that takes it."""
        blob = self._encode(records, self._cfg.bulk_compression_level if bulk else self._cfg.compression_level)
        if blob is None:
            return
        oldest = min(r.time for r in records)
        audience = _audience(records, bulk, self._lanes, self._converter.judges)
        # On disk before any lane can see it; a disk fault leaves it in the lanes' memory only (spool_keeper.py).
        spooled = self._spool is not None and self._spool.append(
            self._seq, len(records), oldest, blob, self._lanes, bulk, audience,
            calls=(self._calls_done, self._calls_done + items, self._buffer.dropped))
        entry = Entry(seq=self._seq, ref=None, nbytes=len(blob), records=len(records), oldest_log_time=oldest,
                      spooled=spooled, bulk=bulk, audience=audience)
        # Into Ray only if a lane holds it in memory: past their bounds, lanes read it back from the spool.
        if not spooled or any(stream.holds(entry) for stream in all_streams(self._lanes)):
            entry.ref = ray.put(shared(blob))
        self.shipped_records += len(records)
        for stream in all_streams(self._lanes):
            if self._cfg.overflow == "block" and stream.bulk == bulk:
                _wait_for_room(stream, entry.nbytes, time.monotonic() + self._cfg.block_timeout_s, self._wakeup)
            stream.offer(entry)

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

    def _release(self) -> None:
        if self._spool is not None:
            self._spool.release(self._stored_by_all())

    def _stored_by_all(self) -> int:  # every lane's tracker holds the batches up to here: the spool may forget them
        return min((lane_stored(lane) for lane in self._lanes.values()), default=self._seq)

    # -- barriers ------------------------------------------------------------------------
    def _serve_barriers(self) -> None:
        now = time.monotonic()
        for barrier in self._requests.pending():
            barrier.advance(self, now)

    # -- what a barrier asks of the shipper (barrier.py's BarrierHost) ------------------------
    def ship_before(self, barrier: Barrier, now: float) -> bool:
        self._ship(force=True)
        return not (self._bulk and now < barrier.drain_deadline)  # a dump: a batch a round, lanes pumped

    def settled(self, barrier: Barrier) -> bool:
        target = barrier.target if barrier.target is not None else self._seq
        return self._all_settled(target) and all([stage.settled(barrier, self) for stage in self._stages])

    def kept(self, barrier: Barrier) -> None:
        self._requests.answered(barrier)

    def call_trackers(self, barrier: Barrier) -> dict[str, Any]:
        if barrier.closing:
            self.closing = True
            for stream in all_streams(self._lanes):
                stream.freeze()  # nothing may reach a tracker after its close
        return self._tracker_calls.call(self._lanes, barrier.closing, barrier.exit_code)

    def calls_answered(self, barrier: Barrier) -> bool:
        return TrackerCalls.all_answered({name: ref for name, ref in barrier.calls.items() if ref is not None})

    def _all_settled(self, target: int) -> bool:
        return all(lane_settled(lane, target) for lane in self._lanes.values())

    def answer(self, barrier: Barrier, timed_out: bool) -> None:
        TrackerCalls.take_answers(self._lanes, {n: ref for n, ref in barrier.calls.items() if ref is not None},
                                  barrier.closing)
        unsettled = not self._all_settled(barrier.target if barrier.target is not None else self._seq)
        if barrier.closing and self._spool is not None:
            self._spool.close(barrier.exit_code, self._stored_by_all())
        for stage in self._stages if barrier.closing else ():
            stage.close(barrier)
        barrier.report = self._report(barrier, timed_out=timed_out or unsettled)
        for stage in self._stages:
            stage.answered(self)
        if barrier.closing:
            self._tracker_calls.end(self._lanes)
            self._finished = True
        self._requests.answered(barrier)

    def _report(self, barrier: Barrier, timed_out: bool) -> PipelineReport:
        report = PipelineReport(
            lanes={name: lane_report(lane) for name, lane in self._lanes.items()},
            buffered_records=len(self._buffer) + len(self._bulk),
            dropped_records=self._buffer.dropped + self.late_drops,
            elapsed_s=time.monotonic() - barrier.started,
            timed_out=timed_out,
            spool=self._spool.report() if self._spool is not None else None,
        )
        for stage in self._stages:
            stage.report(report, barrier, self)
        return self._converter.counted(report)


def _wait_for_room(stream: Stream, nbytes: int, deadline: float, wakeup: Wakeup) -> None:
    """The block policy: pump ``stream`` until it has room for ``nbytes`` or ``deadline`` (time.monotonic) passes."""
    while not stream.window.has_room(nbytes) and time.monotonic() < deadline:
        wakeup.watch(stream.waitables())
        wakeup.wait(min(stream.wake_at(), deadline) - time.monotonic())
        stream.pump()


def _audience(records: list[Record], bulk: bool, lanes: Lanes, judges: frozenset[str],
              ) -> frozenset[str] | None:
    """The lanes with a record in the batch (None: every lane); a bulk batch never goes to a judge."""
    names: set[str] = set()
    for record in records:
        if record.only is None:
            if not bulk:
                return None
            names.update(lanes)
            break
        names.update(record.only)
    if bulk:
        names -= judges
    return frozenset(names)
