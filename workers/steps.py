"""Grouping of metric records by step, which every tracker wants."""

from __future__ import annotations

from typing import Iterable, Iterator

from pipeline.records import Metrics


def merge_by_step(records: Iterable[Metrics]) -> Iterator[tuple[int, dict[str, float | int]]]:
    """Yield (step, values) once per run of consecutive records sharing a step; later values win.

    A step with one record yields that record's own dict (no copy): callers must not change it.
    """
    step: int | None = None
    merged: dict[str, float | int] = {}
    for record in records:
        if record.step == step:
            merged = {**merged, **record.values}  # a new dict: the records stay untouched
            continue
        if step is not None:
            yield step, merged
        step, merged = record.step, record.values
    if step is not None:
        yield step, merged
