"""A busy node loses nothing: the fault scenarios of a lane that starts late or gives up, and of a saturated CPU.

    python -m tracklane.benchmarks.busy_faults [--only dies,late,saturated] [--long] [--out DIR]

    dies       MLflow's lane actor dies for good mid-run (SIGKILLed, no restart left): finish() keeps what MLflow
               lacks in the spool and prints the replay command; that command (or, ``then="resume"``, a run
               resumed with the same id, what ``trainer.resume=true`` does) delivers it, every point once
    late       the lanes placed on a logging node that joins a ``ray.cluster_utils.Cluster`` ``join_after_s`` after
               ``Tracking()`` while the trainer logs: they wait (pending, not dead), then deliver; after finish()
               and the replay command its summary prints, every point is in TensorBoard, the file and MLflow once
    saturated  the main job with its six trackers on a CPU saturated by busy processes at 4x the cores (started
               first): after it, and the replay command its summary prints, every point it logged is once in
               every tracker; tracker_down fired for each lane that was late

Each reads the trackers back from their own stores (faults.py ``stored_values``, the readers), never from tracklane's
report. ``tests/faults/test_busy_node.py`` asserts on the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tracklane.benchmarks.faults import (
    PROJECT,
    ROOT,
    _config,
    _environment,
    run_scenarios,
    stored_points,
    tally,
    tracker_env,
    values,
)

REPLAY = re.compile(r"deliver with: (tracklane replay (\S+) --to (\S+))")


def replay_printed(summary: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> dict[str, Any]:
    """Run the replay command a summary printed, as printed; what it said and how long it took ({}: none printed)."""
    found = REPLAY.search(summary)
    if not found:
        return {}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tracklane", *found.group(1).split()[1:], "--no-progress",
                           "--timeout", "900"], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=1200)
    return {"command": found.group(1), "to": found.group(3).split(","), "rc": done.returncode,
            "seconds": round(time.monotonic() - started, 1), "stderr_tail": done.stderr[-3000:]}


# -- dies: MLflow's actor dies for good mid-run -----------------------------------------------------
def lane_dies(work: Path, mlflow_uri: str, steps: int = 150, keys: int = 10, then: str = "replay",
              pause: float = 0.02) -> dict[str, Any]:
    from tracklane import Tracking
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

    experiment = f"dies-{uuid.uuid4().hex[:6]}"
    config = _config(work, flush_interval_s=0.1, max_restarts=0)  # no restart left: dead for good
    with _environment(tracker_env(work, mlflow_uri)):
        tracking = Tracking(PROJECT, experiment, ["mlflow", "file"], config=config)
        tracking.flush(timeout=180)
        killed_at = steps // 3
        for step in range(1, steps + 1):
            tracking.log(values(step, keys), step=step)
            if step == killed_at:
                os.kill(tracking.lanes()["mlflow"].pid, signal.SIGKILL)
            time.sleep(pause)
        report = tracking.finish(timeout=60)
        must = set(range(1, steps + 1))
        at_finish = tally(stored_points("mlflow", work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
        spool = report.spool.directory if report.spool is not None else ""
        kept_on_disk = _segments(spool)
        if then == "replay":
            delivery = replay_printed(report.summary())
        else:  # the same run id, resumed: what trainer.resume=true does
            resumed = Tracking(PROJECT, experiment, ["mlflow", "file"], config=config, run_id=tracking.run_id,
                               resume=True).finish(timeout=180)
            delivery = {"complete": resumed.complete, "summary": resumed.summary()}
        after = {t: tally(stored_points(t, work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
                 for t in ("mlflow", "file")}
    [run] = find_mlflow_run_ids(mlflow_uri, PROJECT, experiment)
    lane = report.lanes["mlflow"]
    return {"scenario": "dies", "then": then, "steps": steps, "keys": keys, "killed_at": killed_at,
            "summary": report.summary(), "gave_up": lane.gave_up, "error": lane.error, "kept": lane.unstored_records,
            "dropped": lane.dropped_records, "spool": spool, "segments_kept": kept_on_disk,
            "mlflow_at_finish": at_finish, "delivery": delivery, "spool_left": _segments(spool),
            "mlflow_status": read_mlflow_run(mlflow_uri, run).status, "trackers": after}


def _segments(spool: str) -> int:
    return sum(1 for name in os.listdir(spool) if name.startswith("seg-")) if spool and os.path.isdir(spool) else 0


# -- late: the lanes' node joins the cluster long after Tracking() ----------------------------------
LATE_TRACKERS = ["tensorboard", "file", "mlflow"]


def late_node(work: Path, mlflow_uri: str, join_after_s: float = 90.0, log_for_s: float = 110.0, keys: int = 10,
              pause: float = 0.1) -> dict[str, Any]:
    """The run in a child process of its own (a ``Cluster`` cannot be joined from a process with Ray running)."""
    experiment = f"late-{uuid.uuid4().hex[:6]}"
    out = work / "late.json"
    env = {**os.environ, **tracker_env(work, mlflow_uri), "RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-m", "tracklane.benchmarks.busy_faults", "late-child", str(out),
                           experiment, str(join_after_s), str(log_for_s), str(keys), str(pause), str(work)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=int(join_after_s + log_for_s) + 900)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"the late-node run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    run = json.loads(out.read_text())
    run["delivery"] = replay_printed(run["summary"], tracker_env(work, mlflow_uri))
    must = set(range(1, run["steps"] + 1))
    run["trackers"] = {t: tally(stored_points(t, work, run["run_id"], experiment, mlflow_uri), must, set(), keys)
                       for t in LATE_TRACKERS}
    return {"scenario": "late", **run}


def late_child(out: str, experiment: str, join_after_s: float, log_for_s: float, keys: int, pause: float,
               work: str) -> int:
    """The trainer of ``late_node``: a head node with no ``logging_node`` resource, the lanes asking for it, and
    the node that offers it added ``join_after_s`` after ``Tracking()`` while the trainer logs."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray process binds 127.0.0.1
    import ray
    from ray.cluster_utils import Cluster

    from tracklane import Tracking

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        ray.init(address=cluster.address)
        config = {"trainer": {"log_async": True, "health": {"enabled": True, "rules": {
            "tracker_down": {"threshold": 30.0}}}, "async_log": {
            "spool_dir": str(Path(work) / "spool"), "flush_interval_s": 0.2, "finish_timeout_s": 60.0,
            "actor_options": {"resources": {"logging_node": 0.01}}}}}
        started = time.monotonic()
        tracking = Tracking(PROJECT, experiment, LATE_TRACKERS, config=config)
        joined: dict[str, Any] = {}
        step, before_join = 0, ""
        while time.monotonic() - started < log_for_s:
            step += 1
            tracking.log(values(step, keys), step=step)
            if not before_join and time.monotonic() - started > join_after_s - 5:  # what the lanes say while they wait
                before_join = tracking.flush(timeout=0.1).lanes["mlflow"].down
            if not joined and time.monotonic() - started >= join_after_s:  # on this thread: Ray starts its processes
                joined.update(node=cluster.add_node(num_cpus=1, resources={"logging_node": 1}).node_id,
                              at=time.monotonic() - started)
            time.sleep(pause)
        report = tracking.finish()
        Path(out).write_text(json.dumps({
            "run_id": tracking.run_id, "steps": step, "joined_after_s": joined.get("at"), "logged_for_s": log_for_s,
            "down_before_join": before_join, "summary": report.summary(), "alerts": report.alerts,
            "first_stored_s": {name: lane.first_stored_s for name, lane in report.lanes.items()},
            "lanes_node": {name: lane.where for name, lane in report.lanes.items()}, "logging_node": joined.get("node"),
            "left_at_finish": {name: lane.unstored_records for name, lane in report.lanes.items()},
            "dropped": {name: lane.dropped_records for name, lane in report.lanes.items()},
            "gave_up": [name for name, lane in report.lanes.items() if lane.gave_up],
        }))
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


# -- saturated: the main job with its six trackers on a saturated CPU -----------------------------------
SATURATED_TRACKERS = ["tensorboard", "mlflow", "wandb", "swanlab", "file"]  # and the console: the job's stdout


def saturated_main_job(work: Path, steps: int = 12, per_core: float = 4.0, down_after_s: float = 15.0) -> dict[str, Any]:
    """The main job, its default loggers, under ``CpuLoad(per_core)`` started before it; what every tracker holds of
    the points it logged (recorded by the child as it logged them), after its finish() and the replay command."""
    from tracklane.testing.cpu_load import CpuLoad

    logged = work / "logged.jsonl"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("WANDB_", "SWANLAB_", "MLFLOW_", "TENSORBOARD_", "VERL_", "TRACKIO_"))}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TRACKLANE_SYSTEM_METRICS_S="0", RAY_ADDRESS="",
               TRACKLANE_LOGGED_POINTS=str(logged), TRACKLANE_STEP_TIMES=str(work / "step_times.json"),
               TRACKLANE_RUN_FIGURES=str(work / "figures.json"))
    command = [sys.executable, "-m", "tracklane.benchmarks.main_job_child", f"trainer.total_steps={steps}",
               "trainer.progress=false", "trainer.test_freq=6", "trainer.save_freq=6",
               f"trainer.health.rules.tracker_down.threshold={down_after_s}"]
    with CpuLoad(per_core) as load:
        started = time.monotonic()
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
        job_s = time.monotonic() - started
    if done.returncode not in (0, 1) or not (work / "figures.json").exists():  # 1: incomplete, what is left is said
        raise RuntimeError(f"the main job failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    figures = json.loads((work / "figures.json").read_text())
    delivery = replay_printed(figures["summary"], env, cwd=work)
    points = [json.loads(line) for line in logged.read_text().splitlines()]
    return {"scenario": "saturated", "busy_processes": load.processes, "steps": steps, "job_s": round(job_s, 1),
            "stdout": done.stdout, "figures": figures, "delivery": delivery, "logged_points": len(points),
            "trackers": {name: main_job_tally(name, work / "tracklane_runs", points) for name in SATURATED_TRACKERS}}


def main_job_tally(tracker: str, runs: Path, logged: list[list[Any]]) -> dict[str, int]:
    """Of the (step, key, value) points the main job logged, how many ``tracker`` holds once (with its value),
    how many it lacks, holds twice or with another value."""
    from tracklane.workers.sinks.mlflow import mlflow_key

    stored = Counter()
    values_at: dict[tuple[int, str], float] = {}
    for step, key, value in _main_job_points(tracker, runs):
        stored[(step, key)] += 1
        values_at[(step, key)] = value
    name = mlflow_key if tracker == "mlflow" else (lambda key: key)
    once = missing = twice = wrong = 0
    for step, key, value in logged:
        at = (step, name(key))
        if at not in stored:
            missing += 1
        elif stored[at] > 1:
            twice += 1
        elif not _same(values_at[at], value, 1e-5 if tracker == "tensorboard" else 1e-9):
            wrong += 1
        else:
            once += 1
    return {"expected": len(logged), "once": once, "missing": missing, "duplicated": twice, "wrong": wrong}


def _main_job_points(tracker: str, runs: Path) -> list[tuple[int, str, float]]:
    from tracklane.workers.testing.readers.file_reader import file_lines
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run
    from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run
    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

    project, experiment = "tracklane", "grpo_tool_addition"
    if tracker == "file":
        return [(line["step"], key, value) for line in file_lines(runs / project / f"{experiment}.jsonl")
                if "axis" not in line for key, value in line["data"].items() if isinstance(value, (int, float))]
    if tracker == "tensorboard":
        return read_tensorboard_dir(runs / "tensorboard" / project / experiment).points
    if tracker == "wandb":
        return read_wandb_run(runs / "wandb").points
    if tracker == "swanlab":
        return read_swanlab_run(runs / "swanlog").points
    uri = f"sqlite:///{runs / 'mlruns.db'}"
    [run] = find_mlflow_run_ids(uri, project, experiment)
    return read_mlflow_run(uri, run).points


def _same(stored: float, logged: float, rel: float) -> bool:
    if stored != stored and logged != logged:  # NaN both
        return True
    return abs(stored - logged) <= rel * max(1.0, abs(logged))


SCENARIOS = ("dies", "late", "saturated")


def run_scenario(name: str, work: Path, mlflow_uri: str, long: bool) -> dict[str, Any]:
    if name == "dies":
        return {then: lane_dies(work / then, mlflow_uri, steps=600 if long else 150, then=then)
                for then in ("replay", "resume")}
    if name == "late":
        return late_node(work, mlflow_uri, join_after_s=180.0 if long else 90.0, log_for_s=220.0 if long else 110.0)
    if name == "saturated":
        return saturated_main_job(work, steps=30 if long else 12)
    raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["late-child"]:
        out, experiment, join_after_s, log_for_s, keys, pause, work = argv[1:]
        return late_child(out, experiment, float(join_after_s), float(log_for_s), int(keys), float(pause), work)
    results, written = run_scenarios(argv, "python -m tracklane.benchmarks.busy_faults", __doc__, SCENARIOS,
                                     run_scenario, "busy_faults", long_help="longer runs (minutes each)")
    for result in results:
        print(json.dumps(result, indent=1)[:4000])
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
