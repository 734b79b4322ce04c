"""Whether the thread that logs keeps its CPU busy: then the shipper sends fewer, larger batches.

Each batch costs the machine a fixed amount whatever it holds (an actor call per lane on both ends of Ray,
a tracker request or file flush per lane, the lane's state saved), so on a machine whose cores the trainer
needs, batching longer gives the trainer that CPU back. The kernel's own accounting says how busy the
thread was: ``/proc/self/task/<tid>/schedstat`` (time on a CPU, then time runnable but waiting for one).
Where it cannot be read (not Linux), the thread counts as not busy and nothing changes.
"""

from __future__ import annotations

import threading
import time

BUSY_SHARE = 0.8
"""Of the wall time since the last look, the share the thread was on a CPU or waiting for one."""
LOOK_EVERY_S = 0.5
"""The shortest interval between two looks (a look is one read of ``schedstat``)."""


class ThreadBusy:
    """Looks at the thread that builds it, at most every ``LOOK_EVERY_S``."""

    def __init__(self) -> None:
        self._path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self._last = self._read()
        self._busy = False

    def _read(self) -> tuple[float, int] | None:
        try:
            with open(self._path, "rb") as handle:
                on_cpu, waiting, _ = handle.read().split()
        except (OSError, ValueError):  # not Linux, or the thread has ended
            return None
        return time.monotonic(), int(on_cpu) + int(waiting)

    def busy(self) -> bool:
        """Whether the thread wanted a CPU for ``BUSY_SHARE`` of the last look's interval."""
        last = self._last
        if last is None or time.monotonic() - last[0] < LOOK_EVERY_S:
            return self._busy
        now = self._read()
        if now is None:
            self._last, self._busy = None, False
            return False
        self._busy = (now[1] - last[1]) / 1e9 >= BUSY_SHARE * (now[0] - last[0])
        self._last = now
        return self._busy
