"""The producers series of ``tracklane.benchmarks.scaling``: 1..8 Ray actors logging trajectories into one run.

Each producer is a Ray actor (a rollout worker) that logs, every ``period_s``, a few scalars and
``nbytes`` of trajectories through ``tracking.producer()``, while rank 0 logs verl's scalars at the
same pace. Per point: the producers' cost per step of logging calls (p50/p99 over every producer's
calls but its first, which starts its shipper: ``first_call_ms``, the slowest), what was dropped,
the lanes' lag p99 and how long ``finish()`` took. ``two_nodes`` runs one point on a 2-node
``ray.cluster_utils.Cluster`` on this machine: the lanes on the second node (a ``logging_node``
resource), the producers alternating between the nodes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import ray

from tracklane.benchmarks.harness import BenchEnv, percentile
from tracklane.benchmarks.modes import TracklaneMode
from tracklane.benchmarks.workloads import trajectories, verl_scalars


@ray.remote(num_cpus=0)
class Rollout:
    """A rollout worker of the job, logging through the producer it was given."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def run(self, steps: int, period_s: float, nbytes: int, index: int) -> dict[str, Any]:
        count = max(1, nbytes // 4096)
        batches = [trajectories(count, index * 1000 + i, chars=nbytes // count // 2, tokens=max(1, nbytes // count // 8))
                   for i in range(4)]
        call_us = []
        for step in range(steps):
            time.sleep(period_s)
            started = time.perf_counter()
            self.producer.log({"reward/mean": float(step), "response_length/mean": 12.0}, step=step)
            self.producer.log_trajectories(batches[step % len(batches)], step=step)
            call_us.append((time.perf_counter() - started) * 1e6)
        self.producer.flush(300.0)
        return {"call_us": call_us, "node": ray.get_runtime_context().get_node_id()}


def producer_point(env: BenchEnv, n: int, nbytes: int, period_s: float, seconds: float, *, name: str,
                   async_log: dict[str, Any], limits: dict[str, Any], nodes: list[str] | None = None) -> dict[str, Any]:
    mode = TracklaneMode("async", ["file"], env.place(name), async_log, record_limits=limits)
    steps = max(5, int(seconds / period_s))

    def placed(i: int) -> Any:
        if not nodes:
            return Rollout
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=False)
        return Rollout.options(scheduling_strategy=strategy)

    workers = [placed(i).remote(mode.tracking.producer(f"rollout{i}")) for i in range(n)]
    runs = [worker.run.remote(steps, period_s, nbytes, i) for i, worker in enumerate(workers)]
    for step in range(steps):  # rank 0 at the same pace
        time.sleep(period_s)
        mode.log(verl_scalars(step), step=step)
    results = ray.get(runs)
    started = time.perf_counter()
    report = mode.finish()
    finish_s = time.perf_counter() - started
    for worker in workers:
        ray.kill(worker)
    calls = [us for r in results for us in r["call_us"][1:]]
    logged = sum(p.logged for p in report.producers.values())
    return {"producers": n, "nodes": len({r["node"] for r in results}), "steps": steps,
            "raw_mb_per_s": n * nbytes / period_s / 1e6, "call_us_p50": statistics.median(calls),
            "call_us_p99": percentile(calls, 0.99), "first_call_ms": max(r["call_us"][0] for r in results) / 1e3,
            "logged": logged,
            "dropped": report.dropped_records + max((lane.dropped_records for lane in report.lanes.values()), default=0)
            + sum(p.dropped + p.unshipped for p in report.producers.values()),
            "lag_p99_s": max(lane.lag_p99_s for lane in report.lanes.values()), "finish_s": finish_s,
            "complete": report.complete, "lanes_on": sorted({lane.node_id for lane in mode.tracking.lanes().values()})}


def producer_series(env: BenchEnv, counts: list[int], nbytes: int, period_s: float, seconds: float,
                    async_log: dict[str, Any], limits: dict[str, Any]) -> list[dict[str, Any]]:
    return [producer_point(env, n, nbytes, period_s, seconds, name=f"producers{n}", async_log=async_log,
                           limits=limits) for n in counts]


def two_nodes(env: BenchEnv, n: int, nbytes: int, period_s: float, seconds: float, async_log: dict[str, Any],
              limits: dict[str, Any]) -> dict[str, Any]:
    """One producers point on two Ray nodes (this process's Ray is shut down first and left down)."""
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, resources={"logging_node": 1})
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        point = producer_point(env, n, nbytes, period_s, seconds, name=f"two-nodes{n}",
                               async_log={**async_log, "actor_options": {"resources": {"logging_node": 0.01}}},
                               limits=limits, nodes=nodes)
        point["driver_node"] = ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return point
