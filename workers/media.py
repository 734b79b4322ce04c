"""Shared shaping of rich records for trackers: histogram figures, safe file names, summary lines."""

from __future__ import annotations

import json
import math
import re
from itertools import groupby
from typing import Any, Iterator, Sequence, TypeVar

import numpy as np

from pipeline.records import Generations, Trajectories

HISTOGRAM_BINS = 30
GENERATION_COLUMNS = ["step", "input", "output", "score"]
TRAJECTORY_COLUMNS = ["step", "sample_index", "rollout_index", "validation", "score", "rewards", "messages",
                      "tool_calls", "num_tokens", "meta"]
R = TypeVar("R")
_UNSAFE = re.compile(r"[^\w.\-]+")


def histogram_figures(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Bins and summary of the finite values (non-finite ones are counted apart)."""
    finite = values[np.isfinite(values)]
    out: dict[str, Any] = {"count": int(finite.size), "nonfinite": int(values.size - finite.size)}
    if finite.size == 0:
        return {**out, "min": math.nan, "max": math.nan, "mean": math.nan, "std": math.nan,
                "bin_edges": [], "counts": []}
    counts, edges = np.histogram(finite, bins=bins)
    return {**out, "min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
            "std": float(finite.std()), "bin_edges": edges.tolist(), "counts": counts.tolist()}


def safe_name(name: str) -> str:
    """A name usable as one path component."""
    return _UNSAFE.sub("_", name).strip("._") or "_"


def mean_score(record: Generations | Trajectories) -> float:
    scores = ([row[2] for row in record.samples] if isinstance(record, Generations)
              else [t.score() for t in record.trajectories])
    finite = [s for s in scores if math.isfinite(s)]
    return sum(finite) / len(finite) if finite else math.nan


def records_by_step(records: Sequence[R]) -> Iterator[tuple[int, list[R]]]:
    """(step, records) per run of consecutive records sharing a step."""
    for step, group in groupby(records, key=lambda record: record.step):
        yield step, list(group)


def trajectory_row(step: int, trajectory: Any) -> list[Any]:
    """One table row (TRAJECTORY_COLUMNS) for a trajectory: nested parts as JSON text."""
    meta = dict(trajectory.meta)
    return [step, meta.pop("sample_index", None), meta.pop("rollout_index", None), meta.pop("validation", None),
            trajectory.score(), as_json(trajectory.rewards), as_json(trajectory.messages),
            as_json(trajectory.tool_calls), len(trajectory.token_ids) // 4, as_json(meta)]


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # NaN stays the token NaN, which Python reads back
