"""From what ``Tracking`` captured on the caller's thread to typed records (shipper side).

A ``Captured`` item (captured.py) holds, for metrics, the shallow copy of the dict; for rich
kinds, what the matching ``log_*`` call took. A bad item is skipped, counted and warned about;
it never reaches a tracker and never raises into the training loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from pipeline.capture.captured import KIND, METRICS, METRICS_ON_AXIS, REDUCE, REDUCE_NOTICE, SYSTEM_METRICS, Captured
from pipeline.capture.rich import RecordLimits, RichConverter, thin
from pipeline.core.records import SYSTEM_AXIS, Generations, Metrics, Record, Reduction, Trajectories
from pipeline.core.reduction import LANE as REDUCE_LANE
from pipeline.core.reduction import PART, check_ops
from pipeline.core.report import PipelineReport
from pipeline.core.values import MetricCleaner, as_number

log = logging.getLogger("tracklane")


_METRIC_KINDS = frozenset({METRICS, METRICS_ON_AXIS, SYSTEM_METRICS})
_REDUCTION_KINDS = frozenset({REDUCE, REDUCE_NOTICE})
_NAME_INDEX = {"generations": 1, "trajectories": 1, "histogram": 0, "text": 0, "image": 0}
"""Where the key or name sits in each rich kind's payload (log_calls.py builds them)."""
_SAMPLED = {Generations.kind: ("max_generations", "samples"), Trajectories.kind: ("max_trajectories", "trajectories")}
"""Kinds whose sample count each backend may limit itself: (the limit, the record's list of samples)."""


class Converter:
    def __init__(self, limits: RecordLimits, key_prefix: str = "", axis: str | None = None,
                 backends: Sequence[str] = ()) -> None:
        """``key_prefix`` goes before every metric key and rich record name (a producer's name); ``axis``
        is what its metrics' steps count (a producer's own axis; None: the trainer's step). ``backends``:
        the run's trackers, whose own sample limits ``records()`` applies (none given: the run's limits)."""
        self._prefix = key_prefix
        self._axis = axis
        self._limits = limits
        self._backends = list(backends)
        self.metrics = MetricCleaner()
        self.rich = RichConverter(limits.widest(self._backends))  # the batch carries what the most generous keeps
        self.sampled_out_by: dict[str, int] = {}
        """Per backend: samples and trajectories it did not get, by its record_limits."""
        self.rejected = 0
        """Items (whole records) that could not be converted."""

    def record(self, item: Captured) -> Record | None:
        raw_step, payload, when, backend, kind, _size = item  # Captured's layout (the caller builds plain tuples)
        step = self._step(raw_step, kind)
        if step is None:
            return None
        only = _only(backend)
        if kind in _METRIC_KINDS:
            data, prefix, axis = payload, self._prefix, self._axis
            if kind == METRICS_ON_AXIS:
                data, axis = payload
            elif kind == SYSTEM_METRICS:  # a node's figures: keyed as they are, on seconds
                prefix, axis = "", SYSTEM_AXIS
            values = self.metrics.clean(data, prefix)
            return Metrics(step=step, values=values, time=when, only=only, axis=axis) if values else None
        index = _NAME_INDEX.get(kind)
        try:
            if self._prefix and index is not None:
                payload = payload[:index] + (f"{self._prefix}{payload[index]}",) + payload[index + 1:]
            return self.rich.build(kind, step, payload, when, only)
        except Exception as exc:  # malformed input to a log_* call
            self._reject(kind, f"{type(exc).__name__}: {exc}")
            return None

    def records(self, item: Captured) -> list[Record]:
        """The records of one captured item: one, or for samples that backends limit differently, one per
        group of backends with the same limit (each addressed to its group with ``only``); none if rejected."""
        if item[KIND] in _REDUCTION_KINDS:
            return self._reduction(item)
        record = self.record(item)
        if record is None:
            return []
        sampled = _SAMPLED.get(record.kind)
        if sampled is None or not self._backends:
            return [record]
        return self._per_backend(record, *sampled)

    def _reduction(self, item: Captured) -> list[Record]:
        """``log(..., reduce=)``: the values, keyed as given, for the reduce lane only; with ``keep_per_producer``
        also as plain metrics under the producer's prefix (rank 0's under ``rank0/``: its own keys are the reduced
        points'). Rank 0's notices to the reducer go as they are."""
        raw_step, payload, when, backend, kind, _size = item
        step = self._step(raw_step, kind)
        if step is None:
            return []
        if REDUCE_LANE not in self._backends:
            self._reject(kind, "reduce= needs the reduce lane: set trainer.async_log.reductions: true")
            return []
        if kind == REDUCE_NOTICE:
            role, values = payload
            return [Reduction(step=step, time=when, role=role, values=values, only=[REDUCE_LANE])]
        data, reduce, keep, axis = payload
        if axis is not None or self._axis is not None:
            self._reject(kind, "reduce= reduces over the trainer's step: not on an axis of its own")
            return []
        values = self.metrics.clean(data)
        try:
            op, ops = check_ops(reduce, values)
        except ValueError as exc:
            self._reject(kind, str(exc))
            return []
        records: list[Record] = [Reduction(step=step, time=when, role=PART, values=values, op=op, ops=ops,
                                           only=[REDUCE_LANE])]
        if keep:
            records.append(Metrics(step=step, values=self.metrics.clean(data, self._prefix or "rank0/"), time=when,
                                   only=_only(backend)))
        return records

    def _per_backend(self, record: Record, limit_name: str, attribute: str) -> list[Record]:
        given, items = self.rich.last_count, getattr(record, attribute)
        groups: dict[int | None, list[str]] = {}
        for backend in self._backends:
            if record.only is None or backend in record.only:
                groups.setdefault(self._limits.samples_for(backend, limit_name), []).append(backend)
        kept = {limit: thin(items, limit) for limit in groups}  # from the widest cut: still evenly spaced
        for limit, names in groups.items():
            for name in names:
                self.sampled_out_by[name] = self.sampled_out_by.get(name, 0) + given - len(kept[limit])
        if all(len(rows) == len(items) for rows in kept.values()):
            return [record]  # every backend keeps them all: one record for all
        if len(groups) == 1:
            (only_limit,) = groups
            return [dataclasses.replace(record, **{attribute: kept[only_limit]})]  # type: ignore[arg-type]
        return [dataclasses.replace(record, **{attribute: kept[limit]}, only=names)  # type: ignore[arg-type]
                for limit, names in groups.items()]

    def _step(self, raw_step: object, kind: str) -> int | None:
        """The call's step as an int; None (rejected, counted) if it is none."""
        step = as_number(raw_step)
        if type(step) is not int:
            self._reject(kind, f"step {raw_step!r} is not an integer")
            return None
        return step

    def _reject(self, kind: str, why: str) -> None:
        self.rejected += 1
        log.warning("tracklane: a %s record was skipped: %s", kind, why)
        return None

    def counted(self, report: PipelineReport) -> PipelineReport:
        """``report`` with this converter's counts of what it skipped, rejected, cut or left out."""
        report.skipped_values = self.metrics.skipped
        report.rejected_records = self.rejected
        report.truncated_strings = self.rich.truncated
        report.sampled_out = self.rich.sampled_out
        for name, lane in report.lanes.items():
            lane.sampled_out = self.sampled_out_by.get(name, 0)
        return report


def _only(backend: Any) -> list[str] | None:
    """``backend=`` of a call as a record's ``only``: None (every tracker) or a list of names."""
    if backend is None:
        return None
    return [backend] if isinstance(backend, str) else [str(b) for b in backend]
