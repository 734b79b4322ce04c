"""Opening a run's spool: set aside a stale one, read what an earlier process left behind.

On ``resume`` the folder of the run being continued is reopened (and repaired, spool.py): every
batch it holds that some lane's tracker had not acknowledged is handed back to that lane, and new
batches are numbered after everything any lane ever applied, so one run has one sequence across
its processes and a re-sent batch is never applied twice. Without ``resume`` a folder holding an
earlier spool is renamed aside, never reused or deleted.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.config.async_log import AsyncLogConfig
from pipeline.core.records import RunSpec
from pipeline.spool.lane_state import LaneState
from pipeline.spool.manifest import RunManifest, holds_a_spool, lanes_dir, state_path
from pipeline.spool.segments import Spool, SpoolEntry

log = logging.getLogger("tracklane")


@dataclass(slots=True, kw_only=True)
class Spooling:
    """The spool as the shipper uses it, and what it held when it was opened."""

    spool: Spool
    manifest: RunManifest
    first_seq: int = 0
    """The last sequence number used by an earlier process of this run (new batches follow it)."""
    pending: dict[str, list[SpoolEntry]] = field(default_factory=dict)
    """Per lane, the spooled batches its tracker had not acknowledged."""
    recovered: int = 0
    """Batches some lane still lacked when the spool was opened."""

    @property
    def state_dir(self) -> str:
        return lanes_dir(self.spool.directory)


def open_spooling(cfg: AsyncLogConfig, run: RunSpec, backends: dict[str, dict[str, Any]]) -> Spooling:
    directory = cfg.spool_dir
    assert directory, "the spool folder is resolved before the pipeline starts"
    if not run.resume and holds_a_spool(directory):
        aside = f"{directory}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(directory, aside)
        log.warning("tracklane: %s held the spool of an earlier run with this id and resume is off; moved to %s",
                    directory, aside)
    spool = Spool(directory, max_bytes=cfg.spool_max_bytes, segment_bytes=cfg.spool_segment_bytes,
                  fsync_s=cfg.spool_fsync_s, retention_s=cfg.spool_retention_s)
    os.makedirs(lanes_dir(directory), mode=0o700, exist_ok=True)
    manifest = RunManifest(run=run, backends=backends)
    manifest.save(directory)
    applied = {name: LaneState.load(state_path(directory, name)).applied for name in backends}
    entries = list(spool.entries())
    pending = {name: [e for e in entries if e.seq > applied[name]] for name in backends}
    first_seq = max([spool.last_seq, *applied.values()])
    recovered = len({e.seq for lane in pending.values() for e in lane})
    if recovered:
        log.warning("tracklane: resuming run %s: %d spooled batch(es) not yet in every tracker are delivered first",
                    run.run_id, recovered)
    return Spooling(spool=spool, manifest=manifest, first_seq=first_seq, pending=pending, recovered=recovered)
