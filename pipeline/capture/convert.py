"""From what ``Tracking`` captured on the caller's thread to typed records (shipper side).

A ``Captured`` item (captured.py) holds, for metrics, the shallow copy of the dict; for rich
kinds, what the matching ``log_*`` call took. A bad item is skipped, counted and warned about;
it never reaches a tracker and never raises into the training loop.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracklane.capture.captured import (
    KIND,
    METRICS,
    METRICS_ON_AXIS,
    RECORD,
    REDUCE,
    REDUCE_NOTICE,
    SIZE,
    SYSTEM_METRICS,
    Captured,
)
from tracklane.capture.rich import RecordLimits, RichConverter, thin_indices
from tracklane.capture.verl_line import verl_data
from tracklane.core.records import SYSTEM_AXIS, Artifact, Generations, Image, Metrics, Record, Reduction, Trajectories
from tracklane.core.reduction import PART, check_ops
from tracklane.core.report import PipelineReport
from tracklane.core.trajectory_lines import TrajectoryLines
from tracklane.core.values import MetricCleaner, as_number

log = logging.getLogger("tracklane")


_METRIC_KINDS = frozenset({METRICS, METRICS_ON_AXIS, SYSTEM_METRICS})
_REDUCTION_KINDS = frozenset({REDUCE, REDUCE_NOTICE})
_NAME_INDEX = {"generations": 1, "trajectories": 1, "histogram": 0, "text": 0, "image": 0}
"""Where the key or name sits in each rich kind's payload (log_calls.py builds them)."""
_SAMPLED = {Generations.kind: "max_generations", Trajectories.kind: "max_trajectories"}
"""Kinds whose sample count each backend may limit itself, and the limit's name."""


class Converter:
    def __init__(self, limits: RecordLimits, key_prefix: str = "", axis: str | None = None,
                 backends: Sequence[str] = (), traits: Mapping[str, frozenset[str]] | None = None) -> None:
        """``key_prefix`` goes before every metric key and rich record name (a producer's name); ``axis``
        is what its metrics' steps count (a producer's own axis; None: the trainer's step). ``backends``:
        the run's trackers, whose own sample limits ``records()`` applies (none given: the run's limits); ``traits``:
        which of them add up a step's samples logged in several records (``takes_pieces``), write a call's dict as
        verl's FileLogger does (``writes_verl_lines``: verl_line.py), or are judges, which take no samples
        (``judges``): host/registry.py ``backend_traits``."""
        self._prefix = key_prefix
        self._axis = axis
        self._limits = limits
        self._backends = list(backends)
        traits = traits or {}
        self._pieces = traits.get("takes_pieces", frozenset())
        self._verl_lines = traits.get("writes_verl_lines", frozenset())
        self.judges = traits.get("judges", frozenset())
        self._reducing = bool(traits.get("reduces"))
        self.metrics = MetricCleaner()
        self.rich = RichConverter(limits.widest(self._backends))  # the batch carries what the most generous keeps
        self.sampled_out_by: dict[str, int] = {}
        """Per backend: samples and trajectories it did not get, by its record_limits."""
        self.rejected = 0
        """Items (whole records) that could not be converted."""

    def record(self, item: Captured) -> Record | None:
        """The one record of an item (the first, for samples split by backend); None if rejected."""
        if item[KIND] in _SAMPLED:
            return next(iter(self.records(item)), None)
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
            # values is data: verl's usual dict, already plain (values.py), which encodes as verl's does (an empty one
            # too, but it makes no record: verl's line of it goes as verl_data)
            raw = verl_data(data) if kind == METRICS and self._verl_lines and not prefix and axis is None \
                and (values is not data or not data) and (only is None or self._verl_lines & set(only)) else None
            if raw is not None and not values:  # only verl's line keeps it (an empty dict, strings only), as verl's does
                only = [name for name in (only or self._backends) if name in self._verl_lines]
                if not only:
                    return None
            return Metrics(step=step, values=values, time=when, only=only, axis=axis, verl_data=raw) \
                if values or raw is not None else None
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
        now, later = self.staged(item)
        return now + [record for rest in later for record in rest]

    def staged(self, item: Captured, chunk_bytes: int | None = None, bulk_bytes: float = math.inf,
               ) -> tuple[list[Record], list[Iterator[Record]]]:
        """The records of one item as the shipper sends them: those to send now (in the order of the calls), and,
        made lazily, what is too big for that: a group of samples (a rollout dump, for the trackers that keep it
        all) of about ``bulk_bytes`` or more, in records of about ``chunk_bytes``, and an artifact (its tracker
        copies or uploads a file), so a dump of hundreds of MB is converted and shipped a chunk at a time."""
        kind = item[KIND]
        if kind == RECORD:
            return [item.payload if isinstance(item, Captured) else item[1]], []
        if kind in _REDUCTION_KINDS:
            return self._reduction(item), []
        if kind in _SAMPLED:
            now: list[Record] = []
            later: list[Iterator[Record]] = []
            for group in self._sample_groups(item):
                if group.nbytes >= bulk_bytes:  # chunked only where every tracker adds the chunks up
                    targets = set(self._backends if group.only is None else group.only) - self.judges
                    whole = not targets or not targets <= self._pieces
                    later.append(self._group_records(group, None if whole else chunk_bytes))
                else:
                    now.extend(self._group_records(group, None))
            return now, later
        if kind == Artifact.kind or (kind == Image.kind and item[SIZE] >= bulk_bytes):
            return [], [iter(self._one(item))]
        return self._one(item), []

    def _one(self, item: Captured) -> list[Record]:
        record = self.record(item)
        return [] if record is None else [record]

    def _sample_groups(self, item: Captured) -> list[_Group]:
        """A sampled item (generations, trajectories) as its groups: the backends with the same sample limit, and
        their evenly spaced samples (every backend keeping every sample: one group, addressed as the call was).
        Counts what each backend and the run leave out."""
        raw_step, payload, when, backend, kind, size = item
        step = self._step(raw_step, kind)
        if step is None:
            return []
        try:
            samples, key = payload
            samples = samples if isinstance(samples, list) else list(samples)
        except Exception as exc:  # not what log_generations / log_trajectories capture
            self._reject(kind, f"{type(exc).__name__}: {exc}")
            return []
        only = _only(backend)
        limit_name = _SAMPLED[kind]
        groups = self._groups(only, limit_name)
        kept = {limit: thin_indices(len(samples), limit) for limit in groups}
        widest = getattr(self.rich.limits, limit_name)  # the most generous backend's: what no tracker gets
        self.rich.sampled_out += len(samples) - len(thin_indices(len(samples), widest))
        for limit, names in groups.items():
            for name in names or ():
                self.sampled_out_by[name] = self.sampled_out_by.get(name, 0) + len(samples) - len(kept[limit])
        if all(len(indices) == len(samples) for indices in kept.values()):
            groups, kept = {None: only}, {None: range(len(samples))}  # every backend keeps them all: one record
        elif len(groups) == 1:
            groups = {limit: only for limit in groups}
        each = size / max(1, len(samples))
        return [_Group(kind=kind, step=step, when=when, key=f"{self._prefix}{key}", only=names, samples=samples,
                       indices=kept[limit], nbytes=each * len(kept[limit])) for limit, names in groups.items()]

    def _group_records(self, group: _Group, chunk_bytes: int | None) -> Iterator[Record]:
        """A group's records, of about ``chunk_bytes`` each (None: one); a malformed sample is left out, and its
        item counted rejected once."""
        step = group.step
        if group.kind == Trajectories.kind:
            convert: Callable[[Any], Any] = lambda sample: self.rich.trajectory_line(sample, step)  # noqa: E731
            size: Callable[[Any], int] = len
        else:
            convert, size = self.rich.generation_row, _row_size
        bad = 0
        for chunk, failed in _chunks(convert, size, group.samples, group.indices, chunk_bytes):
            bad += failed
            if chunk or not group.samples:  # an empty call still makes its (empty) record
                yield _sampled_record(group, chunk)
        if bad:
            self._reject(group.kind, f"{bad} malformed sample(s) left out")

    def _groups(self, only: list[str] | None, limit_name: str) -> dict[int | None, list[str] | None]:
        """Sample limit -> the backends that have it (the run's limit for all, without backends)."""
        if not self._backends:
            return {getattr(self._limits, limit_name): only}
        groups: dict[int | None, list[str] | None] = {}
        for name in self._backends:
            if (only is None or name in only) and name not in self.judges:  # they store no samples
                groups.setdefault(self._limits.samples_for(name, limit_name), []).append(name)  # type: ignore[union-attr]
        return groups

    def _reduction(self, item: Captured) -> list[Record]:
        """``log(..., reduce=)``: the values, keyed as given, for the reduce lane only; with ``keep_per_producer``
        also as plain metrics under the producer's prefix (rank 0's under ``rank0/``: its own keys are the reduced
        points'). Rank 0's notices to the reducer go as they are."""
        raw_step, payload, when, backend, kind, _size = item
        step = self._step(raw_step, kind)
        if step is None:
            return []
        if not self._reducing:  # rank 0's notices need no reducer; a producer's values do
            if kind != REDUCE_NOTICE:
                self._reject(kind, "reduce= needs the reduce lane: set trainer.async_log.reductions: true")
            return []
        if kind == REDUCE_NOTICE:
            role, values = payload
            return [Reduction(step=step, time=when, role=role, values=values)]
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
        records: list[Record] = [Reduction(step=step, time=when, role=PART, values=values, op=op, ops=ops)]
        if keep:
            records.append(Metrics(step=step, values=self.metrics.clean(data, self._prefix or "rank0/"), time=when,
                                   only=_only(backend)))
        return records

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


@dataclass(slots=True, kw_only=True)
class _Group:
    """The samples of one captured call that one group of backends gets."""

    kind: str
    step: int
    when: float
    key: str
    only: list[str] | None
    samples: list[Any]
    indices: Sequence[int]
    nbytes: float
    """About how many bytes its samples are."""


def _sampled_record(group: _Group, chunk: list[Any]) -> Record:
    if group.kind == Trajectories.kind:
        lines = TrajectoryLines(b"".join(chunk), len(chunk), group.step)
        return Trajectories(step=group.step, trajectories=lines, time=group.when, key=group.key, only=group.only)
    return Generations(step=group.step, samples=chunk, time=group.when, key=group.key, only=group.only)


def _chunks(convert: Callable[[Any], Any], size: Callable[[Any], int], samples: list[Any], indices: Sequence[int],
            chunk_bytes: int | None) -> Iterator[tuple[list[Any], int]]:
    """(the samples at ``indices`` converted, about ``chunk_bytes`` of them; how many were malformed): the last
    chunk may be empty (every sample malformed, or none given)."""
    chunk: list[Any] = []
    nbytes = bad = 0
    for index in indices:
        try:
            piece = convert(samples[index])
        except Exception:  # a sample of the wrong shape: left out, counted with its item
            bad += 1
            continue
        chunk.append(piece)
        nbytes += size(piece)
        if chunk_bytes is not None and nbytes >= chunk_bytes:
            yield chunk, bad
            chunk, nbytes, bad = [], 0, 0
    if chunk or bad or not indices:
        yield chunk, bad


def _row_size(row: list[Any]) -> int:
    """Bytes of one generations row [input, output, score], about."""
    return len(row[0]) + len(row[1]) + 32
