"""A one-line progress display on stderr: step, mean score, step time, the cost of log() on this thread."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, total: int, enabled: bool = True, stream: TextIO = sys.stderr) -> None:
        self.total, self.enabled, self.stream = total, enabled, stream
        self.live = enabled and stream.isatty()  # redraw one line on a terminal; plain lines otherwise

    def update(self, step: int, score: float, step_s: float, log_us: float, note: str = "") -> None:
        if not self.enabled:
            return
        width = len(str(self.total))
        line = (f"step {step:>{width}}/{self.total} | score {score:.3f} | step {step_s:.2f} s | "
                f"log() {log_us:.0f} us{' | ' + note if note else ''}")
        self.stream.write(f"\r\033[K{line}" if self.live else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()
