"""The chaos run's fault schedule: drawn from ``random.Random(seed)`` alone, so a seed replays the same faults.

Times are seconds of the run's clock: the trainer's logging time, which stands still while a SIGKILLed trainer
is being replaced (so the faults after a resume keep their place in the run). What each fault does is in
``benchmarks/chaos.py``.

Rules the draw keeps, and why:

- at most one trainer SIGKILL, early (15-35% of the run): the spool-disk fill and the poison batch come after it,
  so the report that names what they cost is the one the last trainer prints at ``finish()`` (a SIGKILLed trainer
  prints none);
- MLflow cuts and stalls never overlap each other (one proxy, one state at a time), nor does a disk fill another;
- nothing starts in the last 15% of the run, and every outage has ended by then: the end of the run is quiet;
- a lane is killed at most ``MAX_KILLS_PER_LANE`` times (a lane actor is restarted ``max_restarts`` = 5 times,
  then given up: that would be a different fault);
- no lane or producer is killed while the spool's disk is full or within ``AFTER_DISK_S`` of it being freed (a kill
  drawn there moves after): durability is off then, and what a kill costs meanwhile is the documented cost of a
  full disk (docs/reliability.md, disk faults: a batch a restarted lane actor applies twice, a dead producer's
  unspooled batches), not a loss the report counts exactly.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

AFTER_DISK_S = 5.0
"""After a disk fill ends: durability is back on (retried every second) and every lane actor saved its state."""
KINDS = ("lane_kill", "mlflow_cut", "mlflow_stall", "producer_kill", "trainer_kill", "disk_fill", "poison")
MAX_KILLS_PER_LANE = 3
QUIET_TAIL = 0.15
"""The last part of the run has no fault in it."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of the schedule: when (run clock, s), what, on what, and for how long (outages)."""

    at: float
    kind: str
    target: str = ""
    duration: float = 0.0

    def describe(self) -> str:
        text = f"{self.at:7.1f} s  {self.kind:<13} {self.target}"
        return text + (f" for {self.duration:.1f} s" if self.duration else "")

    def to_plain(self) -> dict:
        return asdict(self)


def counts_for(minutes: float) -> dict[str, int]:
    """How many faults of each kind a run of ``minutes`` gets (a short run still gets one of each)."""
    return {"lane_kill": max(2, round(2 * minutes)), "mlflow_cut": max(1, round(minutes / 2)),
            "mlflow_stall": max(1, round(minutes / 2)), "producer_kill": max(2, round(1.5 * minutes)),
            "trainer_kill": 1, "disk_fill": max(1, round(minutes / 3)), "poison": 1}


def draw_schedule(seed: int, window_s: float, kinds: tuple[str, ...], lanes: list[str], producers: int,
                  counts: dict[str, int] | None = None) -> list[Fault]:
    """The faults of one run, sorted by time: ``kinds`` chosen ones, ``counts`` of each (``counts_for`` the run's
    length by default), over a run of ``window_s`` seconds, with ``lanes`` to kill and ``producers`` producers."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; choose from {', '.join(KINDS)}")
    rng = random.Random(seed)
    counts = counts or counts_for(window_s / 60)
    end = window_s * (1 - QUIET_TAIL)
    faults: list[Fault] = []
    # Drawn in a fixed order of kinds, each from the same generator: a seed gives the same schedule for the same
    # kinds and length, whatever the machine.
    if "trainer_kill" in kinds and counts.get("trainer_kill", 0):
        faults.append(Fault(round(rng.uniform(0.15, 0.35) * window_s, 1), "trainer_kill", "rank0"))
    after_resume = max((f.at for f in faults), default=0.0) + 1.0
    longest = min(10.0, max(3.0, 0.12 * window_s))  # an outage: 3-10 s, longer than the MLflow client's own retries
    windows: list[tuple[float, float]] = []
    for kind in ("mlflow_cut", "mlflow_stall"):
        if kind in kinds:
            for _ in range(counts.get(kind, 0)):
                duration = round(rng.uniform(0.5, 1.0) * longest, 1)
                start = _free_start(rng, windows, 0.05 * window_s, end - duration, duration)
                if start is not None:
                    windows.append((start, start + duration))
                    faults.append(Fault(start, kind, "mlflow", duration))
    disks: list[tuple[float, float]] = []
    if "disk_fill" in kinds:
        for _ in range(counts.get("disk_fill", 0)):
            duration = round(rng.uniform(3.0, 8.0), 1)
            start = _free_start(rng, disks, max(after_resume, 0.4 * window_s), end - duration, duration)
            if start is not None:
                disks.append((start, start + duration))
                faults.append(Fault(start, "disk_fill", "spool", duration))
    if "poison" in kinds and counts.get("poison", 0):
        faults.append(Fault(round(rng.uniform(max(after_resume, 0.4 * window_s), end), 1), "poison", "mlflow"))
    if "lane_kill" in kinds:
        kills: dict[str, int] = {}
        for _ in range(counts.get("lane_kill", 0)):
            choices = [lane for lane in lanes if kills.get(lane, 0) < MAX_KILLS_PER_LANE]
            if not choices:
                break
            lane = rng.choice(choices)
            kills[lane] = kills.get(lane, 0) + 1
            faults.append(Fault(round(rng.uniform(0.05 * window_s, end), 1), "lane_kill", lane))
    if "producer_kill" in kinds:
        for _ in range(counts.get("producer_kill", 0)):
            faults.append(Fault(round(rng.uniform(0.05 * window_s, end), 1), "producer_kill",
                                f"p{rng.randrange(producers)}"))
    moved: list[Fault] = []
    for fault in faults:
        if fault.kind in ("lane_kill", "producer_kill"):
            fault = _after_disks(fault, disks)
            while any(m.target == fault.target and abs(m.at - fault.at) < 1.0 for m in moved):  # two kills moved
                fault = Fault(round(fault.at + 1.0, 1), fault.kind, fault.target, fault.duration)  # together
        moved.append(fault)
    faults = moved
    return sorted(faults, key=lambda f: (f.at, KINDS.index(f.kind), f.target))


def _after_disks(fault: Fault, disks: list[tuple[float, float]]) -> Fault:
    for start, end in sorted(disks):
        if start - 1.0 <= fault.at <= end + AFTER_DISK_S:
            return Fault(round(end + AFTER_DISK_S + 0.1, 1), fault.kind, fault.target, fault.duration)
    return fault


def _free_start(rng: random.Random, taken: list[tuple[float, float]], low: float, high: float,
                duration: float) -> float | None:
    """A start in [low, high] whose window of ``duration`` (plus 2 s either side) overlaps none taken."""
    for _ in range(200):
        if high <= low:
            return None
        start = round(rng.uniform(low, high), 1)
        if all(start + duration + 2.0 <= a or start >= b + 2.0 for a, b in taken):
            return start
    return None
