"""One run of tracklane.benchmarks.scale in a process of its own, so that its peak RSS is its own.

    python -m tracklane.benchmarks.scale_child '<json spec>'     (prints one JSON line: the run's figures)

The spec: ``mode`` ("none": the same objects built, nothing logged; "async": tracklane, defaults), ``trackers``,
``root`` (where the trackers write), ``steps``, ``period_s``, ``scalars`` (keys a step), ``rows`` (rollout
trajectories a step, ``chars`` characters each: a dump of ``rows * chars`` bytes), ``mlflow_uri`` and
``slow_delay_s`` (MLflow behind a proxy that holds each answer that long: a slow tracker).

Each step builds its scalars and its dump afresh (every trajectory's text a string of its own, as a real
rollout's is), then logs them: the caller's time is what ``log`` and ``log_trajectories`` cost. A sidecar process
(scale_sidecar.py) notes when each step's scalars and rows reached the file tracker.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

_TEXT_BYTES = 16 * 2**20


def random_text() -> str:
    """16 MiB of word-like random text (compresses ~2x, like model output); each trajectory slices its own copy."""
    rng = np.random.default_rng(7)
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkqjxz     ", dtype=np.uint8)
    return rng.choice(letters, _TEXT_BYTES).tobytes().decode()


def dump(text: str, rows: int, chars: int, step: int) -> list[dict[str, Any]]:
    """``rows`` trajectories of ``chars`` characters, each string its own object (a slice copies)."""
    cut = chars // 4
    out = []
    span = len(text) - chars
    for i in range(rows):
        at = (step * 7919 + i * 4001) % span
        out.append({"messages": [{"role": "user", "content": text[at:at + cut]},
                                 {"role": "assistant", "content": text[at + cut:at + chars]}],
                    "rewards": {"score": float(i % 2)}, "meta": {"sample_index": i, "step": step}})
    return out


def scalars(count: int, step: int) -> dict[str, float]:
    return {f"scale/k{i:05d}": step + i * 1e-3 for i in range(count)}


def main(spec: dict[str, Any]) -> dict[str, Any]:
    root = Path(spec["root"])
    root.mkdir(parents=True, exist_ok=True)
    metrics = root / "metrics.jsonl"
    env = {"VERL_FILE_LOGGER_PATH": str(metrics), "TENSORBOARD_DIR": str(root / "tensorboard"),
           "WANDB_DIR": str(root / "wandb"), "SWANLAB_LOG_DIR": str(root / "swanlog"), "TRACKLANE_SYSTEM_METRICS_S": "0",
           "TRACKLANE_SPOOL_ROOT": str(root / "spool")}
    os.environ.update(env)
    sidecar = _sidecar(spec, metrics, root)
    text = random_text() if spec["rows"] else ""
    tracking = None
    started = time.perf_counter()
    if spec["mode"] == "async":
        import ray

        from tracklane import Tracking

        # as Tracking() starts it (async_pipeline.py): a CPU slot per lane, up to the cores; a Ray of its own
        # ("local"), never one named in /tmp/ray/ray_current_cluster (another process's two-node test, say)
        ray.init(address="local", num_cpus=max(1, min(os.cpu_count() or 1, len(spec["trackers"]))),
                 include_dashboard=False, log_to_driver=False)
        started = time.perf_counter()
        tracking = Tracking("scale", spec["name"], spec["trackers"],
                            config={"trainer": {"log_async": True, "async_log": spec.get("async_log", {})}})
    built_s = time.perf_counter() - started
    ready = tracking.wait_ready(120) if tracking is not None else True
    ready_s = time.perf_counter() - started
    # each lane's CPU so far (its process's start, its SDK's import, its tracker's opening): not the records'
    opened = {name: lane.cpu_s for name, lane in tracking.flush(120).lanes.items()} if tracking is not None else {}
    cpu0 = time.process_time()
    calls_ms, logged_at, build_s = [], {}, []
    next_at = time.monotonic()
    for step in range(1, spec["steps"] + 1):
        t = time.perf_counter()
        rows = dump(text, spec["rows"], spec["chars"], step) if spec["rows"] else None
        values = scalars(spec["scalars"], step)
        build_s.append(time.perf_counter() - t)
        logged_at[step] = time.time()
        t = time.perf_counter()
        if tracking is not None:
            tracking.log(values, step=step)
            if rows is not None:
                tracking.log_trajectories(rows, step=step)
        calls_ms.append((time.perf_counter() - t) * 1e3)
        del rows, values
        next_at += spec["period_s"]
        time.sleep(max(0.0, next_at - time.monotonic()))
    lanes = tracking.lanes() if tracking is not None else {}
    lane_peak_mib = {name: _peak_mib(lane.pid) for name, lane in lanes.items()}
    t = time.perf_counter()
    report = tracking.finish() if tracking is not None else None
    finish_s = time.perf_counter() - t
    cpu_s = time.process_time() - cpu0
    seen = _stop(sidecar, root)
    result = {
        "spec": spec, "built_s": built_s, "ready_s": ready_s, "ready": ready, "finish_s": finish_s,
        "calls_ms": calls_ms, "build_s": build_s, "logged_at": logged_at, "seen": seen,
        "trainer_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "trainer_cpu_s": cpu_s,
        "lane_peak_mib": lane_peak_mib, "lanes_open_cpu_s": opened,
    }
    if report is not None:
        result.update(complete=report.complete, summary=report.summary(),
                      dropped=report.dropped_records + sum(lane.dropped_records for lane in report.lanes.values()),
                      lanes={name: {"cpu_s": lane.cpu_s - opened.get(name, 0.0), "busy_s": lane.busy_s,
                                    "records": lane.records_written,
                                    "lag_p50_s": lane.lag_p50_s, "lag_p99_s": lane.lag_p99_s,
                                    "bulk_lag_p50_s": lane.bulk_lag_p50_s, "bulk_lag_p99_s": lane.bulk_lag_p99_s,
                                    "dropped": lane.dropped_records, "failed": lane.failed_records}
                             for name, lane in report.lanes.items()})
    return result


def _sidecar(spec: dict[str, Any], metrics: Path, root: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "tracklane.benchmarks.scale_sidecar", str(metrics), str(spec["rows"]), str(root / "seen.json")]
    if spec.get("slow_delay_s"):
        args += [spec["mlflow_uri"].split("//", 1)[1].rstrip("/"), str(spec["slow_delay_s"])]
    sidecar = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert sidecar.stdout is not None
    address = sidecar.stdout.readline().strip()
    os.environ["MLFLOW_TRACKING_URI"] = f"http://{address}" if address != "-" else spec.get("mlflow_uri") or ""
    return sidecar


def _stop(sidecar: subprocess.Popen, root: Path) -> dict[str, Any]:
    assert sidecar.stdin is not None
    time.sleep(0.1)  # its last look after finish()
    sidecar.stdin.close()
    sidecar.wait(30)
    return json.loads((root / "seen.json").read_text())


def _peak_mib(pid: int) -> float:
    from tracklane.benchmarks.harness import proc_kib

    return proc_kib(pid, "VmHWM") / 1024


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
