"""Shared shaping of rich records for trackers: histogram figures, safe file names, summary lines."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from pipeline.records import Generations, Trajectories

HISTOGRAM_BINS = 30
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
