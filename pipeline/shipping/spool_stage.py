"""Rank 0's spool as the shipper uses it: each batch on disk before any lane sees it, forgotten once
every lane's tracker has it; a batch that waited on disk is read back into Ray when a lane needs it."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import ray

from pipeline.core.report import SpoolReport
from pipeline.shipping.lane import Lane
from pipeline.spool.recovery import Spooling
from pipeline.spool.segments import Spool

log = logging.getLogger("tracklane")


class SpoolStage:
    def __init__(self, spooling: Spooling, max_bytes: int) -> None:
        """``max_bytes``: the spool's bound (``spool_max_bytes``), named in the eviction warning."""
        self.spooling = spooling
        self._max_bytes = max_bytes
        self.spool = spooling.spool
        self._released = 0  # every lane acknowledged batches up to here
        self._evicted_lost = 0  # records the spool's bound deleted before the slowest lane had them

    @property
    def first_seq(self) -> int:
        """The last sequence number an earlier process of this run used."""
        return self.spooling.first_seq

    def append(self, seq: int, records: int, oldest: float, blob: bytes, lanes: Iterable[Lane]) -> None:
        """On disk before any lane can see it; batches the spool's bound evicts are lost to lanes that lacked them."""
        evicted = self.spool.append(seq, records, oldest, blob)
        if not evicted:
            return
        seqs = {e.seq for e in evicted}
        lost = {lane.name: lane.evicted(seqs) for lane in lanes}
        self._evicted_lost += max(lost.values(), default=0)
        if any(lost.values()):
            log.warning("tracklane: the spool reached spool_max_bytes=%d and evicted batches %d-%d; records lost "
                        "that a tracker did not have yet: %s", self._max_bytes, evicted[0].seq,
                        evicted[-1].seq, ", ".join(f"{name} {n}" for name, n in lost.items() if n))

    def release(self, acked_by_all: int) -> None:
        """Every lane's tracker holds the batches up to ``acked_by_all``: forget them; sync when due."""
        if acked_by_all > self._released:
            self.spool.release(acked_by_all)
            self._released = acked_by_all
        self.spool.sync_if_due()

    def report(self) -> SpoolReport:
        stats = self.spool.stats
        return SpoolReport(directory=self.spool.directory, nbytes=self.spool.nbytes, batches=self.spool.batches,
                           evicted_records=self._evicted_lost, damaged=stats.damaged, torn_bytes=stats.torn_bytes,
                           recovered_batches=self.spooling.recovered)

    def close(self, exit_code: int, acked_by_all: int) -> None:
        """The runs are closed: record how, and delete what every tracker has (the last segment too)."""
        self.spooling.manifest.exit_code = exit_code
        try:
            self.spooling.manifest.save(self.spool.directory)
        finally:
            self.spool.close()
            self.spool.release(acked_by_all)


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
