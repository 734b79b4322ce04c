"""Building tracklane records from what other trackers keep, shaped once for every source.

Scalars arrive as points (step, time, key, value): one ``Metrics`` record per run of points sharing a step and
a time, a new one whenever a key comes again (a tracker may hold two values of one key at one step). Histograms
arrive binned (no tracker keeps the raw values): a ``Histogram`` with no values and the figures the tracker
kept. Images become PNG bytes (a JPEG or WebP is re-encoded losslessly through Pillow).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tracklane.core.histogram import HistogramFigures
from tracklane.core.png import PNG_SIGNATURE
from tracklane.core.records import Histogram, Metrics, Record, Trajectory
from tracklane.core.values import as_number

Point = tuple[int, float, str, float | int]
"""(step, time in seconds, key, value)."""

_VERSION_FOLDER = re.compile(r"step_(-?\d+)")
ROLLOUT_INDICES = ("sample_index", "rollout_index", "validation")
"""A trajectory's meta entries that wandb and trackio keep beside it, not in its meta."""
_RICH_ORDER = {"metrics": 0}  # at one step, the scalars first, then the rich records in source order


def metrics_records(points: Iterable[Point], axis: str | None = None) -> list[Metrics]:
    """The points as Metrics records, in step order (then time), one per (step, time) group."""
    records: list[Metrics] = []
    current: Metrics | None = None
    values: dict[str, float | int] = {}
    for step, when, key, value in sorted(points, key=lambda p: (p[0], p[1])):
        if current is None or current.step != step or current.time != when or key in values:
            values = {}
            current = Metrics(step=step, values=values, time=when, axis=axis)
            records.append(current)
        values[key] = value
    return records


def in_step_order(records: Iterable[Record]) -> list[Record]:
    """Records sorted by step (stable): scalars before the rich records of the same step."""
    return sorted(records, key=lambda r: (r.step, _RICH_ORDER.get(r.kind, 1)))


def number(value: Any) -> float | int | None:
    """A metric value as a plain number; JSON null (how verl's orjson writes NaN and +-Inf) as NaN; None
    for anything else."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return None
    return as_number(value)


def binned_histogram(step: int, when: float, name: str, edges: Sequence[float], counts: Sequence[float], *,
                     minimum: float | None = None, maximum: float | None = None, total: float | None = None,
                     sum_: float | None = None, sum_squares: float | None = None, mean: float | None = None,
                     std: float | None = None, nonfinite: tuple[int, int, int] = (0, 0, 0)) -> Histogram:
    """A Histogram of bins a tracker kept (``len(edges) == len(counts) + 1``). Count, min and max come from
    the bins unless given; mean and std from the sums (or the sums from them) where the tracker kept either;
    what it did not keep is NaN (unknown, not made up from the bins). ``nonfinite``: NaN, +Inf, -Inf counts."""
    whole = [int(round(c)) for c in counts]
    count = int(total) if total is not None else sum(whole)
    if mean is None and sum_ is not None and count:
        mean = sum_ / count
    if std is None and sum_squares is not None and mean is not None and count:
        std = math.sqrt(max(sum_squares / count - mean * mean, 0.0))
    if sum_ is None and mean is not None:
        sum_ = mean * count
    if sum_squares is None and mean is not None and std is not None:
        sum_squares = count * (std * std + mean * mean)
    low = minimum if minimum is not None or not edges else edges[0]
    high = maximum if maximum is not None or not edges else edges[-1]
    figures = HistogramFigures(count=count, nan=nonfinite[0], posinf=nonfinite[1], neginf=nonfinite[2], min=_known(low),
                               max=_known(high), mean=_known(mean), std=_known(std), sum=_known(sum_),
                               sum_squares=_known(sum_squares), bin_edges=[float(e) for e in edges], counts=whole)
    return Histogram(step=step, name=name, values=b"", time=when, figures=figures)


def _known(value: float | None) -> float:
    return math.nan if value is None else float(value)


def png(data: bytes) -> bytes:
    """PNG bytes of an encoded image: as they are if they are a PNG, else decoded and written as PNG."""
    if data[:8] == PNG_SIGNATURE:
        return data
    from PIL import Image as PILImage  # Pillow comes with every tracker SDK that stores images

    buffer = io.BytesIO()
    PILImage.open(io.BytesIO(data)).save(buffer, format="PNG")
    return buffer.getvalue()


def trajectory(data: Mapping[str, Any]) -> Trajectory:
    """A ``Trajectory.as_dict()`` read back (JSON null as NaN where a number belongs)."""
    rewards = {str(k): score(v) for k, v in (data.get("rewards") or {}).items()}
    return Trajectory(messages=[{str(k): str(v) for k, v in m.items()} for m in data.get("messages") or []],
                      tool_calls=[dict(call) for call in data.get("tool_calls") or []], rewards=rewards,
                      meta=dict(data.get("meta") or {}), token_ids=np.asarray(data.get("token_ids") or [], dtype="<i4").tobytes())


def score(value: Any) -> float:
    """A score or reward; JSON null (strict JSON's NaN) as NaN."""
    return math.nan if value is None else float(value)


def artifact_step(folder: str | None) -> int:
    """The step of an artifact version from the folder below ``<type>/<name>/`` (tracklane's sinks write
    ``step_<N>/``); 0 for the layout written before versions, where no such folder is."""
    version = _VERSION_FOLDER.fullmatch(folder) if folder is not None else None
    return int(version[1]) if version else 0
