"""The one interface both paths offer ``Tracking``, and the factory that picks one.

``log_async: true`` gives ``AsyncPipeline`` (buffer, shipper thread, one Ray actor per tracker);
``false`` gives ``SyncPipeline`` (the same sink hosts, in-process). ``Tracking`` talks to either
through ``Pipe`` and never asks which it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tracklane.capture.captured import Captured
from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.records import RunSpec
from tracklane.core.report import LaneInfo, PipelineReport


class Pipe(Protocol):
    @property
    def vitals(self) -> dict[str, float | int]:
        """The latest ``tracklane/*`` figures (empty on the synchronous path)."""

    def put(self, item: Captured) -> None:
        """Take one captured ``log*()`` call of a small record; never raises."""

    def put_bulk(self, item: Captured) -> None:
        """Take one captured call of a bulk kind (``BULK_KINDS``: rollouts, generations, images, artifacts)."""

    def drop_late(self) -> None:
        """Count a record logged after ``close()``."""

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every tracker is open (or failed to open); False if ``timeout`` passed first."""

    def lanes(self) -> dict[str, LaneInfo]:
        """Where each tracker's sink host runs."""

    def last_step(self) -> Any:
        """The step of the newest item put (as the caller passed it; None before the first)."""

    def flush(self, timeout: float) -> PipelineReport:
        """Barrier: returns once every tracker has what was put so far, or at ``timeout``."""

    def close(self, exit_code: int, timeout: float) -> PipelineReport:
        """Drain, close every tracker with ``exit_code``, and report; bounded by ``timeout``."""

    def producer_spec(self) -> Any:
        """What a ``Producer`` of this run needs (``ProducerSpec``; asynchronous path only)."""


def open_pipe(log_async: bool, cfg: AsyncLogConfig, limits: RecordLimits, run: RunSpec,
              backends: dict[str, tuple[type, dict[str, Any]]], env: Mapping[str, str]) -> Pipe:
    if log_async:
        from tracklane.shipping.async_pipeline import AsyncPipeline

        return AsyncPipeline(cfg, limits, run, backends, env)
    from tracklane.sync_pipeline import SyncPipeline

    return SyncPipeline(cfg, limits, run, backends)
