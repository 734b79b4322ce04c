"""The main job on a saturated CPU: busy processes at 4x the cores, started first, as on a training node.

    python -m tracklane.benchmarks.busy [--rounds 2] [--steps 30] [--per-core 4] [--modes ...] [--replay] [--out DIR]

Each round runs the main job (``python -m tracklane.trainer``: its six trackers offline in a fresh folder, MLflow
on sqlite) once per mode, in turn, all under the same load: ``logger=[]``, then its trackers with the lane actors
at each CPU priority (``background_priority``: ``idle``, the default, SCHED_IDLE; ``normal``). Per run: the median
step time and its ratio to ``logger=[]`` of the same round, the lanes' lag p50/p99, the time from ``Tracking()`` to
each lane's first stored point, what ``finish()`` left in the spool, ``finish()``'s time, the peak RSS of the
trainer's process and of the lane actors, and (``--replay``) how long the replay command the summary printed took to
deliver the rest, still under the load. Writes ``busy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracklane.benchmarks.harness import Clock, common_args, fmt, machine, table, write_json
from tracklane.testing.cpu_load import CpuLoad

MODES = {
    "logger=[]": ["trainer.logger=[]"],
    "idle": ["trainer.async_log.background_priority=idle"],
    "nice10": ["trainer.async_log.background_priority=10"],
    "normal": ["trainer.async_log.background_priority=normal"],
}
DEFAULT_MODES = ["logger=[]", "idle", "normal"]


def run_once(mode: str, steps: int, folder: Path, replay: bool) -> dict[str, Any]:
    """One main job in ``folder`` under the load already running; its step times and finish() figures."""
    times, figures = folder / "step_times.json", folder / "figures.json"
    env = {**os.environ, "TRACKLANE_STEP_TIMES": str(times), "TRACKLANE_RUN_FIGURES": str(figures),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TRACKLANE_SYSTEM_METRICS_S": "0"}
    for key in ("WANDB_DIR", "SWANLAB_LOG_DIR", "MLFLOW_TRACKING_URI", "TENSORBOARD_DIR", "VERL_FILE_LOGGER_PATH"):
        env.pop(key, None)  # the job's own offline defaults, under this run's folder
    command = [sys.executable, "-m", "tracklane.benchmarks.main_job_child", f"trainer.total_steps={steps}",
               "trainer.progress=false", f"trainer.default_local_dir={folder / 'ckpt'}", *MODES[mode]]
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=3600)
    wall_s = time.monotonic() - started
    if done.returncode not in (0, 1) or not times.exists():  # 1: its report was incomplete (what was left is said)
        raise RuntimeError(f"{mode} run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    step_s = [s for _, s in sorted(json.loads(times.read_text()).items(), key=lambda kv: int(kv[0]))]
    run: dict[str, Any] = {"mode": mode, "wall_s": wall_s, "median_step_ms": statistics.median(step_s[1:]) * 1e3}
    if figures.exists():
        run.update(json.loads(figures.read_text()))
        run["replay_s"] = _replay(run, env, folder) if replay else None
    return run


def _replay(run: dict[str, Any], env: dict[str, str], folder: Path) -> float | None:
    """The replay command the summary printed, run as printed (still under the load); its wall time (None: nothing
    was left)."""
    found = re.search(r"deliver with: (tracklane replay \S+ --to \S+)", run["summary"])
    if not found:
        return None
    command = [sys.executable, "-m", "tracklane", *found.group(1).split()[1:], "--no-progress"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=3600)
    run["replay_rc"] = done.returncode
    return time.monotonic() - started


def _lag(run: dict[str, Any], which: str) -> float:
    lanes = [lane[which] for name, lane in run.get("lanes", {}).items() if name not in ("console", "health")]
    return max(lanes, default=0.0)


def _first_stored(run: dict[str, Any]) -> str:
    lanes = {name: lane["first_stored_s"] for name, lane in run.get("lanes", {}).items() if name != "health"}
    if not lanes:
        return "-"
    slowest = max(lanes, key=lambda name: lanes[name] or float("inf"))
    stored = [s for s in lanes.values() if s]
    return f"{fmt(min(stored), 1) if stored else '-'}..{fmt(lanes[slowest], 1) if lanes[slowest] else 'none'} ({slowest})"


def _rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for run in runs:
        base = next(r for r in runs if r["round"] == run["round"] and r["mode"] == "logger=[]")
        left = sum(lane["unstored_records"] for lane in run.get("lanes", {}).values())
        rows.append([run["mode"], run["round"] + 1, fmt(run["median_step_ms"], 0),
                     fmt(run["median_step_ms"] / base["median_step_ms"], 3),
                     fmt(_lag(run, "lag_p50_s"), 1) if "lanes" in run else "-",
                     fmt(_lag(run, "lag_p99_s"), 1) if "lanes" in run else "-", _first_stored(run),
                     left if "lanes" in run else "-", fmt(run.get("finish_s", 0.0), 1) if "lanes" in run else "-",
                     fmt(run["replay_s"], 0) if run.get("replay_s") is not None else "-",
                     fmt(run.get("trainer_peak_rss_mib", 0.0), 0) if "lanes" in run else "-",
                     fmt(sum(run.get("lanes_peak_rss_mib", {}).values()), 0) if "lanes" in run else "-",
                     fmt(run["wall_s"], 0)])
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracklane.benchmarks.busy", description=__doc__.splitlines()[0])
    common_args(parser, "busy")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-core", type=float, default=4.0, help="busy processes per CPU core")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--replay", action="store_true", help="run the replay command each summary printed, timed")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 1, 8
    modes = args.modes.split(",")
    clock = Clock()
    root = Path(tempfile.mkdtemp(prefix="tracklane-busy-"))
    runs: list[dict[str, Any]] = []
    with CpuLoad(args.per_core) as load:
        print(f"{load.processes} busy processes on {os.cpu_count()} cores", flush=True)
        for round_ in range(args.rounds):
            for mode in modes:
                folder = root / f"{round_}-{mode.replace('=[]', '-none')}"
                folder.mkdir()
                runs.append({**run_once(mode, args.steps, folder, args.replay), "round": round_})
                print(f"[{clock.elapsed():6.0f} s] {mode}, round {round_ + 1}: median step "
                      f"{runs[-1]['median_step_ms']:.0f} ms", flush=True)
        load_cpu_s = load.cpu_s()
    print(table(["mode", "round", "step ms", "ratio", "lag p50 s", "lag p99 s", "first stored s (slowest)",
                 "left at finish", "finish s", "replay s", "trainer RSS MiB", "lanes RSS MiB", "wall s"], _rows(runs)))
    ratios = {mode: [row[3] for row in _rows(runs) if row[0] == mode] for mode in modes}
    print("step ratio vs logger=[] by mode: " + "; ".join(f"{mode} {', '.join(map(str, r))}" for mode, r in ratios.items()))
    write_json(args.out, "busy", {"machine": machine(), "per_core": args.per_core, "steps": args.steps,
                                  "busy_cpu_s": load_cpu_s, "runs": runs})
    print(f"wall time {clock.elapsed():.0f} s; the busy processes took {load_cpu_s:.0f} CPU-s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
