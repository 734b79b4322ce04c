"""Read back what a real tracker stored, so tests compare it record by record.

Each tracker has one reader module here returning a ``ReadBack``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReadBack:
    """What one tracker run holds, as the tracker stored it."""

    points: list[tuple[int, str, float]] = field(default_factory=list)
    """Every scalar occurrence (step, key, value), duplicates kept, in storage order."""
    params: dict[str, Any] = field(default_factory=dict)
    """Hyper-parameters as the tracker shows them (flattened or nested, per tracker)."""
    status: str | None = None
    """How the run ended, in the tracker's words (e.g. "FINISHED", "FAILED", an exit code)."""

    def scalars(self) -> dict[int, dict[str, float]]:
        """step -> {key: value}; later occurrences win."""
        out: dict[int, dict[str, float]] = {}
        for step, key, value in self.points:
            out.setdefault(step, {})[key] = value
        return out

    def duplicates(self) -> list[tuple[int, str]]:
        """(step, key) pairs stored more than once."""
        counts = Counter((step, key) for step, key, _ in self.points)
        return [pair for pair, n in counts.items() if n > 1]
