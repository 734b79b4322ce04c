"""A seeded chaos run: rank 0 and 4 producers logging into every default tracker while faults, drawn from a seed,
hit the pipeline from every side; then every tracker's own store is read back and checked point by point.

    python -m tracklane.benchmarks.chaos --seed 7 --minutes 5 [--faults lane_kill,mlflow_cut,...] [--out DIR]

The run: a trainer child process (``benchmarks/chaos_child.py``: ``Tracking`` with ``log_async: true``) logs a
step every ``--pause`` seconds with validation generations, trajectories, a histogram and a text record every
``--rich-every`` steps, and makes 4 producers (``tracking.producer``) that Ray actors log their own keys with
(two on the trainer's step, two on their own axis). Trackers: console, file, TensorBoard, MLflow (a real
``mlflow server`` on 127.0.0.1, reached through a ``TcpProxy``), wandb and SwanLab (offline). The spool lives on
a small tmpfs of its own (``mount -t tmpfs -o size=64m``: needs root, as in CI).

The faults (``benchmarks/chaos_schedule.py`` draws when, on what and how long, from ``random.Random(seed)``):

    lane_kill      SIGKILL one tracker's lane actor (Ray restarts it; the successor resumes from the lane state)
    mlflow_cut     the proxy closes every MLflow connection and resets new ones, for a few seconds
    mlflow_stall   the proxy accepts MLflow connections and never answers (a hung server), for a few seconds
    producer_kill  SIGKILL a producer's actor process; a new actor with a fresh producer handle goes on from the
                   step after the last one its predecessor logged
    trainer_kill   SIGKILL the trainer (its Ray, lanes and producers die with it); a new trainer with the same
                   run id, ``resume=True`` and the same spool goes on from the step after its last one
    disk_fill      a ballast file fills the spool's tmpfs to the last byte (ENOSPC), and is deleted later
    poison         the trainer logs one image MLflow cannot store (``chaos_child.POISON_NAME``): a real refusal,
                   counted failed in MLflow and stored by every other tracker

The end check (``benchmarks/chaos_check.py``) holds every tracker to: every point logged before a kill's grace
window exactly once; no duplicate; no point that was not logged; each sender's order kept where the store
keeps order; and every loss the final report names equal to what is missing: a killed producer's unshipped
tail, what a full disk cost, the poison record. The seed and the fault timeline are printed at the start and
the end, so a failing run replays with the same seed; the exit code is 1 when a check failed. The whole
result is written as JSON to ``<out>/seed-<N>-<time>/chaos.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tracklane.benchmarks.chaos_child import last_logged_step
from tracklane.benchmarks.chaos_schedule import KINDS, Fault, counts_for, draw_schedule
from tracklane.benchmarks.faults import _MLFLOW_FAIL_FAST, Child, _environment, _mlflow, tracker_env

ROOT = Path(__file__).resolve().parents[1]
TRACKERS = ["console", "file", "tensorboard", "mlflow", "wandb", "swanlab"]
"""Every default tracker: the run logs to all of them, and checks those of ``Settings.checked``."""
PRODUCERS = 4


@dataclasses.dataclass(kw_only=True)
class Settings:
    """One chaos run's settings (the command line's)."""

    seed: int
    minutes: float
    kinds: tuple[str, ...] = KINDS
    counts: dict[str, int] | None = None
    """How many faults of each kind (None: ``chaos_schedule.counts_for`` the run's length)."""
    out: Path = Path("tracklane_runs/chaos")
    keys: int = 10
    producer_keys: int = 4
    pause: float = 0.05
    producer_pause: float = 0.1
    rich_every: int = 25
    flush_interval_s: float = 0.5
    grace_margin_s: float = 0.25
    """A kill's grace window: records logged less than flush_interval_s + this before the kill may be missing."""
    tmpfs_mb: int = 64
    finish_timeout_s: float = 600.0
    mlflow_uri: str = ""
    """A running MLflow server to use (default: one is started for the run)."""
    checked: tuple[str, ...] = tuple(TRACKERS)
    """The trackers whose stores are checked (every tracker is logged to)."""

    @property
    def window_s(self) -> float:
        return self.minutes * 60.0

    @property
    def grace_s(self) -> float:
        return self.flush_interval_s + self.grace_margin_s


# -- the trainer child, seen from here --------------------------------------------------------------------
class TrainerProcess(Child):
    """One trainer child (``benchmarks/chaos_child.py``), its protocol lines read on a thread of our own; its stdout
    (the console tracker's lines) goes to ``trainer-g<gen>.out``, its stderr to ``trainer-g<gen>.log``."""

    def __init__(self, gen: int, spec: dict[str, Any], env: dict[str, str], work: Path) -> None:
        read_fd, write_fd = os.pipe()
        self.gen = gen
        self.stdout_path = work / f"trainer-g{gen}.out"
        self._stderr = open(work / f"trainer-g{gen}.log", "ab")
        with open(self.stdout_path, "wb") as stdout:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tracklane.benchmarks.chaos", "child", "--spec",
                 json.dumps({**spec, "proto_fd": write_fd})],
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=stdout, stderr=self._stderr, text=True,
                pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        self.logged: list[tuple[int, float]] = []  # (step, time written down before its log())
        self.events: list[dict[str, Any]] = []
        self.finished: dict[str, Any] | None = None
        self.ready_at = 0.0
        self.killed_at: float | None = None
        self._ready, self._done = threading.Event(), threading.Event()
        threading.Thread(target=self._read, args=(read_fd,), name=f"chaos-trainer-g{gen}", daemon=True).start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, encoding="utf-8") as lines:
            for line in lines:
                try:
                    self._take(line)
                except (ValueError, KeyError):  # a line cut short by a SIGKILL: what it said is unknown
                    continue
        self._done.set()

    def _take(self, line: str) -> None:
        if not line.endswith("\n"):
            raise ValueError("a torn last line")
        word, _, rest = line.rstrip("\n").partition(" ")
        if word == "log":
            step, when = rest.split()
            self.logged.append((int(step), float(when)))
        elif word == "ready":
            self.ready_at = float(rest)
            self._ready.set()
        elif word == "event":
            kind, target, when, details = rest.split(" ", 3)
            self.events.append({"kind": kind, "target": target, "time": float(when), **json.loads(details)})
        elif word == "finished":
            self.finished = json.loads(rest)

    def wait(self, event: threading.Event, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not event.wait(0.5):
            if self.proc.poll() is not None and not event.is_set():
                self._done.wait(5)
                if event.is_set():
                    return
                raise RuntimeError(f"trainer g{self.gen} exited (rc {self.proc.returncode}) before {what}; "
                                   f"see {self._stderr.name}:\n{_tail(Path(self._stderr.name))}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"trainer g{self.gen}: no {what} in {timeout:.0f} s; see {self._stderr.name}")

    def wait_ready(self, timeout: float = 300.0) -> None:
        self.wait(self._ready, "ready", timeout)

    def wait_finished(self, timeout: float) -> None:
        self.wait(self._done, "finish()", timeout)

    def send(self, *words: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):  # it died meanwhile: the next check says so
            self.proc.stdin.write(" ".join(words) + "\n")
            self.proc.stdin.flush()

    def kill(self) -> float:
        self.killed_at = super().kill()
        return self.killed_at

    def reap(self, timeout: float = 30.0) -> None:
        """End what the child started (faults.Child.reap), then SIGKILL whatever of its session is still there
        (a Ray worker that outlived its raylet would log on and blur the next trainer's picture)."""
        super().reap(timeout)
        import psutil

        for proc in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):
                if os.getsid(proc.pid) == self.proc.pid:
                    os.kill(proc.pid, signal.SIGKILL)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# -- the spool's own small disk ---------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(mount: Path, size_mb: int, required: bool) -> Iterator[bool]:
    """A tmpfs of ``size_mb`` MiB at ``mount`` for the block (True), or a plain folder (False) when mounting is
    not allowed here and no fault needs it; unmounted at the end whatever happens."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if required:
            raise RuntimeError(f"disk_fill needs a tmpfs for the spool (mount -t tmpfs, as root): {done.stderr.strip()}")
        yield False
        return
    try:
        yield True
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill_disk(mount: Path) -> tuple[Path, int]:
    """Write a ballast file until the filesystem has not one byte left (ENOSPC); returns it and its size."""
    ballast = mount / f"ballast-{uuid.uuid4().hex[:6]}"
    written = 0
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            chunk = b"\0" * size
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return ballast, written


class RunClock:
    """Seconds of the run: wall time since logging started, standing still while a trainer is being replaced."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._paused_total = 0.0
        self._paused_at: float | None = None

    def now(self) -> float:
        end = self._paused_at if self._paused_at is not None else time.monotonic()
        return end - self._started - self._paused_total

    def pause(self) -> None:
        self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused_total += time.monotonic() - self._paused_at
            self._paused_at = None


# -- one run --------------------------------------------------------------------------------------------
class ChaosRun:
    """Sets up the servers, the proxy and the disk, runs the trainers, stages the schedule's faults, and checks."""

    def __init__(self, settings: Settings, work: Path) -> None:
        self.s = settings
        self.work = work
        self.run_id = uuid.uuid4().hex[:12]
        self.experiment = f"chaos-{settings.seed}-{uuid.uuid4().hex[:6]}"
        self.schedule = draw_schedule(settings.seed, settings.window_s, settings.kinds, TRACKERS, PRODUCERS,
                                      settings.counts or counts_for(settings.minutes))
        self.trainers: list[TrainerProcess] = []
        self.timeline: list[dict[str, Any]] = []
        self.started_wall = 0.0
        self.disk_fills: list[dict[str, Any]] = []
        self._ballast: Path | None = None
        self.phases: dict[str, float] = {}
        """Seconds each part of the run took: first trainer ready, logging, stop to finish() returned."""

    # -- the trainers ------------------------------------------------------------------------------
    def _spec(self, spool: Path, resume: bool) -> dict[str, Any]:
        """The next trainer's settings: it goes on from the step after the last one logged, as does each producer."""
        s = self.s
        last = max((step for t in self.trainers for step, _ in t.logged), default=0)
        gens, firsts = [], []
        for index in range(PRODUCERS):
            files = sorted(self.producer_dir.glob(f"p{index}-g*.log"))
            gens.append(max((int(f.stem.split("-g")[1]) for f in files), default=-1) + 1)
            last_step = last_logged_step(files)
            firsts.append(0 if last_step is None else last_step + 1)
        async_log = {"spool_dir": str(spool), "flush_interval_s": s.flush_interval_s,
                     "ray_init": {"num_cpus": os.cpu_count() or 1}}
        return {"run_id": self.run_id, "experiment": self.experiment, "backends": TRACKERS, "async_log": async_log,
                "resume": resume, "first": last + 1, "producer_gens": gens, "producer_first": firsts,
                "producer_dir": str(self.producer_dir), "keys": s.keys, "producer_keys": s.producer_keys,
                "pause": s.pause, "producer_pause": s.producer_pause, "rich_every": s.rich_every,
                "finish_timeout_s": s.finish_timeout_s}

    def _start_trainer(self, env: dict[str, str], spool: Path) -> TrainerProcess:
        trainer = TrainerProcess(len(self.trainers), self._spec(spool, resume=bool(self.trainers)), env, self.work)
        self.trainers.append(trainer)
        trainer.wait_ready()
        return trainer

    @property
    def producer_dir(self) -> Path:
        return self.work / "producers"

    # -- the faults -------------------------------------------------------------------------------------
    def _note(self, clock: RunClock, fault: Fault, phase: str, **details: Any) -> None:
        entry = {"clock_s": round(clock.now(), 2), "wall": time.time(), "kind": fault.kind, "target": fault.target,
                 "phase": phase, **details}
        self.timeline.append(entry)
        print(f"  [{entry['clock_s']:7.1f} s] {fault.kind} {fault.target} {phase} "
              f"{' '.join(f'{k}={v}' for k, v in details.items())}", flush=True)

    def _act(self, fault: Fault, phase: str, clock: RunClock, proxy: Any, trainer: TrainerProcess,
             env: dict[str, str], spool: Path, disk: Path) -> TrainerProcess:
        if fault.kind in ("lane_kill", "producer_kill"):
            trainer.send("kill_lane" if fault.kind == "lane_kill" else "kill_producer", fault.target)
            self._note(clock, fault, "ordered", trainer=f"g{trainer.gen}")
        elif fault.kind == "poison":
            trainer.send("poison")
            self._note(clock, fault, "ordered", trainer=f"g{trainer.gen}")
        elif fault.kind in ("mlflow_cut", "mlflow_stall"):
            if phase == "start":
                proxy.cut() if fault.kind == "mlflow_cut" else proxy.stall()
            else:
                proxy.restore()
            self._note(clock, fault, phase)
        elif fault.kind == "disk_fill":
            if phase == "start":
                self._ballast, nbytes = fill_disk(disk)
                free = shutil.disk_usage(disk).free
                self.disk_fills.append({"start": time.time(), "ballast_bytes": nbytes, "free_bytes": free})
                self._note(clock, fault, phase, ballast_mib=round(nbytes / 2**20, 1), free_bytes=free)
            else:
                if self._ballast is not None:
                    self._ballast.unlink()
                    self._ballast = None
                self.disk_fills[-1]["end"] = time.time()
                self._note(clock, fault, phase)
        elif fault.kind == "trainer_kill":
            clock.pause()
            killed_at = trainer.kill()
            self._note(clock, fault, "killed", trainer=f"g{trainer.gen}", pid=trainer.proc.pid,
                       last_step=trainer.logged[-1][0] if trainer.logged else None)
            trainer.reap()
            started = time.monotonic()
            trainer = self._start_trainer(env, spool)
            clock.resume()
            self._note(clock, fault, "resumed", trainer=f"g{trainer.gen}", restart_s=round(time.monotonic() - started, 1),
                       killed_at=round(killed_at - self.started_wall, 2))
        return trainer

    def run(self) -> dict[str, Any]:
        s = self.s
        self.producer_dir.mkdir(parents=True, exist_ok=True)
        from tracklane.testing.tcp_proxy import TcpProxy

        with contextlib.ExitStack() as stack:
            uri = stack.enter_context(_mlflow(s.mlflow_uri, self.work))
            server = urlsplit(uri)
            proxy = stack.enter_context(TcpProxy(server.hostname or "127.0.0.1", server.port or 80))
            disk = self.work / "spool-disk"
            mounted = stack.enter_context(small_disk(disk, s.tmpfs_mb, required="disk_fill" in s.kinds))
            spool = disk / "spool"
            env = {**os.environ, **tracker_env(self.work, f"http://{proxy.address}"), **_MLFLOW_FAIL_FAST,
                   "RAY_ADDRESS": "local", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                   os.environ.get("PYTHONPATH")])),
                   **{name: str(self.work / name.lower()) for name in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR",
                                                                          "WANDB_CONFIG_DIR")}}
            env.pop("MLFLOW_RUN_ID", None)
            error = None
            try:
                self._drive(env, spool, disk, proxy)
            except Exception as exc:  # the run could not go on: still check what is there, and say why
                error = f"{type(exc).__name__}: {exc}"
                print(f"chaos: the run stopped early: {error}", flush=True)
            finally:
                for trainer in self.trainers:
                    if trainer.proc.poll() is None and trainer.finished is None:  # the run stopped early
                        trainer.kill()
                    trainer.reap()  # a finished one exits by itself: reaped once it has
                proxy.restore()
                if self._ballast is not None:
                    self._ballast.unlink()
            result = self._check(uri, mounted, error)
            result["mlflow_connections_refused"] = proxy.refused
            if not result["passed"] and mounted:
                with contextlib.suppress(OSError):
                    shutil.copytree(spool, self.work / "spool-at-end")  # the tmpfs goes with the run
        return result

    def _drive(self, env: dict[str, str], spool: Path, disk: Path, proxy: Any) -> None:
        s = self.s
        started = time.monotonic()
        trainer = self._start_trainer(env, spool)
        self.phases["first_trainer_ready_s"] = round(time.monotonic() - started, 1)
        self.started_wall = time.time()
        clock = RunClock()
        actions = sorted([(f.at, 1, n, f, "start") for n, f in enumerate(self.schedule)]
                         + [(f.at + f.duration, 0, n, f, "end") for n, f in enumerate(self.schedule) if f.duration],
                         key=lambda a: a[:3])
        print(f"chaos: logging for {s.window_s:.0f} s of run clock", flush=True)
        for at, _, _, fault, phase in actions:
            while clock.now() < at:
                if trainer.proc.poll() is not None:
                    raise RuntimeError(f"trainer g{trainer.gen} died on its own (rc {trainer.proc.returncode}); "
                                       f"see {trainer._stderr.name}:\n{_tail(Path(trainer._stderr.name))}")
                time.sleep(0.05)
            trainer = self._act(fault, phase, clock, proxy, trainer, env, spool, disk)
        while clock.now() < s.window_s:
            time.sleep(0.05)
        self.phases["logging_wall_s"] = round(time.time() - self.started_wall, 1)
        trainer.send("stop")
        print("chaos: stopping: producers flush, then finish()", flush=True)
        stopping = time.monotonic()
        trainer.wait_finished(s.finish_timeout_s + 240)
        self.phases["stop_to_finished_s"] = round(time.monotonic() - stopping, 1)

    # -- the check ---------------------------------------------------------------------------------------
    def expected(self) -> Any:
        from tracklane.benchmarks.chaos_check import Expected, Logged, Window

        logged = [Logged("train", t.gen, step, when) for t in self.trainers for step, when in t.logged]
        senders: dict[tuple[str, int], str] = {}
        for path in sorted(self.producer_dir.glob("p*-g*.log")):
            name, gen = path.stem.split("-g")
            for line in path.read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if parts[0] == "log" and len(parts) == 3:
                    logged.append(Logged(name, int(gen), int(parts[1]), float(parts[2])))
                elif parts[0] == "sender" and len(parts) == 2:
                    senders[(name, int(gen))] = parts[1]
        last = self.trainers[-1] if self.trainers else None
        windows = []
        for trainer in self.trainers:
            alive: dict[str, int] = {}  # producer -> its incarnation alive in this trainer
            for event in trainer.events:
                if event["kind"] == "producer_started":
                    alive[event["target"]] = event["gen"]
                elif event["kind"] == "producer_kill":
                    windows.append(Window("producer_kill", event["time"], event["time"] - self.s.grace_s,
                                          frozenset({(event["target"], event["gen"])}), reported=trainer is last))
            if trainer.killed_at is not None and trainer is not last:
                members = {("train", trainer.gen), *alive.items()}
                windows.append(Window("trainer_kill", trainer.killed_at, trainer.killed_at - self.s.grace_s,
                                      frozenset(members), reported=False))
        return Expected(logged=logged, windows=windows, keys=self.s.keys, producer_keys=self.s.producer_keys,
                        rich_every=self.s.rich_every, senders=senders)

    def _check(self, uri: str, mounted: bool, error: str | None) -> dict[str, Any]:
        from tracklane.benchmarks.chaos_check import Place, check_tracker
        from tracklane.benchmarks.chaos_child import GEN_KEY

        expected = self.expected()
        place = Place(self.work, self.run_id, self.experiment, uri,
                      console_files=[t.stdout_path for t in self.trainers])
        report = self.trainers[-1].finished if self.trainers else None
        poisoned = any(e["kind"] == "poison" for t in self.trainers for e in t.events)
        generation_keys = [GEN_KEY, *(f"p{j}/{GEN_KEY}" for j in range(PRODUCERS))]
        started = time.monotonic()
        with _environment({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}):
            trackers = {t: check_tracker(t, place, expected, report, poisoned, generation_keys) for t in self.s.checked}
        failures = [f"{t}: {f}" for t, r in trackers.items() for f in r["failures"]]
        if error:
            failures.insert(0, f"run: {error}")
        if report is None:
            failures.insert(0, "run: the last trainer printed no report (finish() did not return)")
        events = sorted(({"wall": e["time"], **{k: v for k, v in e.items() if k != "time"}, "trainer": f"g{t.gen}"}
                         for t in self.trainers for e in t.events), key=lambda e: e["wall"])
        for entry in [*self.timeline, *events]:
            entry["t_s"] = round(entry["wall"] - self.started_wall, 2) if self.started_wall else None
        return {"seed": self.s.seed, "minutes": self.s.minutes, "kinds": list(self.s.kinds), "run_id": self.run_id,
                "experiment": self.experiment, "work": str(self.work), "spool_on_tmpfs": mounted,
                "grace_s": self.s.grace_s, "schedule": [f.to_plain() for f in self.schedule],
                "timeline": self.timeline, "events": events, "disk_fills": self.disk_fills,
                "windows": [{"kind": w.kind, "t_s": round(w.at - self.started_wall, 2), "reported": w.reported,
                             "incarnations": sorted(f"{s}-g{g}" for s, g in w.incarnations)}
                            for w in expected.windows],
                "records_logged": len(expected.logged), "trackers": trackers,
                "phases": {**self.phases, "check_s": round(time.monotonic() - started, 1)},
                "report_summary": (report or {}).get("summary"), "failures": failures, "passed": not failures,
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self.s).items()}}


# -- printing ----------------------------------------------------------------------------------------------
def replay_command(s: Settings) -> str:
    """The command that replays this run's schedule (same seed, length, kinds and counts)."""
    kinds = "" if tuple(s.kinds) == KINDS else f" --faults {','.join(s.kinds)}"
    default = counts_for(s.minutes)
    counts = {k: n for k, n in (s.counts or {}).items() if default.get(k) != n and k in s.kinds}
    extra = f" --counts {','.join(f'{k}={n}' for k, n in counts.items())}" if counts else ""
    if (s.keys, s.pause) != (10, 0.05):
        extra += f" --keys {s.keys} --pause {s.pause:g}"
    if (s.producer_keys, s.producer_pause) != (4, 0.1):
        extra += f" --producer-keys {s.producer_keys} --producer-pause {s.producer_pause:g}"
    if s.rich_every != 25:
        extra += f" --rich-every {s.rich_every}"
    return f"python -m tracklane.benchmarks.chaos --seed {s.seed} --minutes {s.minutes:g}{kinds}{extra}"


def print_schedule(settings: Settings, schedule: list[Fault]) -> None:
    print(f"chaos: seed {settings.seed}, {settings.minutes:g} min, {len(schedule)} faults "
          f"({', '.join(sorted({f.kind for f in schedule}))}); replay: {replay_command(settings)}")
    for fault in schedule:
        print(f"  {fault.describe()}")
    sys.stdout.flush()


def print_result(result: dict[str, Any], settings: Settings) -> None:
    print(f"\nchaos: seed {result['seed']}, {result['minutes']:g} min; fault timeline (wall s since logging began; "
          f"run clock s for what was ordered from here):")
    for entry in sorted([*result["timeline"], *result["events"]], key=lambda e: e["wall"]):
        if entry.get("kind") in ("producer_stopped",):
            continue
        extra = {k: v for k, v in entry.items() if k not in ("wall", "t_s", "kind", "target", "clock_s", "phase")}
        clock = f"{entry['clock_s']:.1f}" if "clock_s" in entry else ""
        print(f"  {entry['t_s'] if entry['t_s'] is not None else '-':>8} {clock:>7} {entry['kind']:<16} "
              f"{entry['target']:<8} {entry.get('phase', ''):<8} {json.dumps(extra, default=str)[:150]}")
    print(f"\n  {'tracker':<12}{'logged':>8}{'must':>8}{'present':>9}{'lost':>6}{'window':>8}{'dup':>5}{'unexp':>6}"
          f"{'torn':>6}{'gens':>10}{'poison':>8}  order")
    for name, row in result["trackers"].items():
        if "logged_points" not in row:
            print(f"  {name:<12} {row['failures'][0]}")
            continue
        order = row["order"]
        order_text = "n/a" if order.get("kept") is None else ("kept" if order["kept"] else f"BROKEN x{order['broken_count']}")
        across = order.get("producer_order_across_restarts", {})
        if across and not across.get("kept", True):
            order_text += f" (producers across restarts: {across['count']} back)"
        poison = row.get("poison")
        print(f"  {name:<12}{row['logged_points']:>8}{row['must_points']:>8}{row['present_points']:>9}"
              f"{row['missing_points']:>6}{row['window_lost_points']:>8}{row['duplicated']:>5}{row['unexpected_points']:>6}"
              f"{row['torn_records']:>6}{row['generations']['stored']:>5}/{row['generations']['expected']:<4}"
              f"{(str(poison['stored']) + '/' + str(poison['expected'])) if poison else '-':>8}  {order_text}")
    print("  (points; lost: logged before any kill window and missing; window: missing from a kill's grace window, "
          "allowed; gens: generation records stored/logged)")
    windows = result["windows"]
    if windows:
        print("  kill windows: " + "; ".join(f"{w['kind']} at {w['t_s']} s ({', '.join(w['incarnations'])})"
                                             for w in windows))
    named = {}
    for name, row in result["trackers"].items():
        for line in row.get("named", []):
            named.setdefault((line["what"], line.get("sender")), []).append(f"{name} {line['named']}/{line['missing']}")
    if named:
        print("  the report's losses against what is missing (named/missing records, per tracker):")
        for (what, sender), cells in named.items():
            print(f"    {what}{f' [{sender}]' if sender else ''}: {', '.join(cells)}")
    print(f"  phases: {json.dumps(result.get('phases', {}))}, wall {result.get('wall_s', '?')} s")
    if result.get("report_summary"):
        print("\n" + result["report_summary"])
    if result["passed"]:
        print(f"\nchaos: PASSED (seed {result['seed']})")
    else:
        print(f"\nchaos: FAILED (seed {result['seed']}); {len(result['failures'])} check(s):")
        for failure in result["failures"]:
            print(f"  - {failure}")
        print(f"replay: {replay_command(settings)}")
    sys.stdout.flush()


def run_chaos(settings: Settings) -> dict[str, Any]:
    """One chaos run with these settings: prints the schedule, runs, checks, prints and writes the result."""
    work = (settings.out / f"seed-{settings.seed}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    chaos = ChaosRun(settings, work)
    print_schedule(settings, chaos.schedule)
    print(f"chaos: work folder {work}", flush=True)
    started = time.monotonic()
    result = chaos.run()
    result["wall_s"] = round(time.monotonic() - started, 1)
    (work / "chaos.json").write_text(json.dumps(result, indent=2, default=str))
    print_result(result, settings)
    print(f"wrote {work / 'chaos.json'}")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        from tracklane.benchmarks.chaos_child import child_main

        return child_main(argv[1:])
    parser = argparse.ArgumentParser(prog="tracklane.benchmarks.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, default=5.0, help="logging time, faults included (default 5)")
    parser.add_argument("--faults", default=",".join(KINDS), help=f"kinds to draw from (default all: {','.join(KINDS)})")
    parser.add_argument("--counts", default="", help="how many of each kind, e.g. lane_kill=3,producer_kill=2 "
                                                    "(default: by the run's length)")
    parser.add_argument("--out", default="tracklane_runs/chaos")
    parser.add_argument("--keys", type=int, default=10, help="trainer keys a step")
    parser.add_argument("--pause", type=float, default=0.05, help="trainer seconds between steps")
    parser.add_argument("--producer-keys", type=int, default=4, help="keys a producer logs a step")
    parser.add_argument("--producer-pause", type=float, default=0.1, help="producer seconds between steps")
    parser.add_argument("--rich-every", type=int, default=25, help="rich records every this many steps")
    parser.add_argument("--grace-margin", type=float, default=0.25,
                        help="a kill's grace window is flush_interval_s + this (s)")
    parser.add_argument("--check", default=",".join(TRACKERS), help="trackers whose stores are checked (default all)")
    parser.add_argument("--mlflow-uri", default=os.environ.get("TRACKLANE_TEST_MLFLOW_URI", ""),
                        help="a running MLflow server (default: one is started for the run)")
    args = parser.parse_args(argv)
    counts = dict(counts_for(args.minutes))
    for item in filter(None, args.counts.split(",")):
        kind, _, n = item.partition("=")
        counts[kind] = int(n)
    settings = Settings(seed=args.seed, minutes=args.minutes, kinds=tuple(filter(None, args.faults.split(","))),
                        counts=counts, out=Path(args.out), keys=args.keys, pause=args.pause,
                        producer_keys=args.producer_keys, producer_pause=args.producer_pause, rich_every=args.rich_every,
                        grace_margin_s=args.grace_margin, mlflow_uri=args.mlflow_uri,
                        checked=tuple(filter(None, args.check.split(","))))
    return 0 if run_chaos(settings)["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
