"""From what ``Tracking`` captured on the caller's thread to typed records (shipper side).

A captured item is ``(step, payload, time, backend, kind, size)``: for metrics the payload is
the shallow copy of the dict; for rich kinds it is what the matching ``log_*`` call took.
A bad item is skipped, counted and warned about; it never reaches a tracker and never
raises into the training loop.
"""

from __future__ import annotations

import logging
from .records import Metrics, Record
from .rich import RecordLimits, RichConverter
from .values import MetricCleaner, as_number

log = logging.getLogger("tracklane")

METRICS = "metrics"


class Converter:
    def __init__(self, limits: RecordLimits) -> None:
        self.metrics = MetricCleaner()
        self.rich = RichConverter(limits)
        self.rejected = 0
        """Items (whole records) that could not be converted."""

    def record(self, item: tuple) -> Record | None:
        step, payload, when, backend, kind, _ = item
        number = as_number(step)
        if type(number) is not int:
            return self._reject(kind, f"step {step!r} is not an integer")
        only = None if backend is None else ([backend] if isinstance(backend, str) else [str(b) for b in backend])
        if kind == METRICS:
            values = self.metrics.clean(payload)
            return Metrics(step=number, values=values, time=when, only=only) if values else None
        try:
            return getattr(self.rich, kind)(number, payload, when, only)
        except Exception as exc:  # malformed input to a log_* call
            return self._reject(kind, f"{type(exc).__name__}: {exc}")

    def _reject(self, kind: str, why: str) -> None:
        self.rejected += 1
        log.warning("tracklane: a %s record was skipped: %s", kind, why)
        return None

    def counts(self) -> dict[str, int]:
        return {"skipped_values": self.metrics.skipped, "rejected_records": self.rejected,
                "truncated_strings": self.rich.truncated, "sampled_out": self.rich.sampled_out}

