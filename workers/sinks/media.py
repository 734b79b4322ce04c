"""How rich records look in trackers, shaped once for every sink: table rows, cells, histogram scalars, JSON, safe names.

Tables (wandb, SwanLab, ClearML, TensorBoard's markdown) use one row shape per kind (``GENERATION_COLUMNS``,
``TRAJECTORY_COLUMNS``: nested parts as JSON text); trackers that store documents instead (MLflow, the file logger)
write ``Trajectory.as_dict()``.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tracklane.core.histogram import HistogramFigures
from tracklane.core.records import Generations, Trajectories, Trajectory
from tracklane.core.values import finite_or_none
from tracklane.workers.sinks.steps import records_by_step

GENERATION_COLUMNS = ["step", "input", "output", "score"]
TRAJECTORY_COLUMNS = ["step", "sample_index", "rollout_index", "validation", "score", "rewards", "messages",
                      "tool_calls", "num_tokens", "meta"]
HISTOGRAM_STATS = ("mean", "std", "min", "max", "count")
_UNSAFE = re.compile(r"[^\w.\-]+")


def generation_rows(record: Generations) -> list[list[Any]]:
    """One GENERATION_COLUMNS row per sample."""
    return [[record.step, text_in, text_out, score] for text_in, text_out, score in record.samples]


def trajectory_rows(record: Trajectories) -> list[list[Any]]:
    """One TRAJECTORY_COLUMNS row per trajectory."""
    return [_trajectory_row(record.step, trajectory) for trajectory in record.trajectories]


def _trajectory_row(step: int, trajectory: Trajectory) -> list[Any]:
    meta = dict(trajectory.meta)
    return [step, meta.pop("sample_index", None), meta.pop("rollout_index", None), meta.pop("validation", None),
            trajectory.score(), as_json(trajectory.rewards), as_json(trajectory.messages),
            as_json(trajectory.tool_calls), len(trajectory.token_ids) // 4, as_json(meta)]


def tables_by_step(records: Iterable[Any], rows_of: Callable[[Any], list[list[Any]]],
                   cell: Callable[[Any], Any]) -> Iterator[tuple[int, dict[str, list[list[Any]]]]]:
    """(step, key -> that step's rows of the key, each cell through ``cell``); a key without rows is left out."""
    for step, group in records_by_step(records):
        rows: dict[str, list[list[Any]]] = {}
        for record in group:
            rows.setdefault(record.key, []).extend([cell(value) for value in row] for row in rows_of(record))
        yield step, {key: key_rows for key, key_rows in rows.items() if key_rows}


def named_nonfinite(value: Any, infinity: str = "Infinity") -> Any:
    """A table cell whose store would write a non-finite float as null: "NaN", ``infinity`` or "-" + ``infinity``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else (infinity if value > 0 else "-" + infinity)
    return value


def histogram_stats(figures: HistogramFigures) -> dict[str, float]:
    """A histogram's summary scalars: count, and mean / std (population) / min / max when a value is finite."""
    return {stat: float(getattr(figures, stat)) for stat in (HISTOGRAM_STATS if figures.count else ("count",))}


def png_file(folder: str, name: str, png: bytes) -> str:
    """The PNG bytes as the file ``<folder>/<name>.png`` (for SDKs that take a path and copy it as given)."""
    path = os.path.join(folder, f"{name}.png")
    with open(path, "wb") as handle:
        handle.write(png)
    return path


def pil_image(png: bytes) -> Any:
    """The PNG decoded by PIL, pixels as stored (loaded: the bytes may go)."""
    from PIL import Image as PILImage

    image = PILImage.open(io.BytesIO(png))
    image.load()
    return image


def as_json(value: Any, strict: bool = False) -> str:
    """JSON text. By default NaN stays the token NaN, which Python reads back; ``strict`` writes
    NaN and +-Inf as null, for stores that want strict JSON."""
    if strict:
        return json.dumps(finite_or_none(value), ensure_ascii=False, allow_nan=False)
    return json.dumps(value, ensure_ascii=False)


def safe_name(name: str, fill: str = "_") -> str:
    """A name usable as one path component (and as a wandb artifact name): other characters -> ``fill``."""
    return _UNSAFE.sub(fill, name).strip("._" + fill) or "_"


def mean_score(record: Generations | Trajectories) -> float:
    scores = ([row[2] for row in record.samples] if isinstance(record, Generations)
              else [t.score() for t in record.trajectories])
    finite = [s for s in scores if math.isfinite(s)]
    return sum(finite) / len(finite) if finite else math.nan
