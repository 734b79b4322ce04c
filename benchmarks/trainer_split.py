"""Where a CPU-bound trainer's extra step time goes when it logs: its own thread, the GIL, or its CPU.

    python -m tracklane.benchmarks.trainer_split [--steps 100] [--modes none,async] [--async-log KEY=VALUE ...] [--out DIR]

Runs the real trainer (``tracklane.trainer.main.fit``, torch on one thread, the six default trackers) once per mode,
back to back, and reads the kernel's own per-thread accounting around the timed steps (the first
``--warmup`` are left out):

* the trainer thread's wall time per step, split by ``/proc/self/task/<tid>/schedstat`` into time on a CPU,
  time runnable but waiting for one (``run_delay``: another task had its core), and the rest, off-CPU
  (sleeping on a lock; for a thread that only computes, the GIL). Its CPU time is split again into the
  logging calls (timed around each ``tracking.log*()``) and the training work;
* every other thread of the trainer's process (the shipper, Ray's driver threads) and every other process on
  the machine (lane actors, Ray's daemons, the MLflow server, wandb-core), as CPU seconds per step;
* the machine's idle time per step (``/proc/stat``).

A mode's extra step time over ``none`` is then: more training work on the thread (a slower core: caches,
memory bandwidth), its logging calls, waits for a CPU, and waits for the GIL. Prints the table and writes
``trainer_split.json``. No timed assertions: the figures are the result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from tracklane.benchmarks.harness import ALL_TRACKERS, BenchEnv, Clock, common_args, fmt, machine, quiet_stdout, table, write_json

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Snapshot:
    wall: float
    threads: dict[int, tuple[int, int]]
    """This process's threads: tid -> (ns on a CPU, ns runnable but waiting), from schedstat."""
    names: dict[int, str]
    """This process's threads: tid -> its name (``comm``: torch's, gRPC's and Ray's threads name themselves)."""
    processes: dict[int, tuple[str, float]]
    """Every other process: pid -> (what it is, CPU seconds so far)."""
    idle_s: float
    """The machine's idle + iowait seconds so far, all CPUs."""


def snapshot() -> Snapshot:
    wall = time.perf_counter()
    threads, names = {}, {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu, waiting, _ = f.read().split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
            threads[int(tid)] = (int(on_cpu), int(waiting))
        except OSError:
            pass
    processes = {}
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        processes[int(pid)] = (_what(stat[stat.find("(") + 1:stat.rfind(")")], cmdline),
                               (int(fields[11]) + int(fields[12])) / TICK)
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    return Snapshot(wall, threads, names, processes, (int(cpu[4]) + int(cpu[5])) / TICK)


def _what(comm: str, cmdline: str) -> str:
    """A process's part in the run, from its name and command line."""
    for marker, name in (("LaneActor", "lane actors"), ("ProducerHub", "Ray: other actors"),
                         ("raylet", "Ray: raylet"), ("gcs_server", "Ray: GCS"), ("mlflow", "MLflow server"),
                         ("wandb-core", "wandb-core"), ("wandb", "wandb-core"), ("ray::", "Ray: other workers"),
                         ("default_worker", "Ray: idle workers"), ("log_monitor", "Ray: log monitor"),
                         ("dashboard", "Ray: agents"), ("runtime_env", "Ray: agents"), ("ray/", "Ray: other")):
        if marker in comm or marker in cmdline:
            return name
    return "other processes"


class TimedCalls:
    """Wall time the trainer's thread spends inside ``tracking.log*()`` (the logging calls), per step."""

    def __init__(self) -> None:
        self.ns = 0

    def wrap(self, tracking: Any) -> Any:
        for name in [n for n in dir(tracking) if n.startswith("log") and callable(getattr(tracking, n))]:
            setattr(tracking, name, self._timed(getattr(tracking, name)))
        return tracking

    def _timed(self, call: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return call(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - started
        return timed


@dataclass(slots=True)
class Window:
    """What the timed steps cost, from a snapshot at their start and one at their end."""

    steps: int
    first: Snapshot | None = None
    last: Snapshot | None = None
    calls_ns: tuple[int, int] = (0, 0)
    shipper: int | None = None
    """The shipper thread's kernel id (async), taken while it runs."""
    lanes: dict[int, str] | None = None
    """Lane actor pid -> its tracker (async)."""


def run_mode(env: BenchEnv, name: str, steps: int, warmup: int, trackers: list[str], async_log: dict) -> dict:
    import torch

    from tracklane import Tracking
    from tracklane.trainer.config import load_config
    from tracklane.trainer.main import fit

    torch.set_num_threads(1)
    calls = TimedCalls()
    window = Window(steps)
    main_tid = threading.get_native_id()

    def tracking_class(*args: Any, **kwargs: Any) -> Any:
        tracking = calls.wrap(Tracking(*args, **kwargs))
        log = tracking.log

        def log_and_mark(data: dict, step: int, *rest: Any, **kw: Any) -> None:
            log(data, step, *rest, **kw)
            # the step's last call (its metrics): the window opens after warm-up and closes after the last
            if step == warmup and window.first is None:
                tracking.wait_ready(300)  # the window measures the steady state: every lane answered (its pid known)
                window.first, window.calls_ns, window.shipper = snapshot(), (calls.ns, 0), _shipper_tid()
                window.lanes = {info.pid: tracker for tracker, info in tracking.lanes().items() if info.pid}
            elif step == warmup + steps and window.last is None:
                window.last, window.calls_ns = snapshot(), (window.calls_ns[0], calls.ns)
        tracking.log = log_and_mark
        return tracking

    place = env.place(f"split-{name}")
    logger = "[]" if name == "none" else "[" + ",".join(trackers) + "]"
    settings = [f"trainer.async_log.{k}={v}" for k, v in async_log.items()] if name != "none" else []
    cfg = load_config([f"trainer.logger={logger}", f"trainer.log_async={name == 'async'}",
                       f"trainer.total_steps={warmup + steps}", "trainer.progress=false", "trainer.save_freq=0",
                       f"trainer.default_local_dir={place.root / 'ckpt'}", f"trainer.project_name={place.project}",
                       f"trainer.experiment_name={place.experiment}", *settings])
    with quiet_stdout():
        result = fit(cfg, tracking_class)
    first, last = window.first, window.last
    assert first is not None and last is not None, "the trainer did not log the window's steps"
    n = steps
    per_step = 1e3 / n  # seconds over the window -> ms per step
    wall = (last.wall - first.wall) * per_step
    on_cpu = (last.threads[main_tid][0] - first.threads[main_tid][0]) / 1e9 * per_step
    waiting = (last.threads[main_tid][1] - first.threads[main_tid][1]) / 1e9 * per_step
    logging_ms = (window.calls_ns[1] - window.calls_ns[0]) / 1e9 * per_step
    others = {}
    for tid, (cpu_ns, _) in last.threads.items():
        if tid != main_tid:
            others[tid] = (cpu_ns - first.threads.get(tid, (0, 0))[0]) / 1e9 * per_step
    shipper = window.shipper
    by_name: dict[str, float] = {}
    for tid, ms in others.items():
        if tid != shipper:
            thread = last.names.get(tid, "?")
            by_name[thread] = by_name.get(thread, 0.0) + ms
    elsewhere: dict[str, float] = {}
    for pid, (what, cpu) in last.processes.items():
        before = first.processes.get(pid, (what, 0.0))[1]
        elsewhere[what] = elsewhere.get(what, 0.0) + (cpu - before) * per_step
    timed = [s for step, s in result.step_s.items() if warmup < step <= warmup + steps]
    return {
        "mode": name, "steps": n, "step_ms_p50": statistics.median(timed) * 1e3, "step_ms_mean": wall,
        "trainer_thread_ms": {"training work": max(0.0, on_cpu - logging_ms), "logging calls": logging_ms,
                              "waiting for a CPU": waiting,
                              "off CPU (the GIL, locks)": max(0.0, wall - on_cpu - waiting)},
        "trainer_process_other_threads_cpu_ms": {
            "shipper": others.pop(shipper, 0.0) if shipper else 0.0,
            "Ray's driver threads and the rest": sum(others.values())},
        "other_threads_by_name_cpu_ms": {k: v for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v >= 0.05},
        "other_processes_cpu_ms": {k: v for k, v in sorted(elsewhere.items(), key=lambda kv: -kv[1]) if v >= 0.05},
        "machine_idle_ms": (last.idle_s - first.idle_s) * per_step,
        "shipper_found": shipper is not None,
        "complete": result.report.complete if result.report is not None else None,
        "lane_cpu_ms": {name: (last.processes.get(pid, ("", 0.0))[1] - first.processes.get(pid, ("", 0.0))[1])
                        * per_step for pid, name in (window.lanes or {}).items()},
    }


def _shipper_tid() -> int | None:
    """The shipper thread's kernel id, if it is still alive (it is, until finish())."""
    return next((t.native_id for t in threading.enumerate() if t.name == "tracklane-shipper"), None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracklane.benchmarks.trainer_split", description=__doc__.splitlines()[0])
    common_args(parser, "trainer_split")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--modes", default="none,async", help="comma-separated: none, sync, async")
    parser.add_argument("--trackers", help="comma-separated (default: all six; --quick: tensorboard,file)")
    parser.add_argument("--async-log", metavar="KEY=VALUE", action="append", default=[],
                        help="a trainer.async_log setting for the logging modes (repeatable)")
    args = parser.parse_args(argv)
    steps, warmup = (5, 3) if args.quick else (args.steps, args.warmup)
    trackers = args.trackers.split(",") if args.trackers else (["tensorboard", "file"] if args.quick else ALL_TRACKERS)
    async_log = dict(pair.split("=", 1) for pair in args.async_log)
    clock = Clock()
    modes = []
    with BenchEnv(args.mlflow_uri, "trainer_split") as env:
        for name in args.modes.split(","):
            print(f"[{clock.elapsed():6.0f} s] {name}", flush=True)
            modes.append(run_mode(env, name, steps, warmup, trackers, async_log))
    _print(modes)
    path = write_json(args.out, "trainer_split", {"machine": machine(), "async_log": async_log, "modes": modes,
                                                  "wall_s": clock.elapsed()})
    print(f"\nwrote {path}; wall time {clock.elapsed():.0f} s")
    return 0


def _print(modes: list[dict]) -> None:
    base = modes[0]
    rows = [["step ms (mean over the window)"] + [fmt(m["step_ms_mean"], 1) for m in modes],
            ["step ms p50"] + [fmt(m["step_ms_p50"], 1) for m in modes]]
    labels = {"trainer_thread_ms": "trainer thread", "trainer_process_other_threads_cpu_ms": "trainer process, CPU",
              "other_threads_by_name_cpu_ms": "  of which threads named", "other_processes_cpu_ms": "CPU elsewhere"}
    for group, label in labels.items():
        keys = list(dict.fromkeys(k for m in modes for k in m[group]))
        if group == "other_threads_by_name_cpu_ms":  # the few that matter
            keys = [k for k in keys if max(m[group].get(k, 0.0) for m in modes) >= 0.5]
        rows += [[f"{label}: {k}"] + [fmt(m[group].get(k, 0.0), 1) for m in modes] for k in keys]
    rows.append(["machine idle (all CPUs)"] + [fmt(m["machine_idle_ms"], 1) for m in modes])
    lanes = list(dict.fromkeys(k for m in modes for k in m["lane_cpu_ms"]))
    rows += [[f"  of the lane actors: {k}"] + [fmt(m["lane_cpu_ms"].get(k, 0.0), 1) for m in modes] for k in lanes]
    print(f"\n== ms per step over the timed steps, {base['steps']} steps a mode ==")
    print(table(["where"] + [m["mode"] for m in modes], rows))
    for m in modes[1:]:
        extra = m["step_ms_mean"] - base["step_ms_mean"]
        t, b = m["trainer_thread_ms"], base["trainer_thread_ms"]
        print(f"{m['mode']}: {fmt(extra, 1)} ms a step more than {base['mode']} "
              f"({fmt(m['step_ms_mean'] / base['step_ms_mean'], 3)}x): "
              + ", ".join(f"{k} {fmt(t[k] - b[k], 1)}" for k in t))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
