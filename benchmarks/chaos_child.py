"""The chaos run's rank 0: a trainer child that logs, makes 4 producers in Ray actors, and stages the faults that
must happen inside it (a lane actor or a producer SIGKILLed, the poison record), on the orders of
``benchmarks/chaos.py`` read from its stdin.

    python -m tracklane.benchmarks.chaos child --spec JSON

Every point is identifiable: a sender (``train`` or a producer ``p<j>``), a key and a step, and its value
encodes its step (``value_of``), so the end check knows what each tracker must hold. What was logged and when
is written down *before* each ``log()`` call (the trainer on its protocol pipe, each producer in its own file),
so a kill between the two leaves a line for a point that may be missing, never a point without a line.

Protocol lines (the pipe whose fd the spec names), one event each:

    ready <time>                          the trackers are open, logging starts
    log <step> <time>                     the trainer is about to log this step
    event <kind> <target> <time> <json>   a fault staged here (lane_kill, producer_kill, poison) or a producer started
    finished <json>                       finish() returned: its report, every field
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

PROJECT = "tracklane-chaos"
TRAINER_KEY = "train/k{:02d}"
PRODUCER_KEY = "v{:02d}"  # a producer's keys get its name before them: p0/v00
PRODUCER_AXES = (None, None, "rollout/step", "rollout/step")
"""p0 and p1 log on the trainer's step (a step behind it, as rollout workers do), p2 and p3 on their own axis."""
GEN_KEY = "val/generations"
POISON_NAME = "poison/" + "/".join(["x" * 40] * 5)
"""An image name every tracker stores except MLflow: ``MlflowClient.log_image`` names its file
``<name>+step+<step>+timestamp+<ms>+<uuid>.png`` (the name's "/" as "~", one file), 286 bytes here, past the
255 bytes a file name may have, so MLflow refuses the record (OSError ENAMETOOLONG) however often it is sent.
No metric key can do this: the MLflow sink turns every key into one MLflow accepts (``mlflow_key``: MLflow's own
character rule, path rule and 250-character limit). wandb puts each "/" part in a folder of its own, the file
logger one 211-character folder, TensorBoard and SwanLab a tag."""


def value_of(step: int, index: int) -> float:
    """The value of key ``index`` at ``step``: exact in float32 (TensorBoard) for steps below 262,144."""
    return float(step * 64 + index)


def producer_name(index: int) -> str:
    return f"p{index}"


def sample_input(sender: str, step: int, index: int) -> str:
    """The input of a validation sample: who logged it, at which step (read back from every tracker's table)."""
    return f"{sender}|{step}|{index}"


@ray.remote(num_cpus=0, max_restarts=0)
class ProducerActor:
    """A rollout worker: logs its own keys through the producer it was given, on its own thread, until stopped;
    writes ``log <step> <time>`` to its file before each call."""

    def __init__(self, producer: Any, index: int, gen: int, first: int, log_path: str, keys: int, pause: float,
                 rich_every: int) -> None:
        self.producer, self.index, self.gen, self.first = producer, index, gen, first
        self.log_path, self.keys, self.pause, self.rich_every = log_path, keys, pause, rich_every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = first - 1

    def start(self) -> int:
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self._thread.start()
        return os.getpid()

    def _run(self) -> None:
        name = producer_name(self.index)
        with open(self.log_path, "a", buffering=1, encoding="utf-8") as out:
            out.write(f"start {self.gen} {os.getpid()} {time.time():.6f}\n")
            step = self.first
            while not self._stop.is_set():
                out.write(f"log {step} {time.time():.6f}\n")
                self.producer.log({PRODUCER_KEY.format(i): value_of(step, i) for i in range(self.keys)}, step=step)
                if step % self.rich_every == 0:
                    samples = [(sample_input(name, step, i), f"answer {i}", float(step)) for i in range(2)]
                    self.producer.log_generations(samples, step=step)
                if step == self.first:
                    out.write(f"sender {self.producer.sender}\n")
                self._last = step
                step += 1
                time.sleep(self.pause)

    def stop(self, timeout: float) -> dict[str, Any]:
        """Stop logging, flush (every lane has what it logged) and say how far it got."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        flushed = self.producer.flush(timeout)
        with open(self.log_path, "a", encoding="utf-8") as out:
            out.write(f"stopped {self._last} {time.time():.6f}\n")
        return {"last": self._last, "flushed": flushed, "sender": self.producer.sender}


@dataclasses.dataclass
class LiveProducer:
    index: int
    gen: int
    actor: Any
    pid_ref: Any
    log_path: Path


def last_logged_step(paths: list[Path]) -> int | None:
    """The last step a producer's files say it was about to log (its incarnations' files, any order)."""
    last = None
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "log":
                last = max(last if last is not None else -1, int(parts[1]))
    return last


class TrainerChild:
    """The child's state: its Tracking, its producers, the faults it was told to stage."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from tracklane import Tracking

        self.spec = spec
        self.proto = os.fdopen(spec["proto_fd"], "w", buffering=1, encoding="utf-8")
        self.commands: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=self._read_commands, name="chaos-commands", daemon=True).start()
        config = {"trainer": {"log_async": True, "async_log": spec["async_log"]}}
        self.tracking = Tracking(PROJECT, spec["experiment"], spec["backends"], config=config, run_id=spec["run_id"],
                                 resume=spec["resume"])
        self.producers: dict[int, LiveProducer] = {}
        self.pending_lane_kills: list[tuple[str, float]] = []
        self.killed_pids: set[int] = set()
        self.step = spec["first"]

    def say(self, *parts: Any) -> None:
        self.proto.write(" ".join(str(p) for p in parts) + "\n")

    def event(self, kind: str, target: str, **details: Any) -> None:
        self.say("event", kind, target, f"{time.time():.6f}", json.dumps(details))

    def _read_commands(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.commands.put(line.split())
        self.commands.put(["stop"])  # the orchestrator is gone: end the run properly

    # -- producers ---------------------------------------------------------------------------
    def start_producer(self, index: int, gen: int, first: int) -> None:
        name = producer_name(index)
        handle = self.tracking.producer(name, axis=PRODUCER_AXES[index % len(PRODUCER_AXES)])
        log_path = Path(self.spec["producer_dir"]) / f"{name}-g{gen}.log"
        actor = ProducerActor.remote(handle, index, gen, first, str(log_path), self.spec["producer_keys"],
                                     self.spec["producer_pause"], self.spec["rich_every"])
        self.producers[index] = LiveProducer(index, gen, actor, actor.start.remote(), log_path)
        self.event("producer_started", name, gen=gen, first=first)

    def kill_producer(self, index: int) -> None:
        """SIGKILL the producer's process (as a preemption or the OOM killer would), then re-create it: a new actor
        with a fresh producer handle, going on from the step after the last one its predecessor wrote down."""
        live = self.producers[index]
        name = producer_name(index)
        try:
            pid = ray.get(live.pid_ref, timeout=60)
        except Exception as exc:  # it never started: nothing to kill
            self.event("producer_kill_skipped", name, why=f"{type(exc).__name__}: {exc}")
            return
        self.event("producer_kill", name, gen=live.gen, pid=pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10.0)  # its file is final from here
        paths = sorted(Path(self.spec["producer_dir"]).glob(f"{name}-g*.log"))
        last = last_logged_step(paths)
        self.start_producer(index, live.gen + 1, (last if last is not None else -1) + 1)

    def stop_producers(self) -> None:
        flush_s = min(60.0, self.spec["finish_timeout_s"] / 2)
        refs = {index: live.actor.stop.remote(flush_s) for index, live in self.producers.items()}
        for index, ref in refs.items():
            try:
                result = ray.get(ref, timeout=120)
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
            self.event("producer_stopped", producer_name(index), gen=self.producers[index].gen, **result)

    # -- lanes ---------------------------------------------------------------------------------
    def try_lane_kills(self) -> None:
        """SIGKILL each lane actor asked for, once the lane's current actor answered (a lane still restarting from
        an earlier kill waits, at most 90 s). Never blocks the loop."""
        if not self.pending_lane_kills:
            return
        keep = []
        lanes = self.tracking.lanes()
        for name, since in self.pending_lane_kills:
            info = lanes.get(name)
            pid = info.pid if info is not None else 0
            if pid and pid not in self.killed_pids and pid != os.getpid():
                self.killed_pids.add(pid)
                self.event("lane_kill", name, pid=pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            elif time.monotonic() - since > 90:
                self.event("lane_kill_skipped", name, why="the lane's actor did not answer within 90 s")
            else:
                keep.append((name, since))
        self.pending_lane_kills = keep

    # -- the run -------------------------------------------------------------------------------
    def handle(self, command: list[str]) -> bool:
        """Carry out one order; False for ``stop``."""
        if command[0] == "stop":
            return False
        if command[0] == "kill_lane":
            self.pending_lane_kills.append((command[1], time.monotonic()))
        elif command[0] == "kill_producer":
            self.kill_producer(int(command[1].lstrip("p")))
        elif command[0] == "poison":
            image = np.full((8, 8, 3), 200, dtype=np.uint8)
            self.tracking.log_image(POISON_NAME, image, step=self.step)
            self.event("poison", "mlflow", step=self.step, name=POISON_NAME)
        return True

    def log_step(self) -> None:
        spec, step = self.spec, self.step
        self.say("log", step, f"{time.time():.6f}")
        self.tracking.log({TRAINER_KEY.format(i): value_of(step, i) for i in range(spec["keys"])}, step=step)
        if step % spec["rich_every"] == 0:  # what verl's trainer logs now and then besides the scalars
            self.tracking.log_generations([(sample_input("train", step, i), f"answer {i}", float(step))
                                           for i in range(3)], step=step)
            self.tracking.log_trajectories([{"messages": [{"role": "user", "content": f"q {step}"},
                                                          {"role": "assistant", "content": f"a {step}"}],
                                             "rewards": {"score": float(step)}, "meta": {"sample_index": i}}
                                            for i in range(2)], step=step)
            self.tracking.log_histogram("train/advantages", np.arange(64, dtype=np.float64) + step, step=step)
            self.tracking.log_text("train/notes", f"step {step}", step=step)

    def run(self) -> int:
        self.tracking.flush(timeout=180)  # every lane actor up and answering
        self.say("ready", f"{time.time():.6f}")
        for index, (gen, first) in enumerate(zip(self.spec["producer_gens"], self.spec["producer_first"], strict=True)):
            self.start_producer(index, gen, first)
        running = True
        while running:
            while running:
                try:
                    command = self.commands.get_nowait()
                except queue.Empty:
                    break
                running = self.handle(command)
            if not running:
                break
            self.try_lane_kills()
            self.log_step()
            self.step += 1
            time.sleep(self.spec["pause"])
        self.stop_producers()
        report = self.tracking.finish(timeout=self.spec["finish_timeout_s"])
        plain = dataclasses.asdict(report)
        plain["complete"], plain["summary"] = report.complete, report.summary()
        self.say("finished", json.dumps(plain, default=str))
        return 0


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tracklane.benchmarks.chaos child")
    parser.add_argument("--spec", required=True, help="the child's settings as JSON (benchmarks/chaos.py builds it)")
    args = parser.parse_args(argv)
    return TrainerChild(json.loads(args.spec)).run()
