"""Caller-thread cost of the rich-record calls on the async path (the rich-records issue's figures).

    python -m benchmarks.rich_figures [--steps 100]

log_trajectories: 256 trajectories a step, each ~2 KB of text and 512 token ids (numpy int32);
log_generations: 64 validation samples a step. Backends: file and memory (the cost on the
caller's thread does not depend on them: it is a copy and an append).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from pipeline import Tracking


def trajectories(n: int, step: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": "q" * 500}, {"role": "assistant", "content": "a" * 1500}],
             "tool_calls": [{"name": "python", "arguments": "x=1", "result": "1", "latency_s": 0.01}],
             "rewards": {"score": float(i % 2)}, "meta": {"sample_index": i, "rollout_index": i % 8, "validation": False},
             "token_ids": np.arange(512, dtype=np.int32) + step} for i in range(n)]


def generations(n: int) -> list[tuple]:
    return [(f"prompt {i} " * 20, f"answer {i} " * 40, float(i % 2)) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * q))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    os.environ["VERL_FILE_LOGGER_PATH"] = os.path.join(tempfile.mkdtemp(prefix="tracklane-rich-"), "m.jsonl")
    tracking = Tracking("bench", "rich", ["file", "memory"], config={"trainer": {"log_async": True}})
    tracking.flush(timeout=120)
    costs: dict[str, list[float]] = {"log_trajectories (256)": [], "log_generations (64)": []}
    for step in range(args.steps):
        batch, samples = trajectories(256, step), generations(64)
        time.sleep(0.05)
        started = time.perf_counter()
        tracking.log_trajectories(batch, step=step)
        costs["log_trajectories (256)"].append(time.perf_counter() - started)
        started = time.perf_counter()
        tracking.log_generations(samples, step=step)
        costs["log_generations (64)"].append(time.perf_counter() - started)
    report = tracking.finish(timeout=300)
    for name, values in costs.items():
        print(f"{name:24} p50 {percentile(values, .5) * 1e6:7.0f} us   p99 {percentile(values, .99) * 1e6:7.0f} us")
    print(report.summary())
    return 0 if report.complete else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
