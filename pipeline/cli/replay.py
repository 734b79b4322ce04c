"""Delivering a spool without the trainer, through the same lanes: ``tracklane replay``, and ``migrate``'s delivery."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from tracklane.core.records import RunSpec
from tracklane.core.report import PipelineReport
from tracklane.spool.manifest import RunManifest


def replay_spool(directory: str, to: list[str] | None, exit_code: int | None, timeout: float, progress: bool) -> int:
    from tracklane.host.registry import backend_class, resolve_backends

    manifest = RunManifest.load(directory)
    names = to or list(manifest.backends)
    # The run's own trackers keep the settings they were logged with (the same runs, the same folders);
    # a tracker the run never had is set up from this environment, like a new run's.
    new = resolve_backends([n for n in names if n not in manifest.backends], manifest.run, os.environ, {})
    backends = {name: new[name] if name in new else (backend_class(name), manifest.backends[name]) for name in names}
    code = exit_code if exit_code is not None else (manifest.exit_code if manifest.exit_code is not None else 1)
    report = deliver_spool(directory, manifest.run, backends, code, timeout, progress, "replay")
    return 1 if undelivered(report) else 0


def deliver_spool(directory: str, run: RunSpec, backends: dict[str, tuple[type, dict[str, Any]]], exit_code: int,
                  timeout: float, progress: bool, desc: str) -> PipelineReport:
    """Deliver what the spool at ``directory`` holds into ``backends`` through the lanes (replay and migrate),
    with a progress bar; close the tracker runs with ``exit_code`` and print the report."""
    from tracklane.capture.rich import RecordLimits
    from tracklane.config.async_log import AsyncLogConfig
    from tracklane.shipping.async_pipeline import AsyncPipeline

    # No vitals and no system metrics: they would be the delivering machine's, not the run's. Normal priority:
    # no trainer here to yield to (at idle, a replay on a busy node took 10 minutes for 300 records).
    cfg = AsyncLogConfig(spool_dir=os.path.abspath(directory), log_vitals=False, system_metrics_s=0,
                         finish_timeout_s=max(timeout, 1.0), spool_max_bytes=2**62, background_priority="normal")
    pipe = AsyncPipeline(cfg, RecordLimits(), run, backends, os.environ)
    deadline = time.monotonic() + timeout
    # Barriers only once every lane's actor answered (each opened its tracker): the progress bar counts deliveries.
    pipe.wait_ready(timeout)
    _wait_with_progress(pipe, deadline, progress, desc)
    report = pipe.close(exit_code, max(5.0, deadline - time.monotonic()))
    print(report.summary(), file=sys.stderr)
    return report


def undelivered(report: PipelineReport) -> dict[str, int]:
    """Per tracker, the records it lacks (said on stderr); empty when every tracker has everything."""
    left = {name: lane.unstored_records for name, lane in report.lanes.items() if not lane.complete}
    if left:
        print(f"tracklane: not everything arrived: {left}; run the same command again when the tracker is back", file=sys.stderr)
    return left


def _wait_with_progress(pipe: Any, deadline: float, progress: bool, desc: str) -> None:
    """Barrier after barrier (one second each) until every lane's tracker was handed everything, with a bar of
    records. A barrier that did not time out means that (its lanes settled); what a tracker still holds in memory
    (wandb-core's newest block) is durable once close() ends the runs, so waiting for it here would only wait
    out the deadline."""
    bar = None
    total = None
    while time.monotonic() < deadline:
        report = pipe.flush(min(1.0, max(0.1, deadline - time.monotonic())))
        waiting = sum(lane.unstored_records for lane in report.lanes.values())
        if total is None:
            total = waiting
            bar = progress_bar(progress, desc, total)
        settled = not report.timed_out
        if bar is not None:
            bar.n = total if settled else max(0, total - waiting)
            bar.refresh()
        if waiting == 0 or settled:
            break
    if bar is not None:
        bar.close()


def progress_bar(shown: bool, desc: str, total: int | None = None) -> Any:
    """A tqdm bar of records on stderr, or None when it is not ``shown``."""
    if not shown:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="record", desc=desc, file=sys.stderr)
