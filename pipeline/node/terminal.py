"""The trainer's own terminal: console lines on stdout, and one status line, without tearing each other.

The console lane's actor formats its lines and sends them back in its acknowledgements; the
shipper thread hands them here. A printer thread writes them, so a stdout that blocks (a paused
``| less``, a full pipe) stalls only this queue, never the shipper (that would hold back every lane)
nor the trainer. The queue is bounded by characters; what does not fit is dropped, counted, and
said once on stderr.

The status line (the trainer's progress display) is redrawn in place on a terminal. When both
streams are terminals, a console write first clears the status line, writes its lines, then draws
the status line again below them, all under one lock: the two never share a line.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import deque
from typing import TextIO

MAX_QUEUED_CHARS = 8 * 1024 * 1024
"""Console text waiting for stdout at most (~80,000 verl lines of 100 keys); more is dropped, counted."""
_CLEAR = "\r\033[K"


class Terminal:
    def __init__(self, out: TextIO | None = None, max_chars: int = MAX_QUEUED_CHARS) -> None:
        self._out = out  # None: sys.stdout as it is at each write (pytest's capture swaps it)
        self._max_chars = max_chars
        self._lock = threading.Lock()  # one writer at a time on either stream
        self._queued: deque[str] = deque()
        self._queued_chars = 0
        self._pending = threading.Condition()
        self._thread: threading.Thread | None = None
        self._status: tuple[str, TextIO] | None = None  # the live status line and its stream
        self.dropped_chars = 0
        """Console text dropped because stdout did not keep up."""

    # -- console lines ----------------------------------------------------------------------
    def write(self, text: str) -> None:
        """Queue ``text`` (whole lines) for stdout; returns at once."""
        if not text:
            return
        with self._pending:
            if self._queued_chars + len(text) > self._max_chars:
                first = self.dropped_chars == 0
                self.dropped_chars += len(text)
                if first:
                    sys.stderr.write("tracklane: stdout is not keeping up; console lines are dropped (counted)\n")
                return
            self._queued.append(text)
            self._queued_chars += len(text)
            self._pending.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._print_forever, name="tracklane-console", daemon=True)
                self._thread.start()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued line is written (the run's summary comes after them); False on timeout."""
        with self._pending:
            return self._pending.wait_for(lambda: not self._queued and self._queued_chars == 0, timeout)

    def _print_forever(self) -> None:
        while True:
            with self._pending:
                self._pending.wait_for(lambda: bool(self._queued))
                text = "".join(self._queued)
                self._queued.clear()
            with contextlib.suppress(OSError, ValueError):  # stdout closed or gone: nothing to print on
                self._print(text)
            with self._pending:
                self._queued_chars -= len(text)
                self._pending.notify_all()

    def _print(self, text: str) -> None:
        out = self._out or sys.stdout
        with self._lock:
            status = self._status if self._status is not None and _is_tty(out) else None
            if status is not None:
                status[1].write(_CLEAR)
                status[1].flush()
            out.write(text)
            out.flush()
            if status is not None:
                status[1].write(status[0])
                status[1].flush()

    # -- the status line --------------------------------------------------------------------
    def status(self, line: str, stream: TextIO) -> None:
        """Show ``line`` as the status line on ``stream``: redrawn in place on a terminal, else one plain line."""
        with self._lock:
            if _is_tty(stream):
                self._status = (line, stream)
                stream.write(f"{_CLEAR}{line}")
            else:
                stream.write(f"{line}\n")
            stream.flush()

    def end_status(self) -> None:
        """Leave the status line where it is (a newline after it) and stop redrawing it."""
        with self._lock:
            if self._status is not None:
                self._status[1].write("\n")
                self._status[1].flush()
                self._status = None


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


TERMINAL = Terminal()
"""The process's terminal: the console lane and the trainer's progress display both write through it."""
