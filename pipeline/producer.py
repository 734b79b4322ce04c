"""Logging into the same run from any Ray actor or task: ``Tracking.producer(name)``.

A ``Producer`` is a small picklable spec: the run's lane actors (Ray handles), the run's
``ProducerHub``, the pipeline settings and its name. Passed to a Ray actor or task, it starts, on
its first ``log*()`` call in that process, its own bounded buffer and shipper thread (no spool:
what it shipped lives in Ray; its unshipped tail dies with its process). Its batches go straight
to the lane actors, numbered in its own sequence (the actors keep a watermark per source), so
they never pass through rank 0's thread, and each producer's order is kept.

The hub is one small actor per run that every producer reports to (what it logged, shipped and
dropped, the last batch it handed its lanes): rank 0's ``finish()`` reads it to wait until the
lanes have what live producers shipped before it was called, and to count what they lost.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack

from .config import AsyncLogConfig
from .log_calls import LogCalls
from .rich import RecordLimits
from .system_metrics import start_node_sampling

log = logging.getLogger("tracklane")

_REPORT_EVERY_S = 0.25  # how often a producer tells the hub how far it got (and at each barrier)
GONE_AFTER_S = 3.0
"""A producer that has not reported for this long is taken for dead: finish() stops waiting for its batches."""


class ProducerHub:
    """The run's record of its producers (a Ray actor with no CPU): source id -> latest figures."""

    def __init__(self) -> None:
        self._figures: dict[str, dict[str, Any]] = {}
        self._at: dict[str, float] = {}  # source -> monotonic time of its latest report

    def update(self, source: str, figures: bytes) -> None:
        self._figures[source] = msgpack.unpackb(figures, raw=False)
        self._at[source] = time.monotonic()

    def snapshot(self) -> bytes:
        now = time.monotonic()
        return msgpack.packb({source: {**f, "age_s": now - self._at[source]} for source, f in self._figures.items()},
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
    """Its last batch handed to the lanes: rank 0's finish waits until every live lane has it."""
    closed: bool = False
    """It flushed and stopped (its process is ending)."""

    def pack(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self), use_bin_type=True)


class Producer(LogCalls):
    """``log``, ``log_generations``, ``log_trajectories``, ``log_histogram``, ``log_text``, ``log_image``,
    ``log_artifact`` and ``flush(timeout)``, as on ``Tracking``, from any process of the Ray job.

    ``key_prefix`` (default ``"<name>/"``) goes before every metric key and rich record name, so
    producers logging the same keys stay apart; pass ``""`` to log under the keys as given. ``axis``
    names what its metrics' steps count (``rollout/step``, ``param_version``; None: the trainer's step),
    so a producer a step or more behind the trainer loses nothing (wandb keeps it as the step metric).
    """

    def __init__(self, name: str, lanes: dict[str, Any], hub: Any, cfg: AsyncLogConfig, limits: RecordLimits,
                 key_prefix: str | None = None, axis: str | None = None, run: tuple[str, float] = ("", 0.0)) -> None:
        """``run``: the run's id and start time (for the node's system metrics)."""
        self.name = name
        self.run = run
        self.key_prefix = f"{name}/" if key_prefix is None else key_prefix
        self.axis = axis
        self.backends = list(lanes)
        self._lanes = lanes
        self._hub = hub
        self._cfg = cfg
        self._limits = limits
        self._init_local()

    def _init_local(self) -> None:
        self._pipeline: _ProducerPipeline | None = None
        self._lock = threading.Lock()
        self._report = None
        self._rejected = 0
        self._put: Any = self._start  # rebound to the buffer's put once started

    def __getstate__(self) -> dict[str, Any]:
        # Only the spec travels: each process that unpickles it starts its own buffer and shipper.
        return {"name": self.name, "key_prefix": self.key_prefix, "axis": self.axis, "run": self.run,
                "lanes": self._lanes, "hub": self._hub, "cfg": self._cfg, "limits": self._limits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.key_prefix, self.axis, self.run = state["name"], state["key_prefix"], state["axis"], state["run"]
        self._lanes, self._hub, self._cfg, self._limits = state["lanes"], state["hub"], state["cfg"], state["limits"]
        self.backends = list(self._lanes)
        self._init_local()

    def _start(self, item: Any) -> None:
        with self._lock:
            if self._pipeline is None:
                self._pipeline = _ProducerPipeline(self.name, self.key_prefix, self.axis, self._lanes, self._hub,
                                                   self._cfg, self._limits, self.run)
                self._put = self._pipeline.put
        self._pipeline.put(item)

    @property
    def source(self) -> str:
        """This process's source id for the producer ("" before its first call)."""
        return self._pipeline.source if self._pipeline is not None else ""

    def _drop_late(self) -> None:  # a producer has no finish of its own: never late
        pass

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait (up to ``timeout``) until every lane acknowledged what this process logged so far."""
        if self._pipeline is None:
            return True
        return self._pipeline.flush(timeout)

    def close(self, timeout: float = 30.0) -> bool:
        """Flush and stop this process's shipper (at interpreter exit this runs by itself)."""
        if self._pipeline is None:
            return True
        return self._pipeline.close(timeout)


class _ProducerPipeline:
    """One producer's buffer, lanes and shipper thread in one process."""

    def __init__(self, name: str, key_prefix: str, axis: str | None, actors: dict[str, Any], hub: Any,
                 cfg: AsyncLogConfig, limits: RecordLimits, run: tuple[str, float]) -> None:
        from .buffer import RecordBuffer
        from .lane import Lane
        from .shipper import Shipper

        self.source = f"{name}#{uuid.uuid4().hex[:10]}"
        cfg = dataclasses.replace(cfg, health_metrics=False, spool=False)  # rank 0 reports the pipeline's figures
        lanes = {lane: Lane.configured(lane, actor, cfg, source=self.source) for lane, actor in actors.items()}
        self.buffer = RecordBuffer(cfg.queue_max_bytes, cfg.max_batch_bytes, cfg.overflow, cfg.block_timeout_s)
        self._figures = ProducerFigures(name=name)
        self._hub = hub
        self._last_report = 0.0
        self._shipper = Shipper(cfg, limits, self.buffer, lanes, owns_trackers=False, progress=self._progress,
                                key_prefix=key_prefix, axis=axis)
        self.put = self.buffer.put
        self._shipper.start()
        self._sampling = start_node_sampling(self.put, run[0], cfg.system_metrics_s, run[1], _node_id()) \
            if run[0] else None
        atexit.register(self._close_at_exit)

    def _progress(self, shipper: Any, force: bool) -> None:
        """Called by the shipper thread after each round: tell the hub, at most every 0.25 s unless forced."""
        now = time.monotonic()
        if not force and now - self._last_report < _REPORT_EVERY_S:
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


def producer_reports(snapshot: bytes, lanes: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's view of every producer at finish: ``ProducerReport`` by source id."""
    from .report import ProducerReport

    figures: dict[str, dict[str, Any]] = msgpack.unpackb(snapshot, raw=False)
    out = {}
    for source, f in figures.items():
        behind = sorted(name for name, lane in lanes.items() if not lane.dead and lane.sources.get(source, 0) < f["seq"])
        out[source] = ProducerReport(
            name=f["name"], source=source, logged=f["logged"], shipped=f["shipped"],
            dropped=f["buffer_dropped"] + f["lane_dropped"], rejected=f["rejected"], closed=f["closed"],
            unshipped=max(0, f["logged"] - f["shipped"] - f["buffer_dropped"] - f["rejected"]), lanes_behind=behind)
    return out


def targets(snapshot: bytes) -> dict[str, int]:
    """source id -> the last batch it handed its lanes, for the producers still alive (reporting), from a
    hub snapshot. A dead producer's calls in flight died with it: nothing to wait for."""
    return {source: int(f["seq"]) for source, f in msgpack.unpackb(snapshot, raw=False).items()
            if f["closed"] or f["age_s"] < GONE_AFTER_S}


__all__ = ["Producer", "ProducerFigures", "ProducerHub", "producer_reports", "targets"]


def _node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
