"""A judge's way into the trackers from its lane actor: a producer named after its lane (producer_pipeline.py).

The reduce and health judges (workers/sinks/reduce.py, health.py) receive like a tracker and emit like a producer:
what they compute goes into every tracker through their own streams, spool and hub reports, so the lanes carry
records one way and rank 0's close waits for the judges as for any producer. ``keep()`` is their one wait: what
they emitted is on disk before they save the state that says so.

The producer starts with the judge's first emission (a health judge of a healthy run never starts one: no thread,
no streams, no hub reports on a busy node), or at once where its folder holds what a predecessor did not deliver.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from tracklane.capture.captured import RECORD, Captured
from tracklane.core.records import Record
from tracklane.shipping.hub import ProducerSpec
from tracklane.shipping.producer_pipeline import ProducerPipeline
from tracklane.spool.producers import producers_dir

log = logging.getLogger("tracklane")

KEEP_S = 30.0  # a judge waits this long at most for its spool (a disk fault makes it count, not wait)
_RECORD_BYTES = 256  # what the buffer counts for a judge's record (a step's points or an alert: small)


class JudgeEmitter:
    def __init__(self, lane: str, spec: ProducerSpec, judged: Callable[[], dict[str, Any]]) -> None:
        """``spec``: the lanes it emits into (every tracker's, and a judge's that judges what this one emits);
        ``judged``: the judge's figures, told to the hub with its progress."""
        self._lane, self._spec, self._judged = lane, spec, judged
        self._pipeline: ProducerPipeline | None = None
        self._unkept = False  # emitted since the last keep()
        folder = os.path.join(producers_dir(spec.cfg.spool_dir), lane) if spec.cfg.spool_dir else ""
        if folder and glob.glob(os.path.join(folder, "seg-*")):  # a predecessor's batches: delivered from now on
            self._started()

    def _started(self) -> ProducerPipeline:
        if self._pipeline is None:
            self._pipeline = ProducerPipeline(self._lane, "", None, self._spec, sender=self._lane, judged=self._judged)
        return self._pipeline

    def emit(self, records: Sequence[Record]) -> None:
        if not records:
            return
        pipeline = self._started()
        for record in records:
            pipeline.put(Captured(record.step, record, record.time, None, RECORD, _RECORD_BYTES))
        self._unkept = True

    def keep(self) -> None:
        if not self._unkept or self._pipeline is None:  # nothing new: most batches, for most judges
            return
        self._unkept = False
        started = time.monotonic()
        if not self._pipeline.keep(KEEP_S):
            log.warning("tracklane: a judge's records were not on disk within %.0f s", time.monotonic() - started)

    def close(self, timeout: float) -> bool:
        if self._pipeline is None and any(self._judged().values()):  # its figures still reach the run's report
            self._started()
        return self._pipeline.close(timeout) if self._pipeline is not None else True
