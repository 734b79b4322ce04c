"""Opening a run's spool: set aside a stale one, read what an earlier process left behind.

On ``resume`` the folder of the run being continued is reopened (and repaired, spool.py): every
batch it holds that some lane's tracker had not stored is offered to that lane again, and new
batches are numbered after everything any lane was ever handed, so one run has one sequence across
its processes and a re-sent batch is never handed twice. Without ``resume`` a folder holding an
earlier spool is renamed aside, never reused or deleted.

A tracker the run had that this process does not deliver to (``tracklane replay --to`` another one, a resumed run
with fewer loggers) still owns what its store lacks: the manifest keeps naming it, and the spool keeps those
batches for it (``Spooling.held_back``) until a delivery to it takes them.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.errors import ConfigError
from tracklane.core.records import RunSpec
from tracklane.spool.lane_state import LaneState, bulk_sender
from tracklane.spool.manifest import RunManifest, holds_a_spool, lanes_dir, state_path, stored_copy_path
from tracklane.spool.segments import Spool, SpoolEntry

log = logging.getLogger("tracklane")


@dataclass(slots=True, kw_only=True)
class Spooling:
    """The spool as the shipper uses it, and what it held when it was opened."""

    spool: Spool
    manifest: RunManifest | None
    """The run's (rank 0's spool); None for a producer's own spool."""
    first_seq: int = 0
    """The last sequence number used by an earlier process of this run (new batches follow it)."""
    pending: dict[str, list[SpoolEntry]] = field(default_factory=dict)
    """Per lane, the spooled batches its tracker had not stored."""
    recovered: int = 0
    """Batches some lane still lacked when the spool was opened."""
    stored_copies: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per lane, rank 0's copy of what its tracker's store held (sender -> last batch): handed to its actor."""
    held_back: int | None = None
    """The run's trackers this process does not deliver to lack batches from here on (None: they lack none): the
    spool keeps them."""
    held_for: dict[str, int] = field(default_factory=dict)
    """Per such tracker, the records it lacks (kept for it)."""
    others_stored: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per such tracker, what its store holds of each sender (rank 0's streams and the producers'): a dead
    producer's spool is kept for it too (orphans.py)."""

    @property
    def state_dir(self) -> str:
        return lanes_dir(self.spool.directory)


def open_spooling(cfg: AsyncLogConfig, run: RunSpec, backends: dict[str, dict[str, Any]]) -> Spooling:
    directory = cfg.spool_dir
    assert directory, "the spool folder is resolved before the pipeline starts"
    set_aside_stale(directory, run)
    others = {name: settings for name, settings in _earlier_backends(directory).items() if name not in backends}
    spool = Spool(directory, max_bytes=cfg.spool_max_bytes, segment_bytes=cfg.spool_segment_bytes,
                  fsync_s=cfg.spool_fsync_s, retention_s=cfg.spool_retention_s)
    os.makedirs(lanes_dir(directory), mode=0o700, exist_ok=True)
    manifest = RunManifest(run=run, backends={**others, **backends})
    manifest.save(directory)
    copies = {name: LaneState.load(stored_copy_path(directory, name)).stored for name in manifest.backends}
    states = {name: LaneState.load(state_path(directory, name)).stored for name in manifest.backends}
    stored = {name: _newer(states[name], copies[name], ("", bulk_sender(""))) for name in manifest.backends}  # rank 0's
    entries = list(spool.entries())
    _forgive_delivered_gaps(spool, entries, min((min(s.values()) for s in stored.values()), default=0))
    pending = {name: lacking(entries, name, stored[name]) for name in manifest.backends}
    first_seq = max([spool.last_seq, *(seq for s in stored.values() for seq in s.values())])
    recovered = len({e.seq for name in backends for e in pending[name]})
    if recovered:
        log.warning("tracklane: resuming run %s: %d spooled batch(es) not yet in every tracker are delivered first",
                    run.run_id, recovered)
    held = {name: pending[name] for name in others if pending[name]}
    if held:
        log.warning("tracklane: the spool %s keeps what %s lack%s (not delivered by this process); deliver with: "
                    "tracklane replay %s --to %s", directory, ", ".join(held), "s" if len(held) == 1 else "",
                    directory, ",".join(held))
    return Spooling(spool=spool, manifest=manifest, first_seq=first_seq,
                    pending={name: pending[name] for name in backends}, recovered=recovered,
                    stored_copies={name: copies[name] for name in backends if any(copies[name].values())},
                    held_back=min((entries[0].seq - 1 for entries in held.values()), default=None),
                    held_for={name: sum(e.records for e in entries) for name, entries in held.items()},
                    others_stored={name: _newer(states[name], copies[name]) for name in others})


def lacking(entries: list[SpoolEntry], name: str, stored: dict[str, int], sender: str = "") -> list[SpoolEntry]:
    """The batches of ``sender``'s spool ("": rank 0's) tracker ``name`` lacks, given what its store holds of each
    sender (``LaneState.stored``): those past its watermark for their stream that hold records for it."""
    small, bulk = stored.get(sender, 0), stored.get(bulk_sender(sender), 0)
    return [e for e in entries if e.seq > (bulk if e.bulk else small) and (e.audience is None or name in e.audience)]


def held_back(entries: list[SpoolEntry], others: dict[str, dict[str, int]], sender: str = "") -> int | None:
    """Through which batch the trackers ``others`` (name -> what its store holds of each sender) hold every batch
    of ``entries`` meant for them (None: all of them)."""
    firsts = [missing[0].seq for name, stored in others.items() if (missing := lacking(entries, name, stored, sender))]
    return min(firsts) - 1 if firsts else None


def _earlier_backends(directory: str) -> dict[str, dict[str, Any]]:
    """The trackers an earlier process of this run delivered to, as its manifest names them ({}: none)."""
    try:
        return RunManifest.load(directory).backends
    except ConfigError:  # no manifest (a new run), or a damaged one (said when it is read for a replay)
        return {}


def _newer(state: dict[str, int], copy: dict[str, int], senders: tuple[str, ...] = ()) -> dict[str, int]:
    """What a lane's tracker holds of each sender (of ``senders`` only, if given): its state or rank 0's copy,
    whichever is ahead."""
    return {sender: max(state.get(sender, 0), copy.get(sender, 0)) for sender in senders or {*state, *copy}}


def set_aside_stale(directory: str, run: RunSpec) -> None:
    """Without ``resume``, a folder holding an earlier spool is renamed aside, never reused or deleted."""
    if not run.resume and holds_a_spool(directory):
        aside = f"{directory}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(directory, aside)
        log.warning("tracklane: %s held the spool of an earlier run with this id and resume is off; moved to %s",
                    directory, aside)


def _forgive_delivered_gaps(spool: Spool, entries: list[SpoolEntry], delivered: int) -> None:
    """Batches missing from the spool that every lane's tracker holds are no loss: the earlier process ran with
    durability off for a while (a full disk) and delivered them from memory. Only the others count as missing."""
    if not spool.stats.missing_batches or not entries:
        return
    present = {e.seq for e in entries}
    spool.stats.missing_batches = sum(1 for seq in range(max(entries[0].seq, delivered + 1), entries[-1].seq + 1)
                                      if seq not in present)
