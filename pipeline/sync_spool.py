"""What the synchronous path (``log_async: false``) could not deliver, kept for ``tracklane replay``.

The asynchronous path spools every batch before a tracker sees it; the synchronous one writes straight into its
trackers, so it spools only what a tracker did not take after its retries (an outage that outlived them, or
records it refused): one batch per failed write, in the asynchronous path's format (segments.py), in the run's
``spool_dir``, opened at the first failure (a run where every write went through leaves nothing on disk).

One folder, one command, each record once: every spooled record is addressed (``Record.only``) to the one tracker
that lacked it, so a replay's lanes each apply their own records and skip the rest. The manifest names only the
trackers that lack something (a replay opens no other), and each one's lane state says how to re-attach to its
tracker run (``resume``: MLflow's run id, ...), so the replay continues the same run. The replay's lanes then
record what they were handed, and a second replay delivers nothing. Limits: a write that failed half-way is spooled
whole (as the asynchronous path re-sends a held batch whole), and ``--to`` a tracker that did not fail delivers
nothing from this spool (its records are addressed to the trackers that lacked them).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.errors import ConfigError
from tracklane.core.records import Record, RunSpec
from tracklane.core.report import SpoolReport
from tracklane.spool.lane_state import LaneState
from tracklane.spool.manifest import RunManifest, lanes_dir, state_path
from tracklane.spool.recovery import set_aside_stale
from tracklane.spool.segments import Spool
from tracklane.wire.batch import encode_what_encodes

log = logging.getLogger("tracklane")


class SyncSpool:
    def __init__(self, cfg: AsyncLogConfig, run: RunSpec, settings: Mapping[str, dict[str, Any]]) -> None:
        """``settings``: every backend's resolved settings (the manifest keeps those of the trackers that failed)."""
        self._cfg = cfg
        self._run = run
        self._settings = settings
        self._spool: Spool | None = None  # opened at the first failure
        self._manifest: RunManifest | None = None
        self._seq = 0
        self._broken = False  # the spool itself failed (disk full, ...): warned once, nothing more spooled
        self.records: dict[str, int] = {}
        """Records spooled per tracker."""

    def keep(self, lane: str, records: Sequence[Record], resume: Mapping[str, Any] | None) -> None:
        """Spool ``records`` that tracker ``lane`` did not take, as one batch addressed to it; never raises."""
        if not records or self._broken:
            return
        try:
            self._append(lane, records, resume)
        except Exception as exc:  # the training loop never sees the spool fail; the records stay counted failed
            self._broken = True
            log.warning("tracklane: the spool %s cannot keep what %s did not take (%s: %s); those records are lost",
                        self._cfg.spool_dir, lane, type(exc).__name__, exc)

    def _append(self, lane: str, records: Sequence[Record], resume: Mapping[str, Any] | None) -> None:
        spool, manifest = self._open()
        if lane not in manifest.backends:  # the first failure of this tracker: the replay opens it, in its run
            manifest.backends[lane] = self._settings[lane]
            manifest.save(spool.directory)
            self._save_state(lane, resume)
        addressed = [dataclasses.replace(record, only=[lane]) for record in records]
        blob, kept, refused = encode_what_encodes(addressed, self._seq + 1, time.time())
        for record, exc in refused:
            log.warning("tracklane: a %s record of step %s cannot be spooled (%s); lost", record.kind, record.step, exc)
        if blob is None:
            return
        self._seq += 1
        evicted = spool.append(self._seq, len(kept), min(r.time for r in kept), blob)
        if evicted:
            log.warning("tracklane: the spool reached spool_max_bytes and evicted %d batch(es) before their replay",
                        len(evicted))
        self.records[lane] = self.records.get(lane, 0) + len(kept)

    def _open(self) -> tuple[Spool, RunManifest]:
        if self._spool is not None and self._manifest is not None:
            return self._spool, self._manifest
        directory = self._cfg.spool_dir
        assert directory, "the spool folder is resolved before the pipeline starts"
        set_aside_stale(directory, self._run)
        spool = Spool(directory, max_bytes=self._cfg.spool_max_bytes, segment_bytes=self._cfg.spool_segment_bytes,
                      fsync_s=self._cfg.spool_fsync_s)
        os.makedirs(lanes_dir(directory), mode=0o700, exist_ok=True)
        # A resumed run's folder may hold what its earlier process left: keep its trackers, number after every
        # batch any lane was handed (a lane skips what it thinks it holds).
        states = glob.glob(os.path.join(lanes_dir(directory), "*.state"))
        self._seq = max([spool.last_seq, *(LaneState.load(path).stored_of("") for path in states)])
        self._manifest = RunManifest(run=self._run, backends=_earlier_backends(directory))
        self._spool = spool
        return spool, self._manifest

    def _save_state(self, lane: str, resume: Mapping[str, Any] | None) -> None:
        """How the replay re-attaches to the tracker run (None: it never opened; the replay finds or starts it)."""
        assert self._spool is not None
        state = LaneState.load(state_path(self._spool.directory, lane))
        if resume is not None:
            state.resume = dict(resume)
        state.save()

    def report(self) -> SpoolReport | None:
        """The spool, once it holds something (None before the first failure)."""
        if self._spool is None:
            return None
        spool = self._spool
        return SpoolReport(directory=spool.directory, nbytes=spool.nbytes, batches=spool.batches,
                           evicted_records=spool.stats.evicted_records)

    def close(self, exit_code: int, resumes: Mapping[str, Mapping[str, Any] | None]) -> None:
        """Record how the runs were closed and how to re-attach to each spooled tracker's run (``resumes``: now
        known for a tracker that opened after its first failure), then let the spool go."""
        if self._spool is None or self._manifest is None:
            return
        try:
            self._manifest.exit_code = exit_code
            self._manifest.save(self._spool.directory)
            for lane in self.records:
                self._save_state(lane, resumes.get(lane))
        except Exception as exc:  # the batches are on disk; a replay without them reopens the runs by run id
            log.warning("tracklane: the spool %s could not note how the run ended (%s: %s)",
                        self._spool.directory, type(exc).__name__, exc)
        finally:
            self._spool.close()


def _earlier_backends(directory: str) -> dict[str, dict[str, Any]]:
    """The trackers an earlier process of this run spooled for (none in a new folder)."""
    try:
        return RunManifest.load(directory).backends
    except ConfigError:
        return {}
