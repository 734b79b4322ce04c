"""One producer's pipeline in its own process: a bounded buffer, its spool, its lanes and a shipper thread.

With the run's spool on, each batch is in the producer's own spool folder (spool/producers.py) before
its lanes see it, and the folder's lock says the producer lives: if its process dies, rank 0 delivers
what the folder holds (orphans.py), and the tally there counts exactly the calls that never reached it.
It reports its figures to the run's hub (hub.py) after each shipper round, at most every
``REPORT_EVERY_S`` unless a barrier forces it.

A judge's producer (``sender``: its lane's name, judge_emitter.py) is the same with a name that outlives its
process: a restarted judge takes its own spool folder back (rank 0 never adopts it), numbers its batches after
every one it ever spooled, and leaves out what an earlier process of it emitted (spool/logged_steps.py).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from typing import Any

from tracklane.capture.convert import Converter
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.errors import ConfigError
from tracklane.node.identity import ray_node_id
from tracklane.node.system_metrics import start_node_sampling
from tracklane.shipping.buffer import RecordBuffer
from tracklane.shipping.hub import REPORT_EVERY_S, ProducerFigures, ProducerSpec
from tracklane.shipping.lane import dropped_records, lane_offered, lane_preload, open_lane
from tracklane.shipping.shipper import Shipper
from tracklane.shipping.spool_keeper import SpoolKeeper, SpoolReloader
from tracklane.shipping.stages import ProgressStage
from tracklane.shipping.stream import StreamSettings
from tracklane.spool.logged_steps import LoggedSteps
from tracklane.spool.producers import Tally, producers_dir, read_tally, write_mark
from tracklane.spool.recovery import Spooling
from tracklane.spool.segments import Spool
from tracklane.wire.batch import decode_batch

log = logging.getLogger("tracklane")

_LOCKED_WAIT_S = 30.0


class ProducerPipeline:
    """One producer's buffer, lanes and shipper thread in one process."""

    def __init__(self, name: str, key_prefix: str, axis: str | None, spec: ProducerSpec, *, sender: str = "",
                 judged: Callable[[], dict[str, Any]] | None = None) -> None:
        """``sender`` and ``judged``: a judge's (its lane's name; its figures for the run's report)."""
        self.sender = sender or f"{name}#{uuid.uuid4().hex[:10]}"
        self._judge = bool(sender)
        self._judged = judged
        cfg = dataclasses.replace(spec.cfg, log_vitals=False)  # rank 0 reports the pipeline's figures
        self._folder = os.path.join(producers_dir(cfg.spool_dir), self.sender) if cfg.spool_dir else ""
        folder = self._folder
        spool = self._open_spool(cfg, name) if self._folder else None
        last_seq = self._last_seq(spool, folder)
        self._tally = self._open_tally() if spool is not None else None
        self.buffer = RecordBuffer(cfg.queue_max_bytes, cfg.max_batch_bytes, cfg.overflow, cfg.block_timeout_s)
        self._figures = ProducerFigures(name=name)
        self._hub = spec.hub
        self._last_report = 0.0
        converter = Converter(spec.limits, key_prefix, axis, backends=list(spec.lanes), traits=spec.traits)
        self._shipper = self._shipper_for(cfg, spool, converter, spec.lanes, last_seq)
        self.put = self._counted_put if self._tally is not None else self.buffer.put
        self.put_bulk = self._counted_put_bulk if self._tally is not None else self.buffer.put_bulk
        self._shipper.start()
        run_id, started = spec.run
        self._sampling = start_node_sampling(self.put, run_id, cfg.system_metrics_s, started, ray_node_id() or None) \
            if run_id else None
        atexit.register(self._close_at_exit)

    def _shipper_for(self, cfg: AsyncLogConfig, spool: Spool | None, converter: Converter,
                     actors: dict[str, Any], last_seq: int) -> Shipper:
        """A producer's shipper: its own converter (its name before every key, its axis), its own spool (with its
        tally) and lanes, no tracker calls (its lanes settling is enough), and its figures told to the hub after
        each round. A judge's takes back what its spool holds (``last_seq``: the last batch it ever numbered)."""
        reload = SpoolReloader(spool) if spool is not None else None
        settings = StreamSettings.of(cfg)
        lanes = {name: open_lane(name, actor, settings, reload=reload, sender=self.sender) for name, actor in actors.items()}
        stage = None
        if spool is not None:
            logged = LoggedSteps.open(spool, True, lambda blob: decode_batch(blob).records) if self._judge else None
            stage = SpoolKeeper(Spooling(spool=spool, manifest=None, first_seq=last_seq), cfg.spool_max_bytes,
                                self._tally, logged=logged)
            entries = spool.entries()
            for lane in lanes.values():
                lane_preload(lane, entries, through=last_seq)
        return Shipper(cfg, self.buffer, lanes, converter, spool=stage, stages=[ProgressStage(self._progress)])

    def _last_seq(self, spool: Spool | None, folder: str) -> int:
        """A judge numbers after every batch its folder ever held (its tally says so where the spool is not ours)."""
        if not self._judge or not folder:
            return 0
        return max(spool.last_seq if spool is not None else 0, read_tally(folder).seq)

    def _open_spool(self, cfg: AsyncLogConfig, name: str) -> Spool | None:
        """Its own folder under the run's spool, locked while it lives; None (no spool) if the disk refuses. A
        judge's folder may still be locked by its predecessor (a killed run's actor, until its process is gone):
        it waits for it, up to ``_LOCKED_WAIT_S``."""
        waited_until = time.monotonic() + (_LOCKED_WAIT_S if self._judge else 0.0)
        while True:
            try:
                return self._spool_in_folder(cfg, name)
            except ConfigError as exc:  # locked
                if time.monotonic() < waited_until:
                    time.sleep(0.2)
                    continue
                error: Exception = exc
            except OSError as exc:
                error = exc
            break
        log.warning("tracklane: producer %s cannot spool in %s (%s); what it ships lives only in Ray", self.sender,
                    self._folder, error)
        self._folder = ""
        return None

    def _spool_in_folder(self, cfg: AsyncLogConfig, name: str) -> Spool:
        spool = Spool(self._folder, max_bytes=cfg.spool_max_bytes, segment_bytes=cfg.spool_segment_bytes,
                      fsync_s=cfg.spool_fsync_s)
        write_mark(self._folder, name, self.sender)
        return spool

    def _open_tally(self) -> Tally | None:
        try:
            return Tally(self._folder)
        except OSError as exc:  # its disk is full: a death's tail is then counted only as the hub last heard
            log.warning("tracklane: producer %s cannot keep its tally in %s (%s)", self.sender, self._folder, exc)
            return None

    def _counted_put(self, item: Any) -> None:
        self.buffer.put(item)
        self._tally.put()  # type: ignore[union-attr]

    def _counted_put_bulk(self, item: Any) -> None:
        self.buffer.put_bulk(item)
        self._tally.put()  # type: ignore[union-attr]

    def _progress(self, shipper: Any, force: bool) -> Any:
        """Called by the shipper thread after each round: tell the hub, at most every 0.25 s unless forced."""
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_EVERY_S:
            return None
        self._last_report = now
        figures = self._figures
        figures.logged = shipper.taken + len(self.buffer) + self.buffer.dropped
        figures.shipped, figures.seq, figures.rejected = shipper.shipped_records, shipper.seq, shipper.rejected_records
        figures.lanes = {name: lane_offered(lane) for name, lane in shipper.lanes.items()}
        figures.buffer_dropped = self.buffer.dropped
        figures.lane_dropped = max((dropped_records(lane) for lane in shipper.lanes.values()), default=0)
        figures.judged = self._judged() if self._judged is not None else {}
        try:
            return self._hub.update.remote(self.sender, figures.pack())
        except Exception:  # rank 0 is gone (its hub with it): nothing left to tell
            return None

    def flush(self, timeout: float) -> bool:
        return self._shipper.flush(timeout).complete

    def keep(self, timeout: float) -> bool:
        """Everything put so far into a spooled batch (or counted as not spooled), and the hub told so before this
        returns (a judge: rank 0's close then waits for it); True unless ``timeout`` passed first."""
        import ray

        if not self._shipper.keep(timeout):
            return False
        told = self._progress(self._shipper, True)
        try:
            ray.get(told, timeout=timeout) if told is not None else None
        except Exception:  # the hub is gone or slow: rank 0 asks again
            return False
        return True

    def _close_at_exit(self) -> None:
        import ray

        if ray.is_initialized():  # after ray.shutdown() there is nothing to ship to (and no Ray to start again)
            self.close(10.0)

    def close(self, timeout: float) -> bool:
        if self._figures.closed:
            return True
        self._figures.closed = True
        if self._sampling is not None:
            self._sampling.stop()
        report = self._shipper.close(0, timeout)
        if self._tally is not None:
            self._tally.close()
        if self._folder and report.complete and not self._judge:  # every tracker has it all: nothing to take over
            # (a judge's folder stays: its tally numbers the batches of its next process, a resumed run's)
            shutil.rmtree(self._folder, ignore_errors=True)
        return report.complete
