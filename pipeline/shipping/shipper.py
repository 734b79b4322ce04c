"""The shipper thread: buffer -> batches -> msgpack + zstd -> spool -> Ray -> every lane.

Everything slow happens here, never on the caller's thread: cleaning values,
encoding, compression, the spool's appends, ``ray.put``, actor calls, collecting
acknowledgements, re-sending after an actor restart, and the flush/close barriers.
Shutdown is a request like a flush, with a deadline: drain, close each tracker, kill
the actors. A batch is in the spool before any lane sees it, and leaves it once every
lane's tracker acknowledged it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from pipeline.capture.captured import Captured
from pipeline.capture.convert import Converter
from pipeline.capture.rich import RecordLimits
from pipeline.config.async_log import AsyncLogConfig
from pipeline.core.acks import Ack
from pipeline.core.records import Batch, Metrics, Record, Text
from pipeline.core.report import PipelineReport, SpoolReport
from pipeline.shipping.buffer import RecordBuffer
from pipeline.shipping.hub import producer_reports, targets
from pipeline.shipping.lane import Entry, Lane
from pipeline.spool.recovery import Spooling
from pipeline.spool.segments import Spool, SpoolEntry
from pipeline.wire.batch import encode_batch

log = logging.getLogger("tracklane")

_IDLE_WAIT_S = 0.2  # longest sleep while nothing is due; bounds how stale health figures get
_BUSY_WAIT_S = 0.02  # sleep while a barrier is pending or answers are awaited


@dataclass(slots=True, kw_only=True)
class _Barrier:
    """A flush() or finish() waiting for the lanes; answered with a report."""

    closing: bool
    exit_code: int
    drain_deadline: float
    deadline: float
    started: float = field(default_factory=time.monotonic)
    target: int | None = None  # last seq that must be settled
    producer_targets: dict[str, int] | None = None  # closing: source id -> the producer's last batch before finish
    calls: dict[str, Any] = field(default_factory=dict)  # lane -> ref of flush()/close()
    done: threading.Event = field(default_factory=threading.Event)
    report: PipelineReport | None = None


class SpoolReloader:
    """Reads a batch that waited on disk back into Ray; lanes asking for the same batch share one object."""

    _KEPT = 4  # recent objects kept: lanes catching up read the same batches one after another

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._recent: OrderedDict[int, Any] = OrderedDict()

    def __call__(self, seq: int) -> Any:
        ref = self._recent.get(seq)
        if ref is None:
            blob = self._spool.read(seq)
            if blob is None:
                return None
            ref = self._recent[seq] = ray.put(blob)
            while len(self._recent) > self._KEPT:
                self._recent.popitem(last=False)
        return ref


class Shipper:
    def __init__(self, cfg: AsyncLogConfig, limits: RecordLimits, buffer: RecordBuffer, lanes: dict[str, Lane],
                 spooling: Spooling | None = None, first_seq: int = 0, owns_trackers: bool = True,
                 progress: Callable[[Shipper, bool], None] | None = None, hub: Any = None,
                 key_prefix: str = "", axis: str | None = None) -> None:
        """``owns_trackers``: rank 0's shipper closes the trackers at its close; a producer's only drains.
        ``key_prefix``: put before every key and record name (a producer's name), here, off the caller's thread;
        ``axis``: what the metrics' steps count (a producer's own axis).
        ``progress(shipper, force)`` runs after each round (a producer tells the hub how far it got).
        ``hub``: rank 0's ``ProducerHub`` handle, if producers were made: its close waits for them."""
        self._cfg = cfg
        self._owns_trackers = owns_trackers
        self._progress = progress
        self.hub = hub
        self._hub_ref: Any = None  # a snapshot() call in flight
        self._hub_view: bytes | None = None  # the latest snapshot
        self.shipped_records = 0  # records handed to the lanes (health records included)
        self.taken = 0  # items taken out of the buffer
        self._buffer = buffer
        self._lanes = lanes
        self._converter = Converter(limits, key_prefix, axis, backends=list(lanes))
        self._spooling = spooling
        self._released = 0  # every lane acknowledged batches up to here
        self._evicted_lost = 0  # records the spool's bound deleted before the slowest lane had them
        self._dead_told: set[str] = set()  # lanes whose giving up was logged to the others
        self._seq = first_seq
        self._barriers: list[_Barrier] = []  # guarded by the buffer's lock
        self._finished = False
        self._closing = False  # set once trackers are being closed: nothing more is shipped
        self._last_step = 0
        self.late_drops = 0  # records logged after finish()
        self.health: dict[str, float | int] = {}
        """The latest ``tracklane/*`` figures, replaced whole at each batch (a reader never sees half)."""
        self._thread = threading.Thread(target=self._run, name="tracklane-shipper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def seq(self) -> int:
        """The last batch handed to the lanes."""
        return self._seq

    @property
    def lanes(self) -> dict[str, Lane]:
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

    def _post(self, *, closing: bool, exit_code: int, timeout: float, drain_share: float) -> _Barrier:
        now = time.monotonic()
        barrier = _Barrier(closing=closing, exit_code=exit_code,
                           drain_deadline=now + timeout * drain_share, deadline=now + timeout)
        with self._buffer.ready:
            self._barriers.append(barrier)
            self._buffer.ready.notify()
        return barrier

    def _await(self, barrier: _Barrier, timeout: float) -> PipelineReport:
        if not self._thread.is_alive() and not barrier.done.is_set():
            return self._report(barrier, timed_out=True)
        if barrier.done.wait(timeout + 5.0) and barrier.report is not None:
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
        wait = min(self._buffer.due(self._cfg.flush_interval_s), _IDLE_WAIT_S)
        refs = [ref for lane in self._lanes.values() for ref in lane.waitables()]
        if self._barriers or refs:
            wait = min(wait, _BUSY_WAIT_S if self._barriers else 0.05)
        if wait <= 0:
            return
        if refs:
            ray.wait(refs, num_returns=1, timeout=wait)  # wakes as soon as any actor answers
        else:
            with self._buffer.ready:
                self._buffer.ready.wait(wait)

    def _ship(self, force: bool) -> None:
        while not self._closing and self._buffer and (force or self._buffer.due(self._cfg.flush_interval_s) == 0):
            items = self._buffer.take(self._cfg.max_batch_bytes)
            self.taken += len(items)
            records = self._records(items)
            if records:
                self._send(records)

    def _records(self, items: list[Captured]) -> list[Record]:
        records = []
        for item in items:
            for record in self._converter.records(item):
                records.append(record)
                if getattr(record, "axis", None) is None:  # the health figures go at the trainer's step
                    self._last_step = record.step
        if records:
            self.health = self._health()
            if self._cfg.health_metrics:
                records.append(Metrics(step=self._last_step, values=dict(self.health), time=time.time()))
        return records

    def _health(self) -> dict[str, float | int]:
        lanes = self._lanes.values()
        figures: dict[str, float | int] = {
            "tracklane/queue_bytes": self._buffer.nbytes,
            "tracklane/dropped_records": self._buffer.dropped + self.late_drops
            + sum(lane.report.dropped_records for lane in lanes),
            "tracklane/skipped_values": self._converter.metrics.skipped,
            "tracklane/rejected_records": self._converter.rejected,
            "tracklane/lag_s": max((lane.lag_s() for lane in lanes), default=0.0),
        }
        if self._spooling is not None:
            figures["tracklane/spool_bytes"] = self._spooling.spool.nbytes
        for lane in lanes:
            figures[f"tracklane/lane/{lane.name}/lag_s"] = lane.lag_s()
            figures[f"tracklane/lane/{lane.name}/unacked_bytes"] = lane.unacked_bytes
            figures[f"tracklane/lane/{lane.name}/failed_records"] = lane.report.failed_records
        return figures

    def _send(self, records: list[Record]) -> None:
        blob = self._encode(records)
        if blob is None:
            return
        oldest = min(r.time for r in records)
        if self._spooling is not None:  # on disk before any lane can see it
            self._evicted(self._spooling.spool.append(self._seq, len(records), oldest, blob))
        entry = Entry(seq=self._seq, ref=ray.put(blob), nbytes=len(blob), records=len(records), oldest_log_time=oldest)
        self.shipped_records += len(records)
        for lane in self._lanes.values():
            if self._cfg.overflow == "block":
                self._wait_for_room(lane, entry.nbytes)
            lane.offer(entry)

    def _encode(self, records: list[Record]) -> bytes | None:
        """The batch's bytes (its seq taken). A record msgpack cannot take (an int past 64 bits, say) is
        rejected and counted alone, not with the batch around it; the records list is trimmed in place."""
        level = self._cfg.compression_level
        try:
            blob = encode_batch(Batch(seq=self._seq + 1, created=time.time(), records=records), level)
        except Exception:
            kept = []
            for record in records:
                try:
                    encode_batch(Batch(seq=0, created=0.0, records=[record]), level)
                except Exception:
                    self._converter.rejected += 1
                    log.warning("tracklane: a %s record at step %s cannot be encoded; skipped (counted)",
                                record.kind, record.step, exc_info=True)
                else:
                    kept.append(record)
            records[:] = kept
            if not kept:
                return None
            blob = encode_batch(Batch(seq=self._seq + 1, created=time.time(), records=records), level)
        self._seq += 1
        return blob

    def _wait_for_room(self, lane: Lane, nbytes: int) -> None:
        deadline = time.monotonic() + self._cfg.block_timeout_s
        while not lane.has_room(nbytes) and time.monotonic() < deadline:
            refs = lane.waitables()
            if refs:
                ray.wait(refs, num_returns=1, timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            else:
                time.sleep(0.01)
            lane.pump()

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
    def _evicted(self, entries: list[SpoolEntry]) -> None:
        if not entries:
            return
        seqs = {e.seq for e in entries}
        lost = {lane.name: lane.evicted(seqs) for lane in self._lanes.values()}
        self._evicted_lost += max(lost.values(), default=0)
        if any(lost.values()):
            log.warning("tracklane: the spool reached spool_max_bytes=%d and evicted batches %d-%d; records lost "
                        "that a tracker did not have yet: %s", self._cfg.spool_max_bytes, entries[0].seq,
                        entries[-1].seq, ", ".join(f"{name} {n}" for name, n in lost.items() if n))

    def _release(self) -> None:
        if self._spooling is None:
            return
        floor = self._acked_by_all()
        if floor > self._released:
            self._spooling.spool.release(floor)
            self._released = floor
        self._spooling.spool.sync_if_due()

    def _acked_by_all(self) -> int:
        """Every lane's tracker holds the batches up to here: the spool may forget them."""
        return min((lane.acked for lane in self._lanes.values()), default=self._seq)

    def _spool_report(self) -> SpoolReport | None:
        if self._spooling is None:
            return None
        spool = self._spooling.spool
        stats = spool.stats
        return SpoolReport(directory=spool.directory, nbytes=spool.nbytes, batches=spool.batches,
                           evicted_records=self._evicted_lost, damaged=stats.damaged, torn_bytes=stats.torn_bytes,
                           recovered_batches=self._spooling.recovered)

    def _close_spool(self, exit_code: int) -> None:
        """The runs are closed: record how, and delete what every tracker has (the last segment too)."""
        if self._spooling is None:
            return
        spool = self._spooling.spool
        self._spooling.manifest.exit_code = exit_code
        try:
            self._spooling.manifest.save(spool.directory)
        finally:
            spool.close()
            spool.release(self._acked_by_all())

    # -- barriers ------------------------------------------------------------------------
    def _serve_barriers(self) -> None:
        if not self._barriers:
            return
        now = time.monotonic()
        for barrier in list(self._barriers):
            if barrier.target is None:  # everything logged before the request goes out first
                self._ship(force=True)
                barrier.target = self._seq
            if not barrier.calls and ((self._all_settled(barrier.target) and self._producers_settled(barrier))
                                      or now >= barrier.drain_deadline):
                barrier.calls = self._call_lanes(barrier)
            if barrier.calls and (self._calls_done(barrier) or now >= barrier.deadline):
                self._answer(barrier, timed_out=now >= barrier.deadline)

    def _all_settled(self, target: int) -> bool:
        return all(lane.settled(target) for lane in self._lanes.values())

    def _producers_settled(self, barrier: _Barrier) -> bool:
        """Closing: every live lane has what each producer handed it before finish() (as the hub knew it)."""
        if not barrier.closing or self.hub is None:
            return True
        view = self._poll_hub()
        if barrier.producer_targets is None:
            if view is None:
                return False

            barrier.producer_targets = targets(view)
        behind = [lane for lane in self._lanes.values() if not lane.dead
                  and any(lane.sources.get(source, 0) < seq for source, seq in barrier.producer_targets.items())]
        for lane in behind:
            lane.refresh()  # ask its actor how far each producer got
        return not behind

    def _poll_hub(self) -> bytes | None:
        """The hub's latest snapshot, asking again when the last answer came (never blocks)."""
        if self._hub_ref is None:
            self._hub_ref = self.hub.snapshot.remote()
        if ray.wait([self._hub_ref], timeout=0)[0]:
            try:
                self._hub_view = ray.get(self._hub_ref)
            except Exception as exc:  # the hub died: producers cannot be waited for
                log.warning("tracklane: the producers' hub cannot be read (%s); not waiting for producers", exc)
                self.hub, self._hub_view = None, b"\x80"
            self._hub_ref = None
        return self._hub_view

    def _call_lanes(self, barrier: _Barrier) -> dict[str, Any]:
        calls = {}
        for name, lane in self._lanes.items():
            if barrier.closing:
                self._closing = True
                lane.freeze()  # nothing may reach a tracker after its close
            if not lane.dead and self._owns_trackers:  # a producer's lanes settled: nothing to ask the trackers
                method = lane.actor.close if barrier.closing else lane.actor.flush
                calls[name] = method.remote(barrier.exit_code) if barrier.closing else method.remote()
        return calls or {"": None}  # nothing to call: the barrier is answered at once

    def _calls_done(self, barrier: _Barrier) -> bool:
        refs = [ref for ref in barrier.calls.values() if ref is not None]
        return not refs or len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == len(refs)

    def _answer(self, barrier: _Barrier, timed_out: bool) -> None:
        results = self._collect(barrier.calls)
        for name, result in results.items():
            if isinstance(result, Ack):
                self._lanes[name].accept(result)
            else:
                self._lanes[name].report.error = result
        for name in barrier.calls:
            if name and name not in results and barrier.closing:  # a flush that timed out is only late (timed_out)
                self._lanes[name].report.error = "did not answer before the deadline"
        unsettled = not self._all_settled(barrier.target if barrier.target is not None else self._seq)
        if barrier.closing:
            self._close_spool(barrier.exit_code)
        barrier.report = self._report(barrier, timed_out=timed_out or unsettled)
        if self._progress is not None:
            self._progress(self, True)
        if barrier.closing:
            if self._owns_trackers:
                self._kill_actors()
            self._finished = True
        with self._buffer.ready:
            self._barriers.remove(barrier)
        barrier.done.set()

    def _collect(self, calls: dict[str, Any]) -> dict[str, Ack | str]:
        """Each answered call's ``Ack``, or the error that stood in for it."""
        results: dict[str, Ack | str] = {}
        for name, ref in calls.items():
            if ref is None:
                continue
            if ray.wait([ref], timeout=0)[0]:
                try:
                    results[name] = Ack.unpack(ray.get(ref))
                except Exception as exc:  # the actor died while closing
                    results[name] = f"{type(exc).__name__} while closing"
        return results

    def _kill_actors(self) -> None:
        for lane in self._lanes.values():
            try:
                ray.kill(lane.actor, no_restart=True)
            except Exception:  # already gone
                pass

    def _report(self, barrier: _Barrier, timed_out: bool) -> PipelineReport:
        return self._converter.counted(PipelineReport(
            lanes={name: lane.snapshot() for name, lane in self._lanes.items()},
            buffered_records=len(self._buffer),
            dropped_records=self._buffer.dropped + self.late_drops,
            elapsed_s=time.monotonic() - barrier.started,
            timed_out=timed_out,
            spool=self._spool_report(),
            producers=self._producer_reports(barrier.closing),
        ))

    def _producer_reports(self, closing: bool) -> dict[str, Any]:
        if closing and self.hub is not None:  # the producers' last words (a wait of a few ms)
            try:
                self._hub_view = ray.get(self.hub.snapshot.remote(), timeout=2.0)
            except Exception as exc:
                log.warning("tracklane: the producers' hub cannot be read (%s)", exc)
        if self._hub_view is None:
            return {}

        return producer_reports(self._hub_view, self._lanes)
