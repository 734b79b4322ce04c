"""tracklane.benchmarks.scale's producers: 1 to 64 Ray actors on a two-node local cluster, metrics reduced across them.

Each producer (a rollout worker) logs, every step, its samples' metrics reduced across producers
(``log(..., reduce={...})``: mean reward, max response length, summed sample count) and two metrics of its own
(under its prefix). Rank 0 logs its own step's scalars at the same pace. The file tracker is read back: every
reduced key at every step once, equal to the op over every producer, and every producer's own keys once a step.
Rank 0's CPU per producer is its process's CPU above the same run with no producer, divided by the producers; the
lanes' CPU per record is each lane's CPU over the records it wrote.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import ray

from tracklane.benchmarks import plots
from tracklane.benchmarks.harness import BenchEnv, fmt, table

REDUCE = {"sample/reward_mean": "mean", "sample/response_length_max": "max", "sample/count": "sum"}


@ray.remote(num_cpus=0)
class Worker:
    """A rollout worker logging through the producer it was given."""

    def __init__(self, producer: Any, index: int) -> None:
        self.producer, self.index = producer, index

    def run(self, steps: int, period_s: float, start_at: float) -> dict[str, Any]:
        time.sleep(max(0.0, start_at - time.time()))
        for step in range(1, steps + 1):
            self.producer.log(values(self.index, step), step=step, reduce=REDUCE)
            self.producer.log({"own/throughput": float(self.index + step), "own/queue": self.index}, step=step)
            time.sleep(max(0.0, start_at + step * period_s - time.time()))
        self.producer.flush(120.0)
        return {"node": ray.get_runtime_context().get_node_id()}


def values(index: int, step: int) -> dict[str, float]:
    return {"sample/reward_mean": (index % 7) * 0.1 + step, "sample/response_length_max": 100.0 + index + step,
            "sample/count": 8.0}


def expected(n: int, step: int) -> dict[str, float]:
    each = [values(i, step) for i in range(n)]
    return {"sample/reward_mean": sum(v["sample/reward_mean"] for v in each) / n,
            "sample/response_length_max": max(v["sample/response_length_max"] for v in each),
            "sample/count": sum(v["sample/count"] for v in each)}


def point(env: BenchEnv, n: int, steps: int, period_s: float, nodes: list[str]) -> dict[str, Any]:
    from tracklane import Tracking

    name = f"producers{n}"
    root = env.root / name
    root.mkdir(parents=True, exist_ok=True)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(root / "metrics.jsonl")
    tracking = Tracking("scale", name, ["file"], config={"trainer": {"log_async": True,
                                                                     "async_log": {"reductions": True}}})
    tracking.wait_ready(120)
    opened = {name: lane.cpu_s for name, lane in tracking.flush(60).lanes.items()}  # their start, not the records'
    workers = [Worker.options(scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        nodes[i % len(nodes)], soft=False)).remote(tracking.producer(f"w{i}"), i) for i in range(n)]
    ray.get([w.__ray_ready__.remote() for w in workers])  # started (and placed) before the timed part
    start_at = time.time() + 1.0
    cpu0 = time.process_time()
    runs = [w.run.remote(steps, period_s, start_at) for w in workers]
    time.sleep(max(0.0, start_at - time.time()))
    for step in range(1, steps + 1):
        tracking.log({"rank0/loss": 1.0 / step, "rank0/lr": 1e-6}, step=step)
        time.sleep(max(0.0, start_at + step * period_s - time.time()))
    placed = ray.get(runs)
    started = time.perf_counter()
    report = tracking.finish()
    finish_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu0
    for worker in workers:
        ray.kill(worker)
    lanes = {}
    for lane_name, lane in report.lanes.items():
        cpu = lane.cpu_s - opened.get(lane_name, 0.0)
        lanes[lane_name] = {"cpu_s": cpu, "records": lane.records_written,
                            "ms_per_record": 1e3 * cpu / max(1, lane.records_written)}
    return {"producers": n, "steps": steps, "nodes": len({p["node"] for p in placed}), "rank0_cpu_s": cpu_s,
            "finish_s": finish_s, "complete": report.complete, "dropped": report.dropped_records,
            "lanes": lanes, "check": check(root / "metrics.jsonl", n, steps)}


def check(path: Path, n: int, steps: int) -> dict[str, int]:
    """Points found once and right, twice, wrong or missing, in the file tracker's lines."""
    seen: dict[tuple[int, str], list[float]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if row.get("step") is None or row.get("axis") is not None:
                continue
            for key, value in row["data"].items():
                if key in REDUCE or key.startswith("w") and "/own/" in key or key.startswith("rank0/"):
                    seen.setdefault((row["step"], key), []).append(value)
    wanted: dict[tuple[int, str], float | None] = {}
    for step in range(1, steps + 1):
        if n:
            wanted.update({(step, key): value for key, value in expected(n, step).items()})
        wanted.update({(step, f"w{i}/own/{k}"): None for i in range(n) for k in ("throughput", "queue")})
        wanted.update({(step, "rank0/loss"): None, (step, "rank0/lr"): None})
    once = twice = wrong = 0
    for key, want in wanted.items():
        got = seen.get(key, [])
        if len(got) > 1:
            twice += 1
        elif len(got) == 1 and (want is None or abs(got[0] - want) < 1e-9):
            once += 1
        elif got:
            wrong += 1
    return {"expected": len(wanted), "once": once, "twice": twice, "wrong": wrong,
            "missing": sum(1 for key in wanted if key not in seen), "unexpected": sum(1 for key in seen if key not in wanted)}


def producers(env: BenchEnv, quick: bool) -> list[dict[str, Any]]:
    """The series on a two-node cluster of this machine (the benchmark's own Ray is down by now)."""
    from ray.cluster_utils import Cluster

    counts = [0, 1, 2, 4] if quick else [0, 1, 8, 16, 32, 64]
    steps, period_s = (4, 0.5) if quick else (20, 0.5)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    points = []
    try:
        cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        for n in counts:
            p = point(env, n, steps, period_s, nodes)
            points.append(p)
            print(f"  {n} producers: rank 0 CPU {p['rank0_cpu_s']:.2f} s, {p['check']}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    base = next((p["rank0_cpu_s"] for p in points if p["producers"] == 0), 0.0)
    for p in points:
        p["rank0_cpu_ms_per_producer"] = 1e3 * (p["rank0_cpu_s"] - base) / p["producers"] if p["producers"] else None
    return points


def print_producers(points: list[dict[str, Any]]) -> None:
    rows = [[p["producers"], p["nodes"], fmt(p["rank0_cpu_s"]), fmt(p["rank0_cpu_ms_per_producer"], 1),
             ", ".join(f"{name} {fmt(lane['ms_per_record'], 2)}" for name, lane in p["lanes"].items()),
             fmt(p["finish_s"], 1),
             f"{p['check']['once']}/{p['check']['expected']} once, {p['check']['twice']} twice, "
             f"{p['check']['wrong']} wrong, {p['check']['missing']} missing"] for p in points]
    print(table(["producers", "nodes", "rank 0 CPU s", "rank 0 ms/producer", "lane CPU ms/record", "finish s",
                 "points in the file"], rows))


def producer_figures(out: Path, points: list[dict[str, Any]]) -> list[Path]:
    real = [p for p in points if p["producers"]]
    if len(real) < 2:
        return []
    return [plots.lines(out / "scale_producers.png", "Producers: rank 0 and lane CPU (reductions on)",
                [p["producers"] for p in real],
                {"rank 0 CPU ms per producer": [p["rank0_cpu_ms_per_producer"] for p in real],
                 **{f"{name} lane CPU ms / 100 records": [100 * p["lanes"][name]["ms_per_record"] for p in real]
                    for name in real[0]["lanes"]}},
                "producers", "ms", log_x=True)]
