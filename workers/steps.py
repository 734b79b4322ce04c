"""Grouping records by step, which every tracker wants: one way, used by every sink."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from typing import TypeVar

from pipeline.records import Metrics

R = TypeVar("R")


def records_by_step(records: Iterable[R]) -> Iterator[tuple[int, list[R]]]:
    """(step, records) per run of consecutive records sharing a step."""
    for step, group in groupby(records, key=lambda record: record.step):  # type: ignore[attr-defined]
        yield step, list(group)


def merged_values(group: Sequence[Metrics]) -> dict[str, float | int]:
    """The values of one step's metric records; later values win.

    A step with one record gives that record's own dict (no copy): callers must not change it.
    """
    if len(group) == 1:
        return group[0].values
    merged: dict[str, float | int] = {}
    for record in group:
        merged.update(record.values)
    return merged


def merge_by_step(records: Iterable[Metrics]) -> Iterator[tuple[int, dict[str, float | int]]]:
    """(step, values) once per run of consecutive metric records sharing a step."""
    for step, group in records_by_step(records):
        yield step, merged_values(group)
