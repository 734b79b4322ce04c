"""Rank 0's spool as the shipper uses it: each batch on disk before any lane sees it, forgotten once
every lane's tracker has it; a batch that waited on disk is read back into Ray when a lane needs it.

A disk fault (full, read-only, failing, the folder removed) never reaches the shipper's loop: durability
goes off (durability.py), batches stay in the lanes' memory only and are counted as not spooled, and the
disk is tried again every second until a batch goes through.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import OrderedDict
from typing import Any

import ray

from tracklane.core.report import SpoolReport
from tracklane.shipping.lane import Lanes, lost_on_eviction
from tracklane.spool.durability import Durability
from tracklane.spool.logged_steps import LoggedSteps
from tracklane.spool.manifest import MANIFEST
from tracklane.spool.producers import Tally
from tracklane.spool.recovery import Spooling
from tracklane.spool.segments import Spool, SpoolEntry
from tracklane.wire.batch import decode_batch, shared

log = logging.getLogger("tracklane")
_CHECK_S = 1.0  # how often to look for a removed folder: writes into one succeed and go nowhere


class SpoolKeeper:
    """Keeps what a shipper shipped on its disk until every tracker stored it (not a loop ``Stage``)."""

    def __init__(self, spooling: Spooling, max_bytes: int, tally: Tally | None = None,
                 logged: LoggedSteps | None = None) -> None:
        """``max_bytes``: the spool's bound (``spool_max_bytes``), named in the eviction warning. ``tally``: a
        producer's exact counts on disk, told which calls each batch holds before it is spooled. ``logged``: a
        judge's notes of what it emitted (rank 0 opens its own from the run's manifest)."""
        self.spooling = spooling
        self._tally = tally
        self._max_bytes = max_bytes
        self.spool = spooling.spool
        # rank 0's: the last step of each metric key the run shipped (a resumed run leaves out what it repeats)
        self.logged = logged if spooling.manifest is None else LoggedSteps.open(
            self.spool, spooling.manifest.run.resume, lambda blob: decode_batch(blob).records)
        if self.logged is not None:
            self.spool.before_forget = self.logged.save
        self._released = 0  # every lane's tracker stored the batches up to here
        self._evicted_lost = 0  # records the spool's bound deleted before the slowest lane had them
        self.durability = Durability(what=f"the spool {self.spool.directory}",
                                     while_off="new batches stay in the lanes' memory only (a lane over "
                                               "lane_max_bytes drops and counts them)")
        self._unspooled_batches = 0  # shipped while durability was off, or lost from disk with removed files
        self._unspooled_records = 0
        self._checked = time.monotonic()

    @property
    def first_seq(self) -> int:
        """The last sequence number an earlier process of this run used."""
        return self.spooling.first_seq

    @property
    def durable(self) -> bool:
        return self.durability.on

    def append(self, seq: int, records: int, oldest: float, blob: bytes, lanes: Lanes, bulk: bool = False,
               audience: frozenset[str] | None = None, calls: tuple[int, int, int] = (0, 0, 0)) -> bool:
        """On disk before any lane can see it: True. False when the disk refused it: the batch is then in the
        lanes' memory only. Batches the spool's bound evicts are lost to lanes that lacked them. ``calls``: the
        captured calls it completes (first, end) and the buffer's drops so far, for a producer's tally."""
        if self._tally is not None:
            self._tally.spooling(seq, *calls)
        spooled = self._append(seq, records, oldest, blob, lanes, bulk, audience)
        if not spooled and self._tally is not None:
            self._tally.unspooled(seq, records)
        return spooled

    def _append(self, seq: int, records: int, oldest: float, blob: bytes, lanes: Lanes, bulk: bool,
                audience: frozenset[str] | None) -> bool:
        if not self.durability.due():
            return self._not_spooled(1, records)
        try:
            if not self.durability.on:
                self._restore(lanes)
            evicted = self.spool.append(seq, records, oldest, blob, bulk, audience)
        except OSError as exc:
            self.durability.failed(exc)
            return self._not_spooled(1, records)
        self.durability.succeeded()
        lost = self._forget(evicted, lanes)
        self._evicted_lost += max(lost.values(), default=0)
        if any(lost.values()):
            log.warning("tracklane: the spool reached spool_max_bytes=%d and evicted batches %d-%d; records lost "
                        "that a tracker did not have yet: %s", self._max_bytes, evicted[0].seq,
                        evicted[-1].seq, ", ".join(f"{name} {n}" for name, n in lost.items() if n))
        return True

    def _restore(self, lanes: Lanes) -> None:
        """Before trying the disk again: make a removed folder again (its manifest too); batches whose files went
        with it before every tracker had them are no longer on disk."""
        gone = [e for e in self.spool.restore() if e.seq > self._released]
        manifest = self.spooling.manifest
        if manifest is not None and not os.path.exists(os.path.join(self.spool.directory, MANIFEST)):
            manifest.save(self.spool.directory)
        if gone:
            self._not_spooled(len(gone), sum(e.records for e in gone))
            lost = self._forget(gone, lanes)
            log.warning("tracklane: spooled batches %d-%d were removed with their files; records lost that a tracker "
                        "did not have yet: %s", gone[0].seq, gone[-1].seq,
                        ", ".join(f"{name} {n}" for name, n in lost.items() if n) or "none")

    @staticmethod
    def _forget(gone: list[SpoolEntry], lanes: Lanes) -> dict[str, int]:
        """These batches left the disk: each lane keeps those it holds in memory; returns what each lost."""
        return lost_on_eviction(lanes, {e.seq for e in gone}) if gone else {}

    def _not_spooled(self, batches: int, records: int) -> bool:
        self._unspooled_batches += batches
        self._unspooled_records += records
        return False

    def _releasable(self, stored_by_all: int) -> int:
        """Through which batch the spool may forget: what every lane's tracker stored, and every tracker of the run
        this process does not deliver to (recovery.py ``held_back``)."""
        held = self.spooling.held_back
        return stored_by_all if held is None else min(stored_by_all, held)

    def release(self, stored_by_all: int) -> None:
        """Every lane's tracker stored the batches up to ``stored_by_all``: forget them; sync when due."""
        stored_by_all = self._releasable(stored_by_all)
        try:
            if stored_by_all > self._released:
                self.spool.release(stored_by_all)
                self._released = stored_by_all
            if self.durability.on:
                self.spool.sync_if_due()
                self._check_folder()
        except OSError as exc:
            self.durability.failed(exc)

    def _check_folder(self) -> None:
        now = time.monotonic()
        if now - self._checked >= _CHECK_S:
            self._checked = now
            if not self.spool.intact():
                raise FileNotFoundError(errno.ENOENT, "the spool's folder or segment was removed", self.spool.directory)

    def report(self) -> SpoolReport:
        stats = self.spool.stats
        return SpoolReport(directory=self.spool.directory, nbytes=self.spool.nbytes, batches=self.spool.batches,
                           evicted_records=self._evicted_lost, damaged=stats.damaged, torn_bytes=stats.torn_bytes,
                           recovered_batches=self.spooling.recovered,
                           repeated_points=self.logged.skipped if self.logged else 0,
                           repeated_steps=self.logged.skipped_steps if self.logged else None,
                           durability_off_since=self.durability.off_since, durability_outages=self.durability.outages,
                           durability_off_s=self.durability.off_s, unspooled_batches=self._unspooled_batches,
                           unspooled_records=self._unspooled_records, disk_error=self.durability.last_error,
                           held_for=dict(self.spooling.held_for))

    def close(self, exit_code: int, stored_by_all: int) -> None:
        """The runs are closed: record how, and delete what every tracker has (the last segment too)."""
        manifest = self.spooling.manifest
        try:
            try:
                if manifest is not None:  # a producer's spool has none: the run's is rank 0's
                    manifest.exit_code = exit_code
                    manifest.save(self.spool.directory)
                if self.logged is not None:  # for a resume after this close, whatever the spool still deletes
                    self.logged.save()
            finally:
                self.spool.close()
                self.spool.release(self._releasable(stored_by_all))
        except OSError as exc:  # a disk fault at the end costs the manifest's exit code, never the report
            self.durability.failed(exc)


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
            ref = self._recent[seq] = ray.put(shared(blob))
            while len(self._recent) > self._KEPT:
                self._recent.popitem(last=False)
        return ref
