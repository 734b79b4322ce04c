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
        """``health``: ``Tracking.health()``; its lag is how far the slowest tracker is behind log()."""
        if not self.enabled:
            return
        width = len(str(self.total))
        logging = f"log() {log_us:.0f} us"
        if "tracklane/lag_s" in health:
            logging = f"logging lag {health['tracklane/lag_s']:.1f} s, {logging}"
            if health.get("tracklane/dropped_records"):
                logging += f", {health['tracklane/dropped_records']} dropped"
        line = (f"step {step:>{width}}/{self.total} | score {score:.3f} | step {step_s:.2f} s | "
                f"{logging}{' | ' + note if note else ''}")
        TERMINAL.status(line, self.stream)

    def close(self) -> None:
        if self.live:
            TERMINAL.end_status()
