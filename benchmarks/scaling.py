"""Scaling of the async path: payload per step, number of trackers, steps per second until saturation,
producers (Ray actors logging into the run) on one node and on two.

    python -m tracklane.benchmarks.scaling [--quick] [--out DIR] [--mlflow-uri URI]

Each series uses tracklane async with its default ``trainer.async_log`` (drop_oldest). The
payload and rate series keep one pipeline and drain it (``flush``) between points, counting
drops per point; the tracker series starts a pipeline per tracker count. For each point: the
caller's time in the logging calls, the step-time ratio against the same loop without logging,
how long the backlog took to drain afterwards, and what was dropped. "Saturated" marks the
first point that drops records or whose step time grows >5% (the caller waits). The producers series
(scaling_producers.py) gives each producer's cost per step, the lag and what was dropped, 1..8 producers
and then one point on a 2-node cluster with the lanes on the second node.
Writes ``scaling.json`` and PNGs into ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

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
from tracklane.benchmarks.scaling_producers import producer_series, two_nodes
from tracklane.benchmarks.workloads import trajectories, verl_scalars

KiB, MiB = 2**10, 2**20
TRACKER_ORDER = ["file", "tensorboard", "console", "swanlab", "wandb", "mlflow"]
TRAJECTORY_BYTES = 4 * KiB  # payload is cut into trajectories of about this size
LIMITS = {"max_trajectories": 1_000_000, "max_chars": 1_000_000}  # store the whole payload: it is what is measured
ASYNC_LOG = {"log_vitals": False, "system_metrics_s": 0}  # every record a lane counts is one the user logged


def payload(nbytes: int, step: int) -> list[dict]:
    """Trajectories adding up to ~``nbytes`` raw (text plus int32 token ids, half each)."""
    count = max(1, nbytes // TRAJECTORY_BYTES)
    each = nbytes // count
    return trajectories(count, step, chars=each // 2, tokens=max(1, each // 8))


def run_point(mode, period_s: float, seconds: float, nbytes: int, first_step: int) -> dict:
    """Log for ``seconds`` at one step every ``period_s``; then drain and count what was dropped."""
    steps = max(5, int(seconds / period_s))
    batches = [payload(nbytes, first_step + i) for i in range(min(steps, 4))] if nbytes else []
    before = _dropped(mode.tracking.flush(timeout=300))
    step_s, call_us = [], []
    for i in range(steps):
        step = first_step + i
        started = time.perf_counter()
        time.sleep(period_s)
        metrics = verl_scalars(step)
        t0 = time.perf_counter()
        mode.log(metrics, step=step)
        if batches:
            mode.log_trajectories(batches[i % len(batches)], step=step)
        call_us.append((time.perf_counter() - t0) * 1e6)
        step_s.append(time.perf_counter() - started)
    started = time.perf_counter()
    report = mode.tracking.flush(timeout=300)
    return {"steps": steps, "step_s_p50": statistics.median(step_s), "call_us_p50": percentile(call_us, 0.5),
            "call_us_p99": percentile(call_us, 0.99), "drain_s": time.perf_counter() - started,
            "dropped": _dropped(report) - before, "records": 2 * steps if batches else steps}


def _dropped(report) -> int:
    # The producer's drops plus the worst lane's: a record lost by two lanes is one record lost per tracker.
    return report.dropped_records + max((lane.dropped_records for lane in report.lanes.values()), default=0)


def baseline(period_s: float, seconds: float) -> float:
    steps, times = max(5, int(seconds / period_s)), []
    for step in range(steps):
        started = time.perf_counter()
        time.sleep(period_s)
        verl_scalars(step)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _finish_point(point: dict, base_s: float) -> dict:
    point["ratio"] = point["step_s_p50"] / base_s
    point["saturated"] = point["dropped"] > 0 or point["ratio"] > 1.05
    return point


def payload_series(env: BenchEnv, sizes: list[int], period_s: float, seconds: float) -> list[dict]:
    base = baseline(period_s, min(seconds, 2.0))
    mode = TracklaneMode("async", ["file"], env.place("payload"), ASYNC_LOG, record_limits=LIMITS)
    points, step = [], 1
    for size in sizes:
        point = run_point(mode, period_s, seconds, size, step)
        points.append({"payload_bytes": size, **_finish_point(point, base)})
        step += point["steps"]
    mode.finish()
    return points


def rate_series(env: BenchEnv, rates: list[float], nbytes: int, seconds: float) -> list[dict]:
    mode = TracklaneMode("async", ["file"], env.place("rate"), ASYNC_LOG, record_limits=LIMITS)
    points, step = [], 1
    for rate in rates:
        base = baseline(1 / rate, min(seconds, 1.0))
        point = run_point(mode, 1 / rate, seconds, nbytes, step)
        points.append({"steps_per_s": rate, "raw_mb_per_s": rate * nbytes / 1e6, **_finish_point(point, base)})
        step += point["steps"]
    mode.finish()
    return points


def tracker_series(env: BenchEnv, counts: list[int], nbytes: int, period_s: float, seconds: float) -> list[dict]:
    base = baseline(period_s, min(seconds, 2.0))
    points = []
    for n in counts:
        trackers = TRACKER_ORDER[:n]
        mode = TracklaneMode("async", trackers, env.place(f"trackers{n}"), ASYNC_LOG, record_limits=LIMITS)
        point = run_point(mode, period_s, seconds, nbytes, 1)
        actors = {t: proc_kib(pid, "VmHWM") / 1024 for t, pid in mode.actor_pids().items()}
        started = time.perf_counter()
        report = mode.finish()
        points.append({"trackers": n, "names": trackers, "finish_s": time.perf_counter() - started,
                       "actors_mib": sum(actors.values()),
                       "lag_p99_s": max(lane.lag_p99_s for lane in report.lanes.values()),
                       **_finish_point(point, base)})
    return points


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser, "scaling")
    args = parser.parse_args(argv)
    clock = Clock()
    quick = args.quick
    seconds = 0.5 if quick else 6.0  # quick: 5 steps a point at 10 steps/s (run_point's minimum)
    sizes = [KiB, MiB, 16 * MiB] if quick else [KiB, 16 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB]
    rates = [10.0, 1000.0] if quick else [10.0, 30.0, 100.0, 300.0, 1000.0]
    counts = [1, 6] if quick else [1, 2, 3, 4, 5, 6]
    rate_bytes, tracker_bytes, producer_bytes = 64 * KiB, 256 * KiB, 64 * KiB
    result: dict = {"benchmark": "scaling", "quick": quick, "machine": machine(), "seconds_per_point": seconds}
    with BenchEnv(args.mlflow_uri, "scaling") as env, quiet_stdout():
        _progress(clock, "payload per step, file tracker, 10 steps/s")
        result["payload"] = {"period_s": 0.1, "trackers": ["file"], "points": payload_series(env, sizes, 0.1, seconds)}
        _progress(clock, f"steps per second, file tracker, {rate_bytes // KiB} KiB a step")
        result["rate"] = {"payload_bytes": rate_bytes, "trackers": ["file"],
                          "points": rate_series(env, rates, rate_bytes, seconds)}
        _progress(clock, f"number of trackers, {tracker_bytes // KiB} KiB a step, 20 steps/s")
        result["trackers"] = {"payload_bytes": tracker_bytes, "period_s": 0.05,
                              "points": tracker_series(env, counts, tracker_bytes, 0.05, seconds)}
        producers = [1, 4] if quick else [1, 2, 4, 8]
        _progress(clock, f"producers {producers} (Ray actors), {producer_bytes // KiB} KiB of trajectories a step each, "
                         "10 steps/s, file tracker")
        result["producers"] = {"payload_bytes": producer_bytes, "period_s": 0.1,
                               "points": producer_series(env, producers, producer_bytes, 0.1, seconds, ASYNC_LOG, LIMITS)}
        _progress(clock, "4 producers on two nodes, the lanes on the second")
        result["producers"]["two_nodes"] = two_nodes(env, 4, producer_bytes, 0.1, seconds, ASYNC_LOG, LIMITS)
    result["plots"] = [str(p) for p in plot(result, args.out)]
    print_tables(result)
    result["wall_s"] = clock.elapsed()
    path = write_json(args.out, "scaling", result)
    print(f"\nwrote {path} and {len(result['plots'])} plots; wall time {result['wall_s']:.0f} s")
    print("regenerate: python -m tracklane.benchmarks.scaling" + (" --quick" if quick else ""))
    return 0


def _progress(clock: Clock, what: str) -> None:
    print(f"[{clock.elapsed():5.0f} s] {what}", file=sys.stderr, flush=True)


def _size(n: float) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n / KiB:g} KiB"


def print_tables(result: dict) -> None:
    common = ["ratio", "calls us p50/p99", "drain s", "dropped", "saturated"]

    def cells(p):
        return [fmt(p["ratio"], 3), f"{fmt(p['call_us_p50'], 0)}/{fmt(p['call_us_p99'], 0)}", fmt(p["drain_s"], 2),
                f"{p['dropped']}/{p['records']}", "YES" if p["saturated"] else "no"]

    print("\n== Payload per step (file tracker, 10 steps/s) ==")
    print(table(["payload"] + common, [[_size(p["payload_bytes"])] + cells(p) for p in result["payload"]["points"]]))
    print(f"\n== Steps per second ({_size(result['rate']['payload_bytes'])} a step, file tracker) ==")
    print(table(["steps/s", "raw MB/s"] + common,
                [[f"{p['steps_per_s']:g}", fmt(p["raw_mb_per_s"], 1)] + cells(p) for p in result["rate"]["points"]]))
    print(f"\n== Number of trackers ({_size(result['trackers']['payload_bytes'])} a step, 20 steps/s) ==")
    print(table(["trackers"] + common + ["lag p99 s", "finish s", "actors MiB"],
                [[", ".join(p["names"])] + cells(p) + [fmt(p["lag_p99_s"], 2), fmt(p["finish_s"], 1),
                                                        fmt(p["actors_mib"], 0)] for p in result["trackers"]["points"]]))
    print(f"\n== Producers (Ray actors, {_size(result['producers']['payload_bytes'])} of trajectories a step each, "
          "10 steps/s, file tracker) ==")
    rows = [*result["producers"]["points"], result["producers"]["two_nodes"]]
    print(table(["producers", "nodes", "raw MB/s", "calls us p50/p99", "first call ms", "dropped", "lag p99 s", "finish s",
                 "complete"],
                [[p["producers"], p["nodes"], fmt(p["raw_mb_per_s"], 1), f"{fmt(p['call_us_p50'], 0)}/{fmt(p['call_us_p99'], 0)}",
                  fmt(p["first_call_ms"], 1),
                  f"{p['dropped']}/{p['logged']}", fmt(p["lag_p99_s"], 2), fmt(p["finish_s"], 1),
                  "yes" if p["complete"] else "NO"] for p in rows]))
    for series, key, show in (("payload", "payload_bytes", _size), ("rate", "steps_per_s", lambda r: f"{r:g} steps/s")):
        first = next((p for p in result[series]["points"] if p["saturated"]), None)
        print(f"{series}: " + ("no saturation in the range measured" if first is None else
                               f"first saturates at {show(first[key])} ({first['dropped']} dropped, ratio {first['ratio']:.3f})"))


def plot(result: dict, out) -> list:
    pay, rate, trk, prod = (result[k]["points"] for k in ("payload", "rate", "trackers", "producers"))
    return [
        plots.lines(out / "scaling_payload.png", "Caller time vs payload per step (file, 10 steps/s)",
                    [p["payload_bytes"] / KiB for p in pay],
                    {"p50 us": [p["call_us_p50"] for p in pay], "p99 us": [p["call_us_p99"] for p in pay],
                     "drain ms": [p["drain_s"] * 1e3 for p in pay]}, "KiB per step", "us / ms", log_x=True, log_y=True),
        plots.lines(out / "scaling_rate.png", "Step-time ratio and drops vs steps per second",
                    [p["steps_per_s"] for p in rate],
                    {"ratio": [p["ratio"] for p in rate], "dropped %": [100 * p["dropped"] / p["records"] for p in rate]},
                    "steps per second", "ratio / %", log_x=True),
        plots.lines(out / "scaling_trackers.png", "Cost vs number of trackers (256 KiB, 20 steps/s)",
                    [p["trackers"] for p in trk],
                    {"calls p99 us": [p["call_us_p99"] for p in trk], "finish s": [p["finish_s"] for p in trk],
                     "lag p99 s": [p["lag_p99_s"] for p in trk], "actors MiB / 100": [p["actors_mib"] / 100 for p in trk]},
                    "trackers", "value"),
        plots.lines(out / "scaling_producers.png", "Producers (Ray actors, 64 KiB a step each, 10 steps/s)",
                    [p["producers"] for p in prod],
                    {"calls p50 us": [p["call_us_p50"] for p in prod], "calls p99 us": [p["call_us_p99"] for p in prod],
                     "lag p99 ms": [p["lag_p99_s"] * 1e3 for p in prod]}, "producers", "us / ms"),
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
