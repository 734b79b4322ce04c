"""A process's CPU with what it started: a lane's own figure must count its tracker's helper processes too.

wandb's lane runs wandb-core, a process of its own that does most of wandb's work; a lane's CPU per record compared
with the bare SDK's (tracklane.benchmarks.capacity) counts it on both sides. Children that ended and were waited for are in
``RUSAGE_CHILDREN``; live ones are asked through psutil, at most every ``LOOK_EVERY_S`` (a look reads /proc).
"""

from __future__ import annotations

import resource
import time

import psutil

LOOK_EVERY_S = 1.0


class ProcessCpu:
    """CPU seconds of this process, its ended children and its live descendants."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._live = 0.0
        self._looked = 0.0

    def seconds(self, fresh: bool = False) -> float:
        """The total now; ``fresh``: look at the live children now, not up to ``LOOK_EVERY_S`` ago."""
        now = time.monotonic()
        if fresh or now - self._looked >= LOOK_EVERY_S:
            self._looked = now
            self._live = sum(_cpu(child) for child in self._me.children(recursive=True))
        ended = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ended.ru_utime + ended.ru_stime + self._live


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:  # ended meanwhile: counted in RUSAGE_CHILDREN once waited for
        return 0.0
    return times.user + times.system
