"""The timed loops: a GPU-like training step, and a bare ``log()`` call-cost loop.

A GPU-like step is a fixed wall time that leaves the CPU free (a sleep), then the step's
records are built and logged, as verl's trainer does after each step. A Python-bound step
computes in Python for the same time instead, holding the GIL. Step time is the whole
iteration, so a logging call that blocks shows up in it directly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from tracklane.benchmarks.harness import proc_kib
from tracklane.benchmarks.workloads import Workload, generations, trajectories, verl_scalars


@dataclass(slots=True)
class StepTimes:
    step_s: list[float] = field(default_factory=list)
    """Wall time of each step, logging included."""
    log_us: list[float] = field(default_factory=list)
    """Caller-thread time in ``log()`` of the scalars."""
    logging_us: list[float] = field(default_factory=list)
    """Caller-thread time in every logging call of the step (scalars, trajectories, generations)."""
    rss_kib: list[int] = field(default_factory=list)
    """The trainer process's resident memory, sampled every 10 steps."""
    logged: dict[str, int] = field(default_factory=lambda: {"scalars": 0, "trajectories": 0, "generations": 0})


def python_work(seconds: float) -> None:
    """Hold the GIL computing in Python for ``seconds`` (reward code, data handling): a thread beside it
    gets the interpreter only at its switch interval."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(200):
            total += i * i


def gpu_steps(mode, step_s: float, workload: Workload, steps: int, first_step: int, kept_trajectories: int,
              warmup: int = 3, python_bound: bool = False) -> StepTimes:
    """``warmup`` + ``steps`` GPU-like steps logged through ``mode``, the first ``warmup`` not timed.

    ``kept_trajectories``: how many of a step's trajectories a tracker will store. ``python_bound``: the
    step computes in Python for ``step_s`` instead of waiting (the same records are logged).
    """
    out = StepTimes()
    now, ns = time.perf_counter, time.perf_counter_ns
    work = python_work if python_bound else time.sleep
    for step in range(first_step, first_step + warmup + steps):
        started = now()
        work(step_s)
        metrics = verl_scalars(step)
        batch = trajectories(workload.trajectories, step) if workload.trajectories else None
        validating = workload.generations_every and step % workload.generations_every == 0
        samples = generations(workload.generations, step) if validating else None
        t0 = ns()
        mode.log(metrics, step=step)
        t1 = ns()
        if batch is not None:
            mode.log_trajectories(batch, step=step)
        if samples is not None:
            mode.log_generations(samples, step=step)
        t2 = ns()
        if step >= first_step + warmup:
            out.step_s.append(now() - started)
            out.log_us.append((t1 - t0) / 1e3)
            out.logging_us.append((t2 - t0) / 1e3)
        out.logged["scalars"] += len(metrics)
        out.logged["trajectories"] += min(len(batch), kept_trajectories) if batch is not None else 0
        out.logged["generations"] += 1 if samples is not None else 0
        if step % 10 == 0:  # outside the timed part
            out.rss_kib.append(proc_kib(os.getpid(), "VmRSS"))
    return out


@dataclass(slots=True)
class CallCosts:
    warm_us: list[float] = field(default_factory=list)
    cold_us: list[float] = field(default_factory=list)
    floor_warm_us: list[float] = field(default_factory=list)
    floor_cold_us: list[float] = field(default_factory=list)


def call_costs(mode, calls: int, gap_s: float, idle_s: float = 0.02, first_step: int = 1) -> CallCosts:
    """``log()`` of ~100 scalars every ``gap_s``; every 10th call after ``idle_s`` idle (cold caches).

    The floor beside it is a bare ``dict.copy()`` of the same dict in the same loop, the order of
    the two alternated so neither warms the caches for the other.
    """
    out = CallCosts()
    ns = time.perf_counter_ns
    for step in range(first_step, first_step + calls):
        cold = step % 10 == 0
        time.sleep(idle_s if cold else gap_s)
        data = verl_scalars(step)
        if step % 2:
            t0 = ns(); mode.log(data, step=step); t1 = ns(); data.copy(); t2 = ns()  # noqa: E702
            cost, floor = t1 - t0, t2 - t1
        else:
            t0 = ns(); data.copy(); t1 = ns(); mode.log(data, step=step); t2 = ns()  # noqa: E702
            floor, cost = t1 - t0, t2 - t1
        (out.cold_us if cold else out.warm_us).append(cost / 1e3)
        (out.floor_cold_us if cold else out.floor_warm_us).append(floor / 1e3)
    return out
