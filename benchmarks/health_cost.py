"""What the health rules cost the trainer: ``log()`` on the caller's thread and the trainer process's CPU with
``trainer.health`` off and on, in interleaved rounds (this machine is noisy), and the health lane actor's CPU.

    python -m tracklane.benchmarks.health_cost [--rounds 3] [--steps 400]

Each round runs one async run per setting (file tracker, ~100 verl scalars a step, 2 ms apart; the verl keys the
rules read among them). Prints one JSON line: per setting log() p50/p99 in us, the trainer process's CPU seconds,
the health actor's CPU seconds; and the on/off ratios. The rules run in their lane actor, never in ``log()``.
The synthetic scalars fire two rules (length_clipped, clip_saturated): the rules judge and alert while measured.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import psutil

from tracklane.benchmarks.harness import p50_p99
from tracklane.benchmarks.workloads import verl_scalars


def one_run(health: bool, steps: int, folder: str) -> dict:
    from tracklane import Tracking

    os.environ["VERL_FILE_LOGGER_PATH"] = os.path.join(folder, f"health-{health}-{time.time_ns()}.jsonl")
    config = {"trainer": {"log_async": True, "health": {"enabled": health}}}
    tracking = Tracking("bench", "health_cost", ["file"], config=config)
    tracking.flush(120)
    me, costs = psutil.Process(), []
    cpu = sum(me.cpu_times()[:2])
    for step in range(1, steps + 1):
        time.sleep(0.002)
        data = verl_scalars(step)
        started = time.perf_counter_ns()
        tracking.log(data, step=step)
        costs.append((time.perf_counter_ns() - started) / 1e3)
    tracking.flush(120)
    trainer_cpu = sum(me.cpu_times()[:2]) - cpu
    lanes = tracking.lanes()
    health_cpu = sum(psutil.Process(lanes["health"].pid).cpu_times()[:2]) if "health" in lanes else 0.0
    report = tracking.finish()
    assert report.complete, report.summary()
    return {"log_us": costs, "trainer_cpu_s": trainer_cpu, "health_actor_cpu_s": health_cpu,
            "alerts": len(report.alerts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ["TRACKLANE_SYSTEM_METRICS_S"] = "0"
    folder = tempfile.mkdtemp(prefix="tracklane-health-cost-")
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for name in ("off", "on"):
            runs[name].append(one_run(name == "on", args.steps, folder))
    out = {}
    for name, results in runs.items():
        out[name] = {"log_us": p50_p99([c for r in results for c in r["log_us"]]),
                     "trainer_cpu_s": sum(r["trainer_cpu_s"] for r in results) / len(results),
                     "health_actor_cpu_s": sum(r["health_actor_cpu_s"] for r in results) / len(results),
                     "alerts": sum(r["alerts"] for r in results)}
    out["ratio_on_off"] = {"log_p50": out["on"]["log_us"]["p50"] / out["off"]["log_us"]["p50"],
                           "log_p99": out["on"]["log_us"]["p99"] / out["off"]["log_us"]["p99"],
                           # None: too short a run for the CPU clock's 10 ms ticks
                           "trainer_cpu": out["on"]["trainer_cpu_s"] / out["off"]["trainer_cpu_s"]
                           if out["off"]["trainer_cpu_s"] else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
