"""A one-line progress display on stderr: step, mean score, step time, the logging lag and the cost of log().

It goes through the process's terminal (pipeline/node/terminal.py), which the console tracker's lines share:
on a terminal the line is redrawn in place below them, never torn by them.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tracklane import TERMINAL


class Progress:
    def __init__(self, total: int, enabled: bool = True, stream: TextIO = sys.stderr) -> None:
        self.total, self.enabled, self.stream = total, enabled, stream
        self.live = enabled and stream.isatty()  # redraw one line on a terminal; plain lines otherwise

    def update(self, step: int, score: float, step_s: float, log_us: float, health: dict, note: str = "") -> None:
        """``health``: ``Tracking.vitals()``; its lag is how far the slowest tracker is behind log()."""
        if not self.enabled:
            return
        width = len(str(self.total))
        line = (f"step {step:>{width}}/{self.total} | score {score:.3f} | step {step_s:.2f} s | "
                f"{logging_part(health, log_us)}{' | ' + note if note else ''}")
        TERMINAL.status(line, self.stream)

    def close(self) -> None:
        if self.live:
            TERMINAL.end_status()


def logging_part(health: dict, log_us: float) -> str:
    """The logging's share of the line: the lag and which tracker is that far behind, the trackers out of reach
    (not started, restarting, down, given up) and for how long, what was dropped and where, and the cost of log()."""
    parts = []
    lanes = _per_lane(health)
    if "tracklane/lag_s" in health:
        slowest = max(lanes, key=lambda name: lanes[name].get("lag_s", 0.0), default=None)
        lag = health["tracklane/lag_s"]
        parts.append(f"logging lag {lag:.1f} s" + (f" ({slowest})" if slowest and lag >= 1.0 else ""))
    parts += [f"{name} down {figures['down_s']:.0f} s" for name, figures in lanes.items() if figures.get("down_s")]
    if health.get("tracklane/dropped_records"):
        where = ", ".join(f"{name} {int(f['dropped_records'])}" for name, f in lanes.items() if f.get("dropped_records"))
        parts.append(f"{health['tracklane/dropped_records']} dropped" + (f" ({where})" if where else ""))
    return ", ".join([*parts, f"log() {log_us:.0f} us"])


def _per_lane(health: dict) -> dict[str, dict[str, float]]:
    """``tracklane/lane/<name>/<figure>`` as name -> figure -> value."""
    lanes: dict[str, dict[str, float]] = {}
    for key, value in health.items():
        if key.startswith("tracklane/lane/"):
            name, _, figure = key[len("tracklane/lane/"):].rpartition("/")
            lanes.setdefault(name, {})[figure] = value
    return lanes
