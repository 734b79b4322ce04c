"""One producer's pipeline in its own process: a bounded buffer, its lanes and a shipper thread, no spool.

What it shipped lives in Ray; its unshipped tail dies with its process. It reports its figures to the
run's hub (hub.py) after each shipper round, at most every ``REPORT_EVERY_S`` unless a barrier forces it.
"""

from __future__ import annotations

import atexit
import dataclasses
import time
import uuid
from typing import Any

from pipeline.capture.convert import Converter
from pipeline.node.identity import ray_node_id
from pipeline.node.system_metrics import start_node_sampling
from pipeline.shipping.buffer import RecordBuffer
from pipeline.shipping.hub import REPORT_EVERY_S, ProducerFigures, ProducerSpec
from pipeline.shipping.lane import Lane, LaneSettings
from pipeline.shipping.shipper import Shipper


class ProducerPipeline:
    """One producer's buffer, lanes and shipper thread in one process."""

    def __init__(self, name: str, key_prefix: str, axis: str | None, spec: ProducerSpec) -> None:
        actors, hub, cfg, limits, run = spec.lanes, spec.hub, spec.cfg, spec.limits, spec.run
        self.source = f"{name}#{uuid.uuid4().hex[:10]}"
        cfg = dataclasses.replace(cfg, health_metrics=False, spool=False)  # rank 0 reports the pipeline's figures
        settings = LaneSettings.of(cfg)
        lanes = {lane: Lane(lane, actor, settings, source=self.source) for lane, actor in actors.items()}
        self.buffer = RecordBuffer(cfg.queue_max_bytes, cfg.max_batch_bytes, cfg.overflow, cfg.block_timeout_s)
        self._figures = ProducerFigures(name=name)
        self._hub = hub
        self._last_report = 0.0
        # A producer's shipper: its own converter (its name before every key, its axis), no spool, no tracker
        # calls (its lanes settling is enough), and its figures told to the hub after each round.
        converter = Converter(limits, key_prefix, axis, backends=list(lanes))
        self._shipper = Shipper(cfg, self.buffer, lanes, converter, progress=self._progress)
        self.put = self.buffer.put
        self._shipper.start()
        self._sampling = start_node_sampling(self.put, run[0], cfg.system_metrics_s, run[1], ray_node_id() or None) \
            if run[0] else None
        atexit.register(self._close_at_exit)

    def _progress(self, shipper: Any, force: bool) -> None:
        """Called by the shipper thread after each round: tell the hub, at most every 0.25 s unless forced."""
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_EVERY_S:
            return
        self._last_report = now
        figures = self._figures
        lanes = [lane.snapshot() for lane in shipper.lanes.values()]
        figures.logged = shipper.taken + len(self.buffer) + self.buffer.dropped
        figures.shipped, figures.seq, figures.rejected = shipper.shipped_records, shipper.seq, shipper.rejected_records
        figures.buffer_dropped = self.buffer.dropped
        figures.lane_dropped = max((lane.dropped_records for lane in lanes), default=0)
        try:
            self._hub.update.remote(self.source, figures.pack())
        except Exception:  # rank 0 is gone (its hub with it): nothing left to tell
            pass

    def flush(self, timeout: float) -> bool:
        return self._shipper.flush(timeout).complete

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
        return report.complete
