"""How rich records look in trackers, shaped once for every sink: table rows, JSON, safe names.

Tables (wandb, SwanLab, TensorBoard's markdown) use one row shape per kind:

    GENERATION_COLUMNS   step, input, output, score
    TRAJECTORY_COLUMNS   step, sample_index, rollout_index, validation, score, rewards, messages,
                         tool_calls, num_tokens, meta   (nested parts as JSON text)

Trackers that store documents instead (MLflow, the file logger) write ``Trajectory.as_dict()``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tracklane.core.records import Generations, Trajectories, Trajectory
from tracklane.core.values import finite_or_none

GENERATION_COLUMNS = ["step", "input", "output", "score"]
TRAJECTORY_COLUMNS = ["step", "sample_index", "rollout_index", "validation", "score", "rewards", "messages",
                      "tool_calls", "num_tokens", "meta"]
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
