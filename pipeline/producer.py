"""Logging into the same run from any Ray actor or task: ``Tracking.producer(name)``.

A ``Producer`` is a small picklable spec: the run's lane actors (Ray handles), the run's
``ProducerHub``, the pipeline settings and its name. Passed to a Ray actor or task, it starts, on
its first ``log*()`` call in that process, its own bounded buffer, spool folder and shipper thread (what it
shipped outlives its process: rank 0 delivers a dead producer's spool; only its unshipped tail, at most a flush
interval, dies with it, and is counted). Its batches go straight
to the lane actors, numbered in its own sequence (the actors keep a watermark per sender), so
they never pass through rank 0's thread, and each producer's order is kept.

Every producer reports to the run's hub (shipping/hub.py), which rank 0's ``finish()`` reads.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from tracklane.log_calls import LogCalls
from tracklane.shipping.hub import ProducerSpec

log = logging.getLogger("tracklane")


class Producer(LogCalls):
    """``log``, ``log_generations``, ``log_trajectories``, ``log_histogram``, ``log_text``, ``log_image``,
    ``log_artifact`` and ``flush(timeout)``, as on ``Tracking``, from any process of the Ray job.

    ``key_prefix`` (default ``"<name>/"``) goes before every metric key and rich record name, so
    producers logging the same keys stay apart; pass ``""`` to log under the keys as given. ``axis``
    names what its metrics' steps count (``rollout/step``, ``param_version``; None: the trainer's step),
    so a producer a step or more behind the trainer loses nothing (wandb keeps it as the step metric).
    """

    def __init__(self, name: str, spec: ProducerSpec, key_prefix: str | None = None, axis: str | None = None) -> None:
        """``spec``: what the run's asynchronous path hands out for its producers (``Tracking.producer``)."""
        self.name = name
        self.key_prefix = f"{name}/" if key_prefix is None else key_prefix
        self.axis = axis
        self.spec = spec
        self.backends = list(spec.lanes)
        self._init_local()

    def _init_local(self) -> None:
        self._pipeline: Any = None  # its ProducerPipeline (shipping/producer_pipeline.py), from the first call
        self._lock = threading.Lock()
        self._report = None
        self._rejected = 0
        self._put: Any = self._start  # rebound to the buffer's puts once started
        self._put_bulk: Any = self._start_bulk

    def __getstate__(self) -> dict[str, Any]:
        # Only the spec travels: each process that unpickles it starts its own buffer and shipper.
        return {"name": self.name, "key_prefix": self.key_prefix, "axis": self.axis, "spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.key_prefix, self.axis, self.spec = state["name"], state["key_prefix"], state["axis"], state["spec"]
        self.backends = list(self.spec.lanes)
        self._init_local()

    def _start(self, item: Any) -> None:
        self._started().put(item)

    def _start_bulk(self, item: Any) -> None:
        self._started().put_bulk(item)

    def _started(self) -> Any:
        from tracklane.shipping.producer_pipeline import ProducerPipeline  # Ray: loaded where a producer logs

        with self._lock:
            if self._pipeline is None:
                self._pipeline = ProducerPipeline(self.name, self.key_prefix, self.axis, self.spec)
                self._put, self._put_bulk = self._pipeline.put, self._pipeline.put_bulk
        return self._pipeline

    @property
    def sender(self) -> str:
        """This process's sender id for the producer ("" before its first call)."""
        return self._pipeline.sender if self._pipeline is not None else ""

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
