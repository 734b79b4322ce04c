"""How soon the shipper thread wakes: flush() latency with nothing queued, and the shipper thread's CPU while a
loop logs and while it is idle (file + tensorboard lanes, async path).

    python -m tracklane.benchmarks.flush_latency [--flushes 40] [--steps 1000]

Prints one JSON line. Measured at the single wait (shipping/wakeup.py, issue 36): flush() p50 26 ms before, 9 ms
after; the shipper thread's CPU unchanged (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

import psutil


def _shipper_cpu_s() -> float:
    ids = {t.native_id for t in threading.enumerate() if t.name == "tracklane-shipper"}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flushes", type=int, default=40)
    parser.add_argument("--steps", type=int, default=1000, help="steps logged 10 ms apart, 50 keys each")
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ["TRACKLANE_SYSTEM_METRICS_S"] = "0"
    from tracklane import Tracking

    folder = tempfile.mkdtemp(prefix="tracklane-flush-")
    os.environ.update(VERL_FILE_LOGGER_PATH=os.path.join(folder, "f.jsonl"), TENSORBOARD_DIR=folder)
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": os.path.join(folder, "spool"),
                                                           "log_vitals": False}}}
    tracking = Tracking("bench", "flush_latency", ["file", "tensorboard"], config=config)
    tracking.flush(120)
    latencies = []
    for step in range(args.flushes):
        tracking.log({"x": float(step)}, step=step)
        started = time.perf_counter()
        tracking.flush(30)
        latencies.append(time.perf_counter() - started)
    cpu, started = _shipper_cpu_s(), time.perf_counter()
    for step in range(args.flushes, args.flushes + args.steps):
        tracking.log({f"k{j}": float(j) for j in range(50)}, step=step)
        time.sleep(0.01)
    logging_cpu, logging_wall = _shipper_cpu_s() - cpu, time.perf_counter() - started
    tracking.flush(60)
    cpu = _shipper_cpu_s()
    time.sleep(args.idle_s)
    idle_cpu = _shipper_cpu_s() - cpu
    tracking.finish()
    print(json.dumps({"flush_p50_ms": 1000 * statistics.median(latencies), "flush_max_ms": 1000 * max(latencies),
                      "shipper_cpu_logging_pct": 100 * logging_cpu / logging_wall,
                      "shipper_cpu_idle_pct": 100 * idle_cpu / args.idle_s}))


if __name__ == "__main__":
    main()
