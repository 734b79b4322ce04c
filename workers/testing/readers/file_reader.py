"""The file tracker's JSON lines read back: verl's format, where orjson wrote NaN and +-Inf as ``null``.

A null metric value is read as NaN (verl's FileLogger and this project's write every non-finite value so; which of
NaN, +Inf, -Inf it was is not in the file). tracklane's own lines (its vitals, other axes) are in
``<base>_tracklane/metrics.jsonl`` beside the file (workers/sinks/file.py): ``file_lines`` reads both.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tracklane.workers.sinks.file import METRICS_FILE, tracklane_dir


def verl_lines(path: str | Path) -> list[dict[str, Any]]:
    """Every line of the ``.jsonl`` itself (verl's lines), its ``data`` values with null read as NaN."""
    lines = []
    with open(path, encoding="utf-8") as handle:
        for text in handle:
            line = json.loads(text)
            if isinstance(line.get("data"), dict):
                line["data"] = {key: math.nan if value is None else value for key, value in line["data"].items()}
            lines.append(line)
    return lines


def file_lines(path: str | Path) -> list[dict[str, Any]]:
    """verl's lines, then tracklane's own beside them (vitals, lines on other axes)."""
    own = os.path.join(tracklane_dir(str(path)), METRICS_FILE)
    return verl_lines(path) + (verl_lines(own) if os.path.isfile(own) else [])


def file_points(path: str | Path) -> list[tuple[int, str, float]]:
    """(step, key, value) of every metric line on the trainer's step (other axes left out)."""
    return [(line["step"], key, value) for line in file_lines(path)
            if line.get("step") is not None and line.get("axis") is None for key, value in line["data"].items()]
