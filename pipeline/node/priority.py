"""Logging work yields the CPU to the trainer: a lane actor's process runs at a lower scheduling priority.

``trainer.async_log.background_priority``:

    1..19     that nice level (the default 10: weight 110 of a nice-0 task's 1024; 19, the lowest, 15).
    "idle"    SCHED_IDLE (Linux): the kernel runs it when no normal task wants the CPU; a busy trainer
              is never preempted for it. It still gets a sliver (weight 3), so a lane on a saturated
              machine falls behind (53-68 s and growing, measured) but does not stop.
    "normal"  unchanged (0 also means unchanged).

Linux schedules threads, not processes: the setting is applied to every thread the process already has
(Ray's own among them) and to every thread of the processes it started (wandb-core), and threads and processes
started afterwards inherit it. Raising priority back needs privileges, so it is lowered only once, in a process
tracklane owns. The setting is checked where the config is read (config/async_log.py).

A lane actor lowers itself once its tracker is open (lane_actor.py): importing an SDK and opening a run is a
one-time cost of seconds of CPU, and at SCHED_IDLE on a saturated node it took minutes (measured with
``tracklane.benchmarks.busy``: at 4 busy processes per core, no SDK lane had opened 2 minutes after ``Tracking()``).
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger("tracklane")


def lower_priority(setting: str | int) -> None:
    """Lower this whole process (every thread) and the processes it started to ``setting``.

    Never raises: a platform without SCHED_IDLE falls back to nice 19, and a refusal leaves it as it was.
    """
    if setting == "normal":
        return
    tids = [tid for pid in (0, *_children()) for tid in _threads(pid)]
    if setting == "idle" and hasattr(os, "SCHED_IDLE"):
        try:
            for tid in tids:
                with contextlib.suppress(ProcessLookupError):  # a thread may end between listing and setting it
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError as exc:
            log.debug("tracklane: SCHED_IDLE refused (%s); nice 19 instead", exc)
    level = 19 if setting == "idle" else int(setting)
    try:
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, tid, max(level, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as exc:
        log.debug("tracklane: cannot lower this process's priority (%s)", exc)


def _threads(pid: int = 0) -> list[int]:
    """A process's thread ids (0: this one; Linux: /proc/<pid>/task); elsewhere only the process itself."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        return [pid]


def _children() -> list[int]:
    """The processes this one started, and theirs (an SDK's service: wandb-core)."""
    import psutil

    try:
        return [child.pid for child in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []
