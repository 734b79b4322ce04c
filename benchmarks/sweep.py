"""Tuning sweep: queue size x flush interval x overflow policy, producer below and above the trackers' pace.

    python -m tracklane.benchmarks.sweep [--quick] [--out DIR] [--mlflow-uri URI]

Trackers: MLflow on a real server (the slowest here: one HTTP upload per artifact) and the file
logger (fast), so one lane falls behind while the other keeps up. ``--quick`` puts TensorBoard in
MLflow's place: every cell opens its own lanes, and an MLflow lane takes seconds to open (its SDK's
import alone ~4 s here). The producer logs scalars plus 64 trajectories (~370 KB raw) a step at a
fixed rate. A calibration run first measures how many bytes a second the slowest lane absorbs;
"below" then produces at half that, "above" at twice. "Queue size" sets both bounds,
``queue_max_bytes`` (trainer side) and ``lane_max_bytes`` (per tracker). Writes ``sweep.json``,
heatmaps and the recommended ``trainer.async_log`` values.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

from tracklane.benchmarks import plots
from tracklane.benchmarks.harness import (
    BenchEnv,
    Clock,
    common_args,
    fmt,
    machine,
    percentile,
    proc_kib,
    quiet_stdout,
    table,
    write_json,
)
from tracklane.benchmarks.modes import TracklaneMode
from tracklane.benchmarks.workloads import trajectories, trajectory_bytes, verl_scalars

TRACKERS = ("mlflow", "file")
QUICK_TRACKERS = ("tensorboard", "file")
PER_STEP = 64
MiB = 2**20
LAG_LIMIT_S = 5.0  # the recommendation rule: lag p99 of the slowest lane under this, below the trackers' pace


@dataclass(frozen=True, slots=True)
class Grid:
    queue_mib: tuple[float, ...]
    flush_s: tuple[float, ...]
    seconds: float
    """How long each cell produces."""
    trackers: tuple[str, ...] = TRACKERS
    """The first is the slow lane, the file logger the fast one."""


def grid(quick: bool) -> Grid:
    if quick:  # every axis and both loads, the fewest values: a cell is mostly its two lane actors starting
        return Grid(queue_mib=(1, 16), flush_s=(0.2,), seconds=1.0, trackers=QUICK_TRACKERS)
    return Grid(queue_mib=(1, 4, 16, 64), flush_s=(0.1, 0.5, 2.0), seconds=8.0)


def async_log(queue_mib: float, flush_s: float, overflow: str) -> dict:
    queue = int(queue_mib * MiB)
    # Health metrics off: then every record a lane counts as dropped is one the user logged.
    return {"queue_max_bytes": queue, "lane_max_bytes": queue, "flush_interval_s": flush_s,
            "max_batch_bytes": min(4 * MiB, queue // 4), "overflow": overflow, "block_timeout_s": 5.0,
            "log_vitals": False}


def produce(log, log_trajectories, period_s: float, seconds: float, sample=None) -> dict:
    """Log one step every ``period_s`` (a sleep stands in for the GPU) for ``seconds``; time each step."""
    steps, step_s, call_us, memory = int(seconds / period_s), [], [], []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        time.sleep(period_s)
        metrics, batch = verl_scalars(step), trajectories(PER_STEP, step)
        t0 = time.perf_counter()
        log(metrics, step=step)
        log_trajectories(batch, step=step)
        call_us.append((time.perf_counter() - t0) * 1e6)
        step_s.append(time.perf_counter() - started)
        if sample is not None:
            memory.append(sample())
    return {"steps": steps, "step_s": step_s, "call_us": call_us, "memory": memory}


def _pipeline_bytes(mode: TracklaneMode) -> int:
    """Bytes held in the pipeline now: every lane's unacknowledged batches, plus the trainer-side buffer as of
    the last batch shipped (at most one flush interval old)."""
    tracking = mode.tracking
    buffered = int(tracking.vitals().get("tracklane/queue_bytes", 0))
    return buffered + sum(lane.unstored_bytes for lane in tracking.lanes().values())


def calibrate(env: BenchEnv, trackers: tuple[str, ...], steps: int) -> dict:
    """Steps a second the slowest lane absorbs: log ``steps`` flat out into roomy bounds, time until all are stored."""
    place = env.place("calibrate")
    with quiet_stdout():
        mode = TracklaneMode("async", list(trackers), place, async_log(256, 0.5, "drop_oldest"), {"max_trajectories": PER_STEP})
        started = time.perf_counter()
        for step in range(1, steps + 1):
            mode.log(verl_scalars(step), step=step)
            mode.log_trajectories(trajectories(PER_STEP, step), step=step)
        report = mode.tracking.flush(timeout=300)
        elapsed = time.perf_counter() - started
        mode.finish()
    return {"steps": steps, "seconds": elapsed, "raw_bytes_per_s": steps * _raw_step_bytes() / elapsed,
            "steps_per_s": steps / elapsed, "complete": report.complete}


def _raw_step_bytes() -> int:
    return PER_STEP * trajectory_bytes() + 100 * 16


def baseline(period_s: float, seconds: float) -> float:
    """Median step time of the same producer without logging."""
    run = produce(lambda *a, **k: None, lambda *a, **k: None, period_s, seconds)
    return statistics.median(run["step_s"])


def cell(env: BenchEnv, trackers: tuple[str, ...], queue_mib: float, flush_s: float, overflow: str, period_s: float,
         seconds: float, base_s: float) -> dict:
    place = env.place(f"q{queue_mib:g}-f{flush_s:g}-{overflow}")
    with quiet_stdout():
        mode = TracklaneMode("async", list(trackers), place, async_log(queue_mib, flush_s, overflow),
                             {"max_trajectories": PER_STEP})
        run = produce(mode.log, mode.log_trajectories, period_s, seconds, sample=lambda: _pipeline_bytes(mode))
        actors = {t: proc_kib(pid, "VmHWM") / 1024 for t, pid in mode.actor_pids().items()}
        started = time.perf_counter()
        report = mode.finish()
        finish_s = time.perf_counter() - started
    # The producer's drops plus the worst lane's (a batch dropped by two lanes is one loss per tracker, not two).
    dropped = report.dropped_records + max(lane.dropped_records for lane in report.lanes.values())
    logged = run["steps"] * 2  # one metrics record and one trajectories record a step
    return {"queue_mib": queue_mib, "flush_s": flush_s, "overflow": overflow, "steps": run["steps"],
            "ratio": statistics.median(run["step_s"]) / base_s, "step_p99_ratio": percentile(run["step_s"], 0.99) / base_s,
            "call_us_p50": percentile(run["call_us"], 0.5), "call_us_p99": percentile(run["call_us"], 0.99),
            "lag_p50_s": max(lane.lag_p50_s for lane in report.lanes.values()),
            "lag_p99_s": max(lane.lag_p99_s for lane in report.lanes.values()),
            "peak_pipeline_mib": max(run["memory"], default=0) / MiB, "actors_mib": actors,
            "dropped": dropped, "logged_records": logged, "drop_pct": 100.0 * dropped / max(1, logged),
            "finish_s": finish_s, "complete": report.complete}


def recommend(cells: list[dict], defaults: dict) -> dict:
    """The rule printed with the result: see ``rule`` below."""
    def at(load: str, overflow: str, c: dict) -> dict:
        return next(x for x in cells if x["load"] == load and x["overflow"] == overflow
                    and x["queue_mib"] == c["queue_mib"] and x["flush_s"] == c["flush_s"])

    below = [c for c in cells if c["load"] == "below"]
    pool = [c for c in below if c["dropped"] == 0 and c["lag_p99_s"] < LAG_LIMIT_S] or below
    best = min(pool, key=lambda c: (at("above", "drop_oldest", c)["dropped"], round(c["ratio"], 3),
                                    round(at("above", "drop_oldest", c)["ratio"], 3), c["peak_pipeline_mib"], c["lag_p99_s"]))
    above = [at("above", o, best) for o in ("drop_oldest", "block")]
    chosen = async_log(best["queue_mib"], best["flush_s"], "drop_oldest")
    return {"trainer.async_log": {k: chosen[k] for k in ("queue_max_bytes", "lane_max_bytes", "flush_interval_s",
                                                         "max_batch_bytes", "overflow")},
            "rule": (f"settings whose below-pace cell drops nothing with lag p99 < {LAG_LIMIT_S:g} s; among them the "
                     "fewest drops above the pace (drop_oldest), then the lowest below-pace step-time ratio (3 decimals), "
                     "then the lowest above-pace ratio, then the least pipeline memory, then the lowest lag. overflow "
                     "stays drop_oldest: 'block' turns a slow tracker into a slow training step (the above-pace block rows)"),
            "cell": best, "above_pace_same_settings": above, "current_defaults": defaults}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser, "sweep")
    args = parser.parse_args(argv)
    clock, g = Clock(), grid(args.quick)
    from tracklane import AsyncLogConfig

    defaults = {k: getattr(AsyncLogConfig(), k) for k in ("queue_max_bytes", "lane_max_bytes", "flush_interval_s",
                                                          "max_batch_bytes", "overflow")}
    result: dict = {"benchmark": "sweep", "quick": args.quick, "machine": machine(), "trackers": list(g.trackers),
                    "per_step_raw_bytes": _raw_step_bytes(), "grid": {"queue_mib": g.queue_mib, "flush_s": g.flush_s,
                                                                     "overflow": ["drop_oldest", "block"]}}
    with BenchEnv(args.mlflow_uri, "sweep") as env:
        print(f"[{clock.elapsed():5.0f} s] calibrating", flush=True)
        cal = calibrate(env, g.trackers, 10 if args.quick else 60)
        result["calibration"] = cal
        pace = cal["steps_per_s"]
        loads = {"below": 1 / (0.5 * pace), "above": 1 / (2.0 * pace)}
        result["loads"] = {name: {"period_s": p, "steps_per_s": 1 / p, "raw_mb_per_s": _raw_step_bytes() / p / 1e6}
                           for name, p in loads.items()}
        bases = {name: baseline(p, min(g.seconds, 3.0)) for name, p in loads.items()}
        cells = []
        for load, period in loads.items():
            for overflow in (("drop_oldest",) if load == "below" else ("drop_oldest", "block")):
                for q in g.queue_mib:
                    for f in g.flush_s:
                        print(f"[{clock.elapsed():5.0f} s] {load} q={q:g} MiB flush={f:g} s {overflow}", flush=True)
                        cells.append({"load": load, **cell(env, g.trackers, q, f, overflow, period, g.seconds,
                                                           bases[load])})
    result["cells"] = cells
    result["recommended"] = recommend(cells, defaults)
    result["plots"] = [str(p) for p in plot(cells, g, args.out)]
    print_tables(result)
    result["wall_s"] = clock.elapsed()
    path = write_json(args.out, "sweep", result)
    print(f"\nwrote {path} and {len(result['plots'])} plots; wall time {result['wall_s']:.0f} s")
    print("regenerate: python -m tracklane.benchmarks.sweep" + (" --quick" if args.quick else ""))
    return 0


FIGURES = {"ratio": ("step-time ratio (median)", 3), "lag_p99_s": ("lag p99, slowest lane (s)", 1),
           "peak_pipeline_mib": ("peak bytes held in the pipeline (MiB)", 1), "drop_pct": ("records dropped (%)", 1)}


def plot(cells: list[dict], g: Grid, out) -> list:
    paths = []
    for load, overflow in (("below", "drop_oldest"), ("above", "drop_oldest"), ("above", "block")):
        chosen = [c for c in cells if c["load"] == load and c["overflow"] == overflow]
        for key, (title, digits) in FIGURES.items():
            values = [[next((c[key] for c in chosen if c["queue_mib"] == q and c["flush_s"] == f), None)
                       for f in g.flush_s] for q in g.queue_mib]
            paths.append(plots.heatmap(out / f"sweep_{load}_{overflow}_{key}.png", f"{title}: {load} pace, {overflow}",
                                       [f"{q:g} MiB" for q in g.queue_mib], [f"{f:g} s" for f in g.flush_s], values,
                                       "queue size", "flush interval", digits))
    return paths


def print_tables(result: dict) -> None:
    cal = result["calibration"]
    print(f"\ncalibration: the slowest lane absorbed {cal['steps_per_s']:.1f} steps/s "
          f"({cal['raw_bytes_per_s'] / 1e6:.1f} MB/s raw) of scalars + {PER_STEP} trajectories")
    for name, load in result["loads"].items():
        print(f"  {name}: {load['steps_per_s']:.1f} steps/s, {load['raw_mb_per_s']:.1f} MB/s raw")
    rows = [[c["load"], c["overflow"], f"{c['queue_mib']:g}", f"{c['flush_s']:g}", fmt(c["ratio"], 3),
             fmt(c["step_p99_ratio"], 2), f"{fmt(c['call_us_p50'], 0)}/{fmt(c['call_us_p99'], 0)}",
             f"{fmt(c['lag_p50_s'], 2)}/{fmt(c['lag_p99_s'], 2)}", fmt(c["peak_pipeline_mib"], 1),
             fmt(max(c["actors_mib"].values(), default=None), 0), f"{c['dropped']} ({fmt(c['drop_pct'], 1)}%)",
             fmt(c["finish_s"], 1)] for c in result["cells"]]
    print("\n== Sweep: trackers " + ", ".join(result["trackers"]) + " ==")
    print(table(["load", "overflow", "queue MiB", "flush s", "ratio", "p99 ratio", "calls us p50/p99", "lag s p50/p99",
                 "pipeline MiB", "actor MiB", "dropped", "finish s"], rows))
    rec = result["recommended"]
    print("\nrecommended trainer.async_log: " + ", ".join(f"{k}={v}" for k, v in rec["trainer.async_log"].items()))
    print("  rule: " + rec["rule"])
    print("  current defaults: " + ", ".join(f"{k}={v}" for k, v in rec["current_defaults"].items()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
