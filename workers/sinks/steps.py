"""Grouping records by step, which every tracker wants: one way, used by every sink."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from typing import TypeVar

from tracklane.core.records import Metrics

R = TypeVar("R")


def _step_and_axis(record: object) -> tuple[int, str | None]:
    return record.step, getattr(record, "axis", None)  # type: ignore[attr-defined]  # only metrics have an axis


def records_by_step(records: Iterable[R]) -> Iterator[tuple[int, list[R]]]:
    """(step, records) per run of consecutive records sharing a step (and, for metrics, its axis:
    ``group[0].axis``)."""
    for (step, _axis), group in groupby(records, key=_step_and_axis):
        yield step, list(group)


def merged_values(group: Sequence[Metrics]) -> dict[str, float | int]:
    """The values of one step's metric records; later values win.

    A step with one record gives that record's own dict (no copy): callers must not change it.
    """
    if len(group) == 1:
        values = group[0].values
        return values if type(values) is dict else dict(values)  # PackedValues: its dict
    merged: dict[str, float | int] = {}
    for record in group:
        merged.update(record.values)
    return merged


def merge_by_axis_step(records: Iterable[Metrics]) -> Iterator[tuple[str | None, int, dict[str, float | int]]]:
    """(axis, step, values) once per run of consecutive metric records sharing a step and axis."""
    for step, group in records_by_step(records):
        yield group[0].axis, step, merged_values(group)
