"""A judge's way into the trackers from its lane actor: a producer named after its lane (producer_pipeline.py).

The reduce and health judges (workers/sinks/reduce.py, health.py) receive like a tracker and emit like a producer:
what they compute goes into every tracker through their own streams, spool and hub reports, so the lanes carry
records one way and rank 0's close waits for the judges as for any producer. ``keep()`` is their one wait: what
they emitted is on disk before they save the state that says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tracklane.capture.captured import RECORD, Captured
from tracklane.core.records import Record
from tracklane.shipping.hub import ProducerSpec
from tracklane.shipping.producer_pipeline import ProducerPipeline

log = logging.getLogger("tracklane")

KEEP_S = 30.0  # a judge waits this long at most for its spool (a disk fault makes it count, not wait)
_RECORD_BYTES = 256  # what the buffer counts for a judge's record (a step's points or an alert: small)


class JudgeEmitter:
    def __init__(self, lane: str, spec: ProducerSpec, judged: Callable[[], dict[str, Any]]) -> None:
        """``spec``: the lanes it emits into (every tracker's, and a judge's that judges what this one emits);
        ``judged``: the judge's figures, told to the hub with its progress."""
        self._pipeline = ProducerPipeline(lane, "", None, spec, sender=lane, judged=judged)
        self._unkept = False  # emitted since the last keep()

    def emit(self, records: Sequence[Record]) -> None:
        for record in records:
            self._pipeline.put(Captured(record.step, record, record.time, None, RECORD, _RECORD_BYTES))
        self._unkept = self._unkept or bool(records)

    def keep(self) -> None:
        if not self._unkept:  # nothing new: most batches, for most judges
            return
        self._unkept = False
        started = time.monotonic()
        if not self._pipeline.keep(KEEP_S):
            log.warning("tracklane: a judge's records were not on disk within %.0f s", time.monotonic() - started)

    def close(self, timeout: float) -> bool:
        return self._pipeline.close(timeout)
