"""The fault suite's scenarios, with figures: what each fault costs, read back from the trackers' own stores.

    python -m tracklane.benchmarks.faults [--long] [--only sigkill,reduce,actors,dumps,outage,slow,hung,damage] [--out DIR]

Each scenario stages one fault for real and counts, per tracker, the points it holds exactly once,
the ones missing and the ones stored twice (from the tracker's own files or server, never from
tracklane's report). ``tests/faults/test_faults.py`` runs the short versions and asserts on the same
figures; ``--long`` runs the sizes the README's Reliability section quotes (minutes).

    sigkill   the trainer SIGKILLed mid-run, then resumed with the same run id and spool
    reduce    the same with 4 producers whose values the run reduces (log(..., reduce=...)): each step once
    actors    every lane actor SIGKILLed several times mid-run
    dumps     the same while every step also logs a rollout dump shipped in chunks (the bulk stream), the trainer
              then SIGKILLed mid-dump and resumed: every scalar and every rollout row once
    outage    the MLflow server unreachable (a cut loopback proxy) for a while, then back
    slow      a tracker ~10x slower than the producer: memory and disk stay within bounds, drops counted
    hung      finish() with a tracker that hangs: returns by its deadline; `tracklane replay` delivers the rest
    damage    spool segments corrupted, truncated and deleted between a crash and the recovery
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "tracklane-faults"
TRACKERS = ["file", "tensorboard", "mlflow", "wandb", "swanlab"]


# -- the trainer child: logs steps, prints each one with its time ------------------------------
def values(step: int, keys: int) -> dict[str, float]:
    return {f"k{i:03d}": step * 1000.0 + i for i in range(keys)}


def child_main(argv: list[str]) -> int:
    """``python -m tracklane.benchmarks.faults child ...``: a trainer that logs and reports what and when."""
    from tracklane import Tracking

    parser = argparse.ArgumentParser(prog="tracklane.benchmarks.faults child")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--backends", required=True)
    parser.add_argument("--async-log", default="{}", help="trainer.async_log as JSON")
    parser.add_argument("--trainer", default="{}", help="more trainer keys as JSON")
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--last", type=int, required=True)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--pause", type=float, default=0.02)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--finish", action="store_true", help="finish at the end (else wait to be killed)")
    parser.add_argument("--rows", type=int, default=0, help="rollout rows to log at every step (a dump)")
    parser.add_argument("--reduce-workers", type=int, default=0,
                        help="Ray actors that log REDUCED's keys (reduce=) at every step before the trainer does")
    args = parser.parse_args(argv)
    config = {"trainer": {"log_async": True, "async_log": json.loads(args.async_log), **json.loads(args.trainer)}}
    tracking = Tracking(PROJECT, args.experiment, args.backends.split(","), config=config, run_id=args.run_id,
                        resume=args.resume)
    tracking.flush(timeout=180)  # every lane actor up
    workers = _reduce_workers(tracking, args.reduce_workers)
    print("ready", flush=True)
    for step in range(args.first, args.last + 1):
        if workers:
            import ray

            ray.get([worker.log.remote(step) for worker in workers])
        tracking.log(values(step, args.keys), step=step)
        if args.rows:
            tracking.log_trajectories(rollouts(step, args.rows), step=step)
        print(f"logged {step} {time.time():.6f}", flush=True)
        time.sleep(args.pause)
    if not args.finish:
        print("waiting", flush=True)
        time.sleep(3600)
        return 0
    if workers:  # a producer's last calls reach the run before it finishes (finish waits for what they shipped)
        import ray

        ray.get([worker.flush.remote() for worker in workers])
    report = tracking.finish(timeout=300)
    print("finished " + json.dumps({"complete": report.complete, "summary": report.summary()}), flush=True)
    return 0


def rollouts(step: int, rows: int) -> list[dict[str, Any]]:
    """A step's dump: ``rows`` trajectories of ~1 KB, each named by (step, sample_index) in its meta."""
    return [{"messages": [{"role": "assistant", "content": f"step {step} row {i} " + "x" * 1000}],
             "rewards": {"score": float(i % 3)}, "meta": {"sample_index": i, "logged_step": step}} for i in range(rows)]


def stored_rows(work: Path) -> Counter:
    """(step, sample_index) -> how many times the file tracker holds that rollout row."""
    rows: Counter = Counter()
    for path in (work / "metrics_rollouts").glob("*.jsonl"):
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                rows[(row["step"], row["meta"]["sample_index"])] += 1
    return rows


def tally_rows(stored: Counter, must: set[int], may: set[int], rows: int) -> dict[str, int]:
    """Rollout rows that must be there and may be there: once, missing, twice (tally's terms)."""
    expected = {(step, i) for step in must for i in range(rows)}
    allowed = expected | {(step, i) for step in may for i in range(rows)}
    return {"expected": len(expected), "once": sum(1 for row in expected if stored.get(row) == 1),
            "missing": sum(1 for row in expected if row not in stored),
            "duplicated": sum(1 for n in stored.values() if n > 1),
            "unexpected": sum(1 for row in stored if row not in allowed)}


REDUCED = {"r/mean": "mean", "r/sum": "sum", "r/min": "min", "r/max": "max", "r/count": "count"}
"""The keys the reduce scenario's workers log, each with its op: worker i logs ``step + i`` under every one."""


def reduced_values(step: int, workers: int) -> dict[str, float]:
    """What every tracker must hold at ``step`` for REDUCED's keys, reduced over ``workers`` workers."""
    logged = [float(step + i) for i in range(workers)]
    return {"r/mean": sum(logged) / workers, "r/sum": sum(logged), "r/min": min(logged), "r/max": max(logged),
            "r/count": float(workers)}


def _reduce_workers(tracking: Any, n: int) -> list[Any]:
    if not n:
        return []
    import ray

    @ray.remote(num_cpus=0)
    class ReduceWorker:
        def __init__(self, producer: Any, index: int) -> None:
            self.producer, self.index = producer, index

        def ready(self) -> bool:
            return True

        def log(self, step: int) -> None:
            self.producer.log(dict.fromkeys(REDUCED, float(step + self.index)), step=step, reduce=REDUCED)

        def flush(self) -> bool:
            return self.producer.flush(60.0)

    workers = [ReduceWorker.remote(tracking.producer(f"w{i}"), i) for i in range(n)]
    ray.get([worker.ready.remote() for worker in workers])
    return workers


class Child:
    """A trainer child in its own process group (ours to end), read line by line."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self._stderr = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "tracklane.benchmarks.faults", "child", *args], cwd=ROOT,
                                     env=dict(env), stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     start_new_session=True)
        self.logged: dict[int, float] = {}  # step -> time.time() of its log() call
        self.finished: dict[str, Any] | None = None

    def read_until(self, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the trainer child ended early (rc {self.proc.poll()}); see {self._stderr.name}")
            if line.startswith("logged "):
                _, step, when = line.split()
                self.logged[int(step)] = float(when)
            elif line.startswith("finished "):
                self.finished = json.loads(line[len("finished "):])
            if predicate(line):
                return
        raise TimeoutError(f"the trainer child did not get there in {timeout:.0f} s; see {self._stderr.name}")

    def kill(self) -> float:
        """SIGKILL the trainer only (Ray's own processes then go the way they go when a driver dies)."""
        when = time.time()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        return when

    def reap(self, timeout: float = 30.0) -> None:
        """Wait for what the child started to end by itself, then end what is left of its group.

        Done waiting once the child has exited and its Ray workers (the lane actors: this session's processes
        outside the child's group) have ended. What may be left then is Ray's dashboard and runtime-env agents,
        which outlive a SIGKILLed driver for minutes (measured: the raylet and GCS die with the driver, the lane
        actors ~2 s later, the two agents were still there 40 s on), so waiting on the whole group took the full
        ``timeout`` every time. The child itself is reaped in the loop: unreaped, its zombie kept the group alive
        after a normal exit too.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = self.proc.poll() is not None
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            if exited and not self._workers_alive():
                break
            time.sleep(0.25)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self._stderr.close()

    def _workers_alive(self) -> bool:
        """Whether a process of the child's session outside its process group (a Ray worker) still runs."""
        import psutil

        for proc in psutil.process_iter(["status"]):
            try:
                if (os.getsid(proc.pid) == self.proc.pid and os.getpgid(proc.pid) != self.proc.pid
                        and proc.info["status"] != psutil.STATUS_ZOMBIE):
                    return True
            except OSError:  # ended meanwhile, or not ours to look at
                continue
        return False


# -- the trackers, read back from their own stores ---------------------------------------------
def tracker_env(work: Path, mlflow_uri: str) -> dict[str, str]:
    """Every tracker offline (MLflow: the given server) and writing under ``work``."""
    for name in ("wandb", "swanlog", "swanlab-home", "tensorboard"):
        (work / name).mkdir(parents=True, exist_ok=True)
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(work / "wandb"), "WANDB_SILENT": "true",
            "SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": str(work / "swanlog"),
            "SWANLAB_SAVE_DIR": str(work / "swanlab-home"), "TENSORBOARD_DIR": str(work / "tensorboard"),
            "VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl"), "MLFLOW_TRACKING_URI": mlflow_uri,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def stored_points(tracker: str, work: Path, run_id: str, experiment: str, mlflow_uri: str,
                  prefix: str = "k") -> Counter:
    """(step, key) -> how many times the tracker stored it (user keys only)."""
    return Counter((step, key) for step, key, _ in stored_values(tracker, work, run_id, experiment, mlflow_uri)
                   if key.startswith(prefix))


def stored_values(tracker: str, work: Path, run_id: str, experiment: str, mlflow_uri: str,
                  ) -> list[tuple[int, str, float]]:
    """Every (step, key, value) the tracker stored of the run, in its own order."""
    points: list[tuple[int, str, float]]
    if tracker == "file":
        lines = [json.loads(line) for line in open(work / "metrics.jsonl", encoding="utf-8")]
        points = [(line["step"], key, value) for line in lines if line["step"] is not None
                  for key, value in line["data"].items()]
    elif tracker == "tensorboard":
        from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

        points = read_tensorboard_dir(work / "tensorboard").points
    elif tracker == "wandb":
        from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

        points = read_wandb_run(work / "wandb", run_id).points
    elif tracker == "swanlab":
        from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run

        points = read_swanlab_run(work / "swanlog", run_id=run_id).points
    elif tracker == "mlflow":
        from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

        [mlflow_run] = find_mlflow_run_ids(mlflow_uri, PROJECT, experiment)
        points = read_mlflow_run(mlflow_uri, mlflow_run).points
    elif tracker == "memory":
        from tracklane.workers.testing.memory import memory_records

        points = [(r.step, key, v) for r in memory_records(run_id) for key, v in getattr(r, "values", {}).items()]
    else:
        raise ValueError(tracker)
    return [(int(step), key, float(value)) for step, key, value in points]


def tally(stored: Counter, must: set[int], may: set[int], keys: int) -> dict[str, int]:
    """Points that must be there (logged early enough) and may be there (logged later): once, missing, twice."""
    expected = {(step, f"k{i:03d}") for step in must for i in range(keys)}
    allowed = expected | {(step, f"k{i:03d}") for step in may for i in range(keys)}
    return {"expected": len(expected),
            "once": sum(1 for point in expected if stored.get(point) == 1),
            "missing": sum(1 for point in expected if point not in stored),
            "duplicated": sum(1 for point, n in stored.items() if n > 1),
            "unexpected": sum(1 for point in stored if point not in allowed)}


def _run_then_kill(common: list[str], env: Mapping[str, str], work: Path, steps: int, kill_at: int) -> tuple[Child, float]:
    """A trainer child run towards ``steps``, SIGKILLed once it logged ``kill_at``; with the time of the kill."""
    first = Child([*common, "--last", str(steps)], env, work / "first.log")
    try:
        first.read_until(lambda line: line.startswith(f"logged {kill_at} "), timeout=600)
        return first, first.kill()
    finally:
        first.reap()


def _resume_to_the_end(common: list[str], env: Mapping[str, str], work: Path) -> Child:
    """The same run resumed (same run id and spool): steps 10,001-10,020, then finish()."""
    resumed = Child([*common, "--resume", "--first", "10001", "--last", "10020", "--finish"], env, work / "resumed.log")
    try:
        resumed.read_until(lambda line: line.startswith("finished "), timeout=900)
        return resumed
    finally:
        resumed.reap()


# -- sigkill: the trainer dies, a resumed trainer delivers what was spooled --------------------
def sigkill_trainer(work: Path, mlflow_uri: str, steps: int = 600, keys: int = 100, trackers: list[str] = TRACKERS,
                    pause: float = 0.02, flush_interval_s: float = 0.5, lose_lane_state: bool = False) -> dict[str, Any]:
    """``lose_lane_state``: the lane actors' own state files are deleted between the kill and the resume, as
    for lanes on another node without shared storage: only rank 0's copy in its spool says what they stored."""
    run_id, experiment = uuid.uuid4().hex[:12], f"sigkill-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **tracker_env(work, mlflow_uri)}
    # Each child starts its own Ray, which starts at most min(cores, num_cpus) worker processes at a time: with the
    # default num_cpus=1 the five lane actors (each a fresh process importing its SDK) opened one after the other.
    # Measured on 2 cores: the five lanes open in 6.4-7.4 s instead of 8.4-8.6 s (the lanes take no CPU slot).
    async_log = json.dumps({"spool_dir": str(work / "spool"), "flush_interval_s": flush_interval_s,
                            "ray_init": {"num_cpus": os.cpu_count() or 1}})
    common = ["--run-id", run_id, "--experiment", experiment, "--backends", ",".join(trackers),
              "--async-log", async_log, "--keys", str(keys), "--pause", str(pause)]
    kill_at = int(steps * 0.8)
    first, killed_at = _run_then_kill(common, env, work, steps, kill_at)
    lost_states = [path.unlink() or path.name for path in (work / "spool" / "lanes").glob("*.state")] \
        if lose_lane_state else []
    cutoff = killed_at - (flush_interval_s + 0.1)
    must = {step for step, when in first.logged.items() if when < cutoff}
    may = set(first.logged) - must
    started = time.monotonic()
    resumed = _resume_to_the_end(common, env, work)
    recovery_s = time.monotonic() - started
    must |= set(range(10_001, 10_021))
    per_tracker = {t: tally(stored_points(t, work, run_id, experiment, mlflow_uri), must, may, keys) for t in trackers}
    return {"scenario": "sigkill", "steps_logged": len(first.logged), "killed_after_step": kill_at,
            "lane_states_deleted": lost_states,
            "keys": keys, "points_before_cutoff": len(must - set(range(10_001, 10_021))) * keys,
            "resume_and_finish_s": round(recovery_s, 1), "complete_after_resume": bool(resumed.finished
                                                                                     and resumed.finished["complete"]),
            "trackers": per_tracker}


# -- reduce: the trainer SIGKILLed while 4 producers' values are reduced, then resumed ---------------
def sigkill_reductions(work: Path, mlflow_uri: str, steps: int = 300, workers: int = 4, trackers: list[str] = TRACKERS,
                       flush_interval_s: float = 0.2, pause: float = 0.02) -> dict[str, Any]:
    """Four Ray actors log REDUCED's keys at every step (``reduce=``), the trainer after them; the trainer is
    SIGKILLed (its actors and lanes die with its Ray) and resumed with new actors under the same names. Every
    reduced step must be in every tracker once: exactly the op over the four for the steps logged well before
    the kill (their producers' spools are delivered by the resumed rank 0), at most once for those near it."""
    run_id, experiment = uuid.uuid4().hex[:12], f"reduce-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **tracker_env(work, mlflow_uri)}
    async_log = json.dumps({"spool_dir": str(work / "spool"), "flush_interval_s": flush_interval_s,
                            "reductions": True, "ray_init": {"num_cpus": os.cpu_count() or 1}})
    common = ["--run-id", run_id, "--experiment", experiment, "--backends", ",".join(trackers),
              "--async-log", async_log, "--keys", "1", "--pause", str(pause), "--reduce-workers", str(workers)]
    kill_at = int(steps * 0.7)
    first, killed_at = _run_then_kill(common, env, work, steps, kill_at)
    # A worker logs a step before the trainer does; its shipper spools it within flush_interval_s (later on a
    # loaded machine), and its process outlives the trainer's by ~2 s: 2 s more is ample.
    must = {step for step, when in first.logged.items() if when < killed_at - (flush_interval_s + 2.0)}
    # Steps the trainer logged after the line the kill waited for (the kill's lag let them through; a step takes at
    # least --pause), and the one the workers log before the trainer does (ray.get, then its own log()): every
    # worker's value for them is spooled, and the resumed run reduces them.
    last = max(first.logged, default=0)
    lagged = int(max(0.0, killed_at - first.logged.get(last, killed_at)) / pause) + 1
    may = set(first.logged) - must | set(range(last + 1, last + 2 + lagged))
    resumed = _resume_to_the_end(common, env, work)
    must |= set(range(10_001, 10_021))
    per_tracker = {}
    for tracker in trackers:
        stored = [(s, k, v) for s, k, v in stored_values(tracker, work, run_id, experiment, mlflow_uri) if k in REDUCED]
        counts = Counter((s, k) for s, k, _ in stored)
        want = {(step, key): value for step in must for key, value in reduced_values(step, workers).items()}
        per_tracker[tracker] = {
            "expected": len(want), "once": sum(1 for point in want if counts.get(point) == 1),
            "wrong": sorted((s, k, v, want[(s, k)]) for s, k, v in stored if (s, k) in want and v != want[(s, k)])[:5],
            "duplicated": sum(1 for n in counts.values() if n > 1),
            "unexpected": sum(1 for s, _ in counts if s not in must | may)}
    return {"scenario": "reduce", "steps_logged": len(first.logged), "killed_after_step": kill_at,
            "must_steps": len(must), "may_steps": len(may),
            "finished": resumed.finished is not None,
            "complete_after_resume": bool(resumed.finished and resumed.finished["complete"]),
            "summary": resumed.finished["summary"] if resumed.finished else "", "trackers": per_tracker}


# -- actors: every lane actor SIGKILLed several times --------------------------------------------
def actor_kills(work: Path, mlflow_uri: str, steps: int = 600, keys: int = 20, kills_per_lane: int = 2,
                trackers: list[str] = TRACKERS, pause: float = 0.01) -> dict[str, Any]:
    from tracklane import Tracking

    experiment = f"actors-{uuid.uuid4().hex[:6]}"
    with _environment(tracker_env(work, mlflow_uri)):
        tracking = Tracking(PROJECT, experiment, trackers, config=_config(work, flush_interval_s=0.1))
        tracking.flush(timeout=180)
        plan = _kill_plan(trackers, steps, kills_per_lane)
        killed: set[int] = set()
        for step in range(1, steps + 1):
            tracking.log(values(step, keys), step=step)
            for name in plan.get(step, ()):
                _kill_lane(tracking, name, killed)
            time.sleep(pause)
        report = tracking.finish(timeout=300)
    must = set(range(1, steps + 1))
    per_tracker = {t: tally(stored_points(t, work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
                   for t in trackers}
    return {"scenario": "actors", "steps": steps, "keys": keys, "kills": sum(len(v) for v in plan.values()),
            "restarts": {name: lane.restarts for name, lane in report.lanes.items()},
            "complete": report.complete, "summary": report.summary(), "trackers": per_tracker}


# -- dumps: lane actors and then the trainer SIGKILLed while rollout dumps are on their way --------------------
def dump_kills(work: Path, mlflow_uri: str, steps: int = 40, rows: int = 2000, keys: int = 10,
               trackers: tuple[str, ...] = ("file", "tensorboard", "wandb"), pause: float = 0.1) -> dict[str, Any]:
    """Each step logs ``keys`` scalars and a dump of ``rows`` rows (~2 MB, shipped in 256 KB chunks in the bulk
    stream); every lane actor is SIGKILLed twice mid-run. Every scalar is once in every tracker and every row once
    in the file tracker (the dashboards get a 64-row sample, small: with the scalars)."""
    from tracklane import Tracking

    experiment = f"dumps-{uuid.uuid4().hex[:6]}"
    with _environment(tracker_env(work, mlflow_uri)):
        tracking = Tracking(PROJECT, experiment, list(trackers),
                            config=_config(work, flush_interval_s=0.1, max_batch_bytes=256 * 1024))
        tracking.flush(timeout=180)
        plan = _kill_plan(list(trackers), steps, 2)
        killed: set[int] = set()
        for step in range(1, steps + 1):
            tracking.log(values(step, keys), step=step)
            tracking.log_trajectories(rollouts(step, rows), step=step)
            for name in plan.get(step, ()):
                _kill_lane(tracking, name, killed)
            time.sleep(pause)
        report = tracking.finish(timeout=300)
    must = set(range(1, steps + 1))
    per_tracker = {t: tally(stored_points(t, work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
                   for t in trackers}
    per_tracker["file rows"] = tally_rows(stored_rows(work), must, set(), rows)
    return {"scenario": "dumps", "steps": steps, "rows": rows, "kills": sum(len(v) for v in plan.values()),
            "restarts": {name: lane.restarts for name, lane in report.lanes.items()},
            "complete": report.complete, "summary": report.summary(), "trackers": per_tracker}


def sigkill_dumps(work: Path, mlflow_uri: str, steps: int = 60, rows: int = 2000, keys: int = 10,
                  trackers: tuple[str, ...] = ("file", "tensorboard"), flush_interval_s: float = 0.2) -> dict[str, Any]:
    """The trainer SIGKILLed while dumps are shipped a chunk at a time, then resumed: every row and scalar of a step
    logged well before the kill is once in the file tracker (a dump's spooled chunks are delivered by the resumed
    run); a step near the kill at most once."""
    run_id, experiment = uuid.uuid4().hex[:12], f"sigdumps-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **tracker_env(work, mlflow_uri)}
    async_log = json.dumps({"spool_dir": str(work / "spool"), "flush_interval_s": flush_interval_s,
                            "max_batch_bytes": 256 * 1024, "ray_init": {"num_cpus": os.cpu_count() or 1}})
    common = ["--run-id", run_id, "--experiment", experiment, "--backends", ",".join(trackers),
              "--async-log", async_log, "--keys", str(keys), "--pause", "0.1", "--rows", str(rows)]
    first, killed_at = _run_then_kill(common, env, work, steps, int(steps * 0.7))
    # A dump is spooled a chunk at a time behind the calls after it: ~2 MB at tens of MB/s, well within 3 s.
    must = {step for step, when in first.logged.items() if when < killed_at - (flush_interval_s + 3.0)}
    may = set(first.logged) - must
    resumed = _resume_to_the_end(common, env, work)
    must |= set(range(10_001, 10_021))
    per_tracker = {t: tally(stored_points(t, work, run_id, experiment, mlflow_uri), must, may, keys) for t in trackers}
    per_tracker["file rows"] = tally_rows(stored_rows(work), must, may, rows)
    return {"scenario": "sigkill-dumps", "steps_logged": len(first.logged), "must_steps": len(must),
            "complete_after_resume": bool(resumed.finished and resumed.finished["complete"]),
            "summary": resumed.finished["summary"] if resumed.finished else "", "trackers": per_tracker}


def _kill_plan(trackers: list[str], steps: int, kills_per_lane: int) -> dict[int, list[str]]:
    plan: dict[int, list[str]] = {}
    slots = len(trackers) * kills_per_lane
    for i in range(slots):
        step = int(steps * (0.15 + 0.7 * i / max(1, slots - 1)))
        plan.setdefault(step, []).append(trackers[i % len(trackers)])
    return plan


def _kill_lane(tracking: Any, name: str, killed: set[int]) -> None:
    """SIGKILL one lane's actor (a process of the Ray session this run started) once its successor answered."""
    deadline = time.monotonic() + 120
    pid = tracking.lanes()[name].pid
    while (pid == 0 or pid in killed) and time.monotonic() < deadline:  # still restarting from the last kill
        time.sleep(0.1)
        pid = tracking.lanes()[name].pid
    if pid and pid not in killed:
        killed.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- outage: MLflow unreachable through a cut proxy ---------------------------------------------
def mlflow_outage(work: Path, mlflow_uri: str, down_s: float = 8.0, steps: int = 600, keys: int = 20,
                  pause: float = 0.02) -> dict[str, Any]:
    experiment = f"outage-{uuid.uuid4().hex[:6]}"
    with _mlflow_behind_proxy(work, mlflow_uri, experiment) as (proxy, tracking):
        cut_at = steps // 4
        timer = None
        costs: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        for step in range(1, steps + 1):
            if step == cut_at:
                proxy.cut()
                timer = threading.Timer(down_s, proxy.restore)
                timer.start()
            phase = "before" if step < cut_at else ("during" if proxy.is_cut else "after")
            started = time.perf_counter()
            tracking.log(values(step, keys), step=step)
            costs[phase].append(time.perf_counter() - started)
            time.sleep(pause)
        if timer is not None:
            timer.join()
        report = tracking.finish(timeout=max(120.0, 4 * down_s))
    must = set(range(1, steps + 1))
    mlflow = tally(stored_points("mlflow", work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
    file = tally(stored_points("file", work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
    return {"scenario": "outage", "down_s": down_s, "steps": steps, "keys": keys, "complete": report.complete,
            "refused_connections": proxy.refused, "summary": report.summary(),
            "mlflow_lane": {name: getattr(report.lanes["mlflow"], name) for name in
                            ("error", "last_error", "last_error_at", "recovered_outages", "outage_total_s", "retries")},
            "log_us_p50": {phase: round(_p50(c) * 1e6, 1) for phase, c in costs.items()},
            "lag_p99_s": {name: round(lane.lag_p99_s, 2) for name, lane in report.lanes.items()},
            "trackers": {"mlflow": mlflow, "file": file}}


_MLFLOW_FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
"""MLflow's client would retry a refused request itself for minutes; the retrying under test is tracklane's."""


@contextlib.contextmanager
def _mlflow_behind_proxy(work: Path, mlflow_uri: str, experiment: str) -> Iterator[tuple[Any, Any]]:
    """A cuttable proxy in front of the MLflow server and a started run logging to MLflow (through it) and the
    file; the environment points at the proxy while the block runs."""
    from tracklane import Tracking
    from tracklane.testing.tcp_proxy import TcpProxy

    server = urlsplit(mlflow_uri)
    with TcpProxy(server.hostname or "127.0.0.1", server.port or 80) as proxy:
        with _environment({**tracker_env(work, f"http://{proxy.address}"), **_MLFLOW_FAIL_FAST}):
            tracking = Tracking(PROJECT, experiment, ["mlflow", "file"], config=_config(work))
            tracking.flush(timeout=180)
            yield proxy, tracking


# -- slow: a tracker far slower than the producer ------------------------------------------------
def slow_tracker(work: Path, seconds: float = 20.0, keys: int = 100, pause: float = 0.01,
                 delay_s: float = 0.5, spool_max_bytes: int = 128 * 1024,
                 finish_timeout_s: float = 30.0) -> dict[str, Any]:
    """Batches every 50 ms, the tracker takes 500 ms each: ~10x too slow. Small bounds, so both are reached.
    ``finish()`` cannot drain the backlog either: what its deadline leaves is counted, not waited for."""
    import psutil

    from tracklane import Tracking

    lane_max = 32 * 1024
    config = _config(work, lane_max_bytes=lane_max, max_batch_bytes=16 * 1024, spool_max_bytes=spool_max_bytes,
                     spool_segment_bytes=16 * 1024, flush_interval_s=0.05, log_vitals=False)
    config["trainer"]["memory_sink"] = {"delay_s": delay_s}
    with _environment(tracker_env(work, "")):
        tracking = Tracking(PROJECT, f"slow-{uuid.uuid4().hex[:6]}", ["memory", "file"], config=config)
        tracking.flush(timeout=180)
        me = psutil.Process()
        rss, spool_bytes, unstored = [], [], []
        step, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            step += 1
            tracking.log(values(step, keys), step=step)
            if step % 50 == 0:
                health = tracking.vitals()
                rss.append(me.memory_info().rss)
                spool_bytes.append(health.get("tracklane/spool_bytes", 0))
                unstored.append(health.get("tracklane/lane/memory/unstored_bytes", 0))
            time.sleep(pause)
        report = tracking.finish(timeout=finish_timeout_s)
    got = stored_points("memory", work, tracking.run_id, "", "")
    arrived = {s for s, _ in got}
    memory = report.lanes["memory"]
    return {"scenario": "slow", "seconds": seconds, "steps": step, "keys": keys,
            "lane_max_bytes": lane_max, "spool_max_bytes": spool_max_bytes,
            "max_unstored_bytes": max(unstored, default=0), "max_spool_bytes": max(spool_bytes, default=0),
            "rss_mib_first_last_max": [round(rss[0] / 2**20), round(rss[-1] / 2**20), round(max(rss) / 2**20)]
            if rss else [], "arrived_steps": len(arrived), "dropped_records": memory.dropped_records,
            "unstored_records_at_finish": memory.unstored_records, "evicted_records": report.spool.evicted_records
            if report.spool else 0, "duplicated": sum(1 for n in got.values() if n > 1),
            "accounted": len(arrived) + memory.dropped_records + memory.unstored_records, "summary": report.summary()}


# -- hung: finish() with a tracker that never answers, then replay ------------------------------
def hung_finish_then_replay(work: Path, mlflow_uri: str, steps: int = 200, keys: int = 20,
                            finish_timeout_s: float = 20.0) -> dict[str, Any]:
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

    experiment = f"hung-{uuid.uuid4().hex[:6]}"
    with _mlflow_behind_proxy(work, mlflow_uri, experiment) as (proxy, tracking):
        for step in range(1, steps // 2 + 1):
            tracking.log(values(step, keys), step=step)
        tracking.flush(timeout=60)
        proxy.stall()  # from here the server accepts and never answers
        for step in range(steps // 2 + 1, steps + 1):
            tracking.log(values(step, keys), step=step)
        started = time.monotonic()
        report = tracking.finish(timeout=finish_timeout_s)
        finish_s = time.monotonic() - started
        proxy.restore()
        replay = subprocess.run([sys.executable, "-m", "tracklane", "replay", report.spool.directory,
                                 "--no-progress", "--timeout", "300"] if report.spool else ["false"],
                                cwd=ROOT, env={**os.environ}, capture_output=True, text=True, timeout=600)
    must = set(range(1, steps + 1))
    mlflow = tally(stored_points("mlflow", work, tracking.run_id, experiment, mlflow_uri), must, set(), keys)
    [run] = find_mlflow_run_ids(mlflow_uri, PROJECT, experiment)
    return {"scenario": "hung", "steps": steps, "keys": keys, "finish_timeout_s": finish_timeout_s,
            "finish_s": round(finish_s, 1), "left_at_finish": report.lanes["mlflow"].unstored_records,
            "summary_at_finish": report.summary(), "replay_rc": replay.returncode,
            "replay_stderr_tail": replay.stderr[-2000:], "mlflow_status": read_mlflow_run(mlflow_uri, run).status,
            "trackers": {"mlflow": mlflow}}


# -- damage: the spool is corrupted, truncated and partly deleted before the recovery ------------
def damaged_spool(work: Path, steps: int = 300, keys: int = 20) -> dict[str, Any]:
    from tracklane import Tracking
    from tracklane.spool import Spool
    from tracklane.wire import decode_batch

    run_id, experiment = uuid.uuid4().hex[:12], f"damage-{uuid.uuid4().hex[:6]}"
    down = work / "memory-down"
    down.touch()  # the tracker is down for the whole first run: everything stays in the spool
    spool_dir = work / "spool"
    # busy_flush_interval_s too: while the child's logging thread counts as busy (a loaded machine) batches would
    # otherwise be 2 s long, and too few to fill the six segments the damage needs (seen once in CI: 5)
    async_log = {"spool_dir": str(spool_dir), "flush_interval_s": 0.05, "busy_flush_interval_s": 0.05,
                 "spool_segment_bytes": 2048, "max_retry_backoff_s": 1.0}
    trainer = {"memory_sink": {"down_while": str(down)}}
    env = {**os.environ, **tracker_env(work, "")}
    first = Child(["--run-id", run_id, "--experiment", experiment, "--backends", "memory", "--async-log",
                   json.dumps(async_log), "--trainer", json.dumps(trainer), "--keys", str(keys), "--pause", "0.005",
                   "--last", str(steps)], env, work / "first.log")
    try:
        first.read_until(lambda line: line == "waiting\n", timeout=600)
        time.sleep(1.5)  # every batch shipped and spooled
        first.kill()
    finally:
        first.reap()
    reader = Spool(str(spool_dir), readonly=True)
    steps_of = {e.seq: {r.step for r in decode_batch(reader.read(e.seq) or b"").records if r.step <= steps}
                for e in reader.entries()}
    segments = sorted(p for p in spool_dir.iterdir() if p.name.startswith("seg-"))
    lost_steps = _damage(segments, reader, steps_of)
    down.unlink()
    config = {"trainer": {"log_async": True, "async_log": async_log, **trainer}}
    tracking = Tracking(PROJECT, experiment, ["memory"], config=config, run_id=run_id, resume=True)
    report = tracking.finish(timeout=120)
    got = stored_points("memory", work, run_id, experiment, "")
    must = set(range(1, steps + 1)) - lost_steps
    spool = report.spool
    return {"scenario": "damage", "steps": steps, "segments": len(segments), "batches": len(steps_of),
            "steps_in_damaged_batches": len(lost_steps), "damaged_counted": spool.damaged if spool else None,
            "torn_bytes": spool.torn_bytes if spool else None, "summary": report.summary(),
            "trackers": {"memory": tally(got, must, set(), keys)}}


def _damage(segments: list[Path], reader: Any, steps_of: dict[int, set[int]]) -> set[int]:
    """Flip a byte in a frame of the second segment, delete the fourth, cut the last one mid-frame;
    returns the steps of the batches that damage takes."""
    entries = reader.entries()
    by_segment: dict[int, list[Any]] = {}
    for entry in entries:
        by_segment.setdefault(entry.segment, []).append(entry)
    firsts = sorted(by_segment)
    if len(firsts) < 6:
        raise RuntimeError(f"the damage scenario needs at least 6 spool segments, got {len(firsts)}")
    lost: set[int] = set()
    victim = by_segment[firsts[1]][0]
    with open(segments[1], "r+b") as handle:
        handle.seek(victim.offset + 40)
        byte = handle.read(1)
        handle.seek(victim.offset + 40)
        handle.write(bytes([byte[0] ^ 0xFF]))
    lost |= steps_of[victim.seq]
    os.remove(segments[3])
    for entry in by_segment[firsts[3]]:
        lost |= steps_of[entry.seq]
    last = by_segment[firsts[-1]][-1]
    os.truncate(segments[-1], last.offset + 20)  # half a header: a write the crash interrupted
    lost |= steps_of[last.seq]
    return lost


# -- shared ------------------------------------------------------------------------------------
def _config(work: Path, **async_log: Any) -> dict[str, Any]:
    settings = {"spool_dir": str(work / f"spool-{uuid.uuid4().hex[:6]}"), **async_log}
    return {"trainer": {"log_async": True, "async_log": settings}}


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _p50(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


SCENARIOS = ("sigkill", "reduce", "actors", "dumps", "outage", "slow", "hung", "damage")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child_main(argv[1:])
    results, written = run_scenarios(argv, "tracklane.benchmarks.faults", __doc__, SCENARIOS, run_scenario, "faults",
                                     long_help="the README's sizes (minutes each)")
    for result in results:
        print(json.dumps({k: v for k, v in result.items() if k not in ("summary", "summary_at_finish")}))
    print(f"wrote {written}")
    return 0


def run_scenarios(argv: list[str], prog: str, doc: str | None, scenarios: tuple[str, ...],
                  run: Callable[[str, Path, str, bool], dict[str, Any]], name: str,
                  long_help: str) -> tuple[list[dict[str, Any]], Path]:
    """A fault benchmark's command line: each scenario ``--only`` names (all by default), each in a fresh folder
    under ``--out``, against ``--mlflow-uri`` or a server started for the run; the results, and where they went."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help=long_help)
    parser.add_argument("--only", default=",".join(scenarios))
    parser.add_argument("--out", default=f"tracklane_runs/{name}")
    parser.add_argument("--mlflow-uri", default=os.environ.get("TRACKLANE_TEST_MLFLOW_URI", ""),
                        help="a running MLflow server (default: one is started for the run)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with _mlflow(args.mlflow_uri, out) as uri:  # the given server, or one started for the run
        results = [run(scenario, Path(tempfile.mkdtemp(prefix=f"{scenario}-", dir=out)), uri, args.long)
                   for scenario in args.only.split(",")]
    written = out / f"{name}.json"
    written.write_text(json.dumps(results, indent=2))
    return results, written


def run_scenario(name: str, work: Path, mlflow_uri: str, long: bool) -> dict[str, Any]:
    if name == "sigkill":
        return sigkill_trainer(work, mlflow_uri, steps=3000 if long else 600)
    if name == "reduce":
        return sigkill_reductions(work, mlflow_uri, steps=1000 if long else 300)
    if name == "actors":
        return actor_kills(work, mlflow_uri, steps=3000 if long else 600, kills_per_lane=3 if long else 2)
    if name == "dumps":
        return {"lane kills": dump_kills(work / "actors", mlflow_uri, steps=120 if long else 40),
                "trainer kill": sigkill_dumps(work / "trainer", mlflow_uri, steps=200 if long else 60)}
    if name == "outage":
        return mlflow_outage(work, mlflow_uri, down_s=20.0, steps=2000) if not long else \
            {"20s": mlflow_outage(work / "20", mlflow_uri, down_s=20.0, steps=3000),
             "120s": mlflow_outage(work / "120", mlflow_uri, down_s=120.0, steps=9000)}
    if name == "slow":
        return slow_tracker(work, seconds=180.0 if long else 20.0)
    if name == "hung":
        return hung_finish_then_replay(work, mlflow_uri)
    if name == "damage":
        return damaged_spool(work)
    raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")


@contextlib.contextmanager
def _mlflow(uri: str, out: Path) -> Iterator[str]:
    if uri:
        yield uri
        return
    from tracklane.testing.mlflow_server import start_server, stop_server

    proc, started = start_server(out / "mlflow")
    try:
        yield started
    finally:
        stop_server(proc.pid)


if __name__ == "__main__":
    sys.exit(main())
