"""The pipeline issue's figures, in one run: log() cost async vs sync, finish() time, peak RSS.

All five trackers plus the file logger, MLflow on a real local ``mlflow server`` (started here
unless ``--mlflow-uri`` is given), wandb and SwanLab offline, everything under a temp folder.

    python -m benchmarks.pipeline_figures [--steps 1000] [--gap-ms 2] [--mlflow-uri URI]

Caller-thread cost is measured around ``log()`` of a ~100-key verl-shaped dict built just before
the call (as verl builds its metrics dict). The floor beside it is a bare ``dict.copy()`` of the
same dict in the same loop. Every 10th step first idles 20 ms, which leaves the caches cold on
this VM; those calls are reported separately.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import ray

from pipeline import Tracking
from trainer.demo import step_metrics

BACKENDS = ["console", "wandb", "mlflow", "swanlab", "tensorboard", "file"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def offline_env(root: Path, mlflow_uri: str) -> None:
    os.environ.update({
        "WANDB_MODE": "offline", "WANDB_DIR": str(root / "wandb"), "WANDB_DATA_DIR": str(root / "wandb-data"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"), "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_SILENT": "true", "SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": str(root / "swanlog"),
        "SWANLAB_SAVE_DIR": str(root / "swanlab-home"), "MLFLOW_TRACKING_URI": mlflow_uri,
    })
    (root / "wandb").mkdir(parents=True, exist_ok=True)


def run_baseline(steps: int, gap_s: float) -> float:
    """The same loop without logging: what the step-time ratios are measured against."""
    started = time.perf_counter()
    for step in range(1, steps + 1):
        time.sleep(0.02 if step % 10 == 0 else gap_s)
        step_metrics(step, time.time()).copy()
    return time.perf_counter() - started


def run_mode(log_async: bool, steps: int, gap_s: float, root: Path) -> dict:
    name = "async" if log_async else "sync"
    os.environ["TENSORBOARD_DIR"] = str(root / "tb" / name)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(root / f"{name}.jsonl")
    config = {"trainer": {"log_async": log_async, "async_log": {"finish_timeout_s": 900}}}
    tracking = Tracking("bench", name, BACKENDS, config=config)
    if log_async:
        tracking.flush(timeout=300)  # let every actor open its tracker before timing
    warm, cold, floor_warm, floor_cold = [], [], [], []
    devnull = open(os.devnull, "w")
    stdout, sys.stdout = sys.stdout, devnull  # the sync console backend prints on this thread
    loop_started = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            idle = step % 10 == 0
            time.sleep(0.02 if idle else gap_s)
            data = step_metrics(step, time.time())
            # Alternate the order so neither measurement warms the caches for the other.
            if step % 2:
                cost, floor = _timed(tracking.log, data, step), _timed_copy(data)
            else:
                floor, cost = _timed_copy(data), _timed(tracking.log, data, step)
            (cold if idle else warm).append(cost)
            (floor_cold if idle else floor_warm).append(floor)
        loop_s = time.perf_counter() - loop_started
        actors = _actor_rss(tracking) if log_async else {}
        finish_started = time.perf_counter()
        report = tracking.finish(timeout=900)
        finish_s = time.perf_counter() - finish_started
    finally:
        sys.stdout = stdout
    return {"mode": name, "warm": warm, "cold": cold, "floor_warm": floor_warm, "floor_cold": floor_cold,
            "loop_s": loop_s, "finish_s": finish_s, "actors": actors, "report": report, "keys": len(data)}


def _timed(log, data: dict, step: int) -> float:
    started = time.perf_counter_ns()
    log(data, step=step)
    return (time.perf_counter_ns() - started) / 1e3


def _timed_copy(data: dict) -> float:
    started = time.perf_counter_ns()
    data.copy()
    return (time.perf_counter_ns() - started) / 1e3


def _actor_rss(tracking: Tracking) -> dict[str, float]:
    """Peak resident memory (VmHWM) of each lane actor, in MiB."""
    out = {}
    for name, lane in tracking._pipe.lanes.items():
        pid = ray.get(lane.actor.ready.remote(), timeout=30)["pid"]
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                out[name] = int(line.split()[1]) / 1024
    return out


def print_figures(results: list[dict], steps: int, gap_s: float, baseline_s: float) -> None:
    print(f"\n{steps} steps, ~{results[0]['keys']} keys a step, {gap_s * 1e3:.0f} ms between calls "
          f"(every 10th call after 20 ms idle); backends: {', '.join(BACKENDS)}")
    print(f"{'mode':6} {'log() p50':>10} {'p99':>9} {'floor p50':>10} {'p99':>9} | {'cold p50':>9} {'p99':>9} "
          f"{'floor p50':>10} {'p99':>9} | {'loop s':>7} {'ratio':>6} {'finish s':>9}")
    for r in results:
        print(f"{r['mode']:6} {percentile(r['warm'], .5):8.1f}us {percentile(r['warm'], .99):7.1f}us "
              f"{percentile(r['floor_warm'], .5):8.1f}us {percentile(r['floor_warm'], .99):7.1f}us | "
              f"{percentile(r['cold'], .5):7.1f}us {percentile(r['cold'], .99):7.1f}us "
              f"{percentile(r['floor_cold'], .5):8.1f}us {percentile(r['floor_cold'], .99):7.1f}us | "
              f"{r['loop_s']:7.2f} {r['loop_s'] / baseline_s:6.3f} {r['finish_s']:9.2f}")
    print(f"(ratio: loop time over the same loop without logging, {baseline_s:.2f} s)")
    for r in results:
        print(f"\n[{r['mode']}] {r['report'].summary()}")
    actors = next((r["actors"] for r in results if r["actors"]), {})
    print(f"\npeak RSS: trainer process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
          + ", ".join(f"{name} actor {mib:.0f} MiB" for name, mib in actors.items()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--mlflow-uri", default=None)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tracklane-bench-"))
    server = None
    if args.mlflow_uri is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.mlflow_server import start_server, stop_server

        server, args.mlflow_uri = start_server(root / "mlflow")
    try:
        offline_env(root, args.mlflow_uri)
        gap_s = args.gap_ms / 1e3
        baseline_s = run_baseline(args.steps, gap_s)
        results = [run_mode(False, args.steps, gap_s, root), run_mode(True, args.steps, gap_s, root)]
        print_figures(results, args.steps, gap_s, baseline_s)
    finally:
        if server is not None:
            stop_server(server.pid)
    print(f"\nrun files under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
