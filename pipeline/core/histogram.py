"""A histogram's figures, computed once on the shipper side and carried in the record to every tracker.

Every tracker bins the same way: ``HISTOGRAM_BINS`` numpy bins of the finite values, with the
non-finite ones counted apart (no tracker can bin NaN or +-Inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HISTOGRAM_BINS = 30


@dataclass(slots=True, kw_only=True, frozen=True)
class HistogramFigures:
    count: int
    """Finite values."""
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    min: float = math.nan
    """min, max, mean, std (population), sum and sum_squares are of the finite values; NaN when there is none."""
    max: float = math.nan
    mean: float = math.nan
    std: float = math.nan
    sum: float = math.nan
    sum_squares: float = math.nan
    bin_edges: list[float] = field(default_factory=list)
    """``HISTOGRAM_BINS + 1`` edges; empty when no value is finite."""
    counts: list[int] = field(default_factory=list)

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def to_plain(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


FIELDS = HistogramFigures.__slots__


def histogram_figures(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> HistogramFigures:
    """Bins and summary of the finite values of a float array; non-finite ones are counted apart."""
    finite = values[np.isfinite(values)]
    nan, posinf, neginf = int(np.isnan(values).sum()), int(np.isposinf(values).sum()), int(np.isneginf(values).sum())
    if finite.size == 0:
        return HistogramFigures(count=0, nan=nan, posinf=posinf, neginf=neginf)
    counts, edges = np.histogram(finite, bins=bins)
    return HistogramFigures(count=int(finite.size), nan=nan, posinf=posinf, neginf=neginf, min=float(finite.min()),
                            max=float(finite.max()), mean=float(finite.mean()), std=float(finite.std()),
                            sum=float(finite.sum()), sum_squares=float(finite @ finite), bin_edges=edges.tolist(),
                            counts=counts.tolist())
