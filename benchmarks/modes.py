"""The logging sides a benchmark loop compares, behind one small interface.

    none       no logging at all: the baseline every ratio is measured against
    sync       tracklane with ``log_async: false``: the trackers are written on the caller's thread
    verl       verl's own ``verl.utils.tracking.Tracking`` (+ its ValidationGenerationsLogger and its
               JSON-lines rollout dump, verl's only path for trajectories), when verl can be imported
    thread     the do-it-yourself peer: a bounded queue and one thread running tracklane's sync path
               in the trainer's process (thread_peer.py)
    async      tracklane with ``log_async: true``

Each mode offers ``log``, ``log_trajectories``, ``log_generations`` (the calls the loop times),
``actor_pids`` and ``finish``.
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any

from tracklane.benchmarks.readback import RunPlace

MODES = ["none", "sync", "verl", "thread", "async"]


class NoLogging:
    name = "none"

    def log(self, data: dict, step: int) -> None:
        pass

    def log_trajectories(self, items: list, step: int) -> None:
        pass

    def log_generations(self, samples: list, step: int) -> None:
        pass

    def actor_pids(self) -> dict[str, int]:
        return {}

    def finish(self) -> Any:
        return None


class TracklaneMode:
    """tracklane's ``Tracking``: the sync path, the async path, or the sync path behind a thread."""

    def __init__(self, name: str, trackers: list[str], place: RunPlace, async_log: dict | None = None,
                 record_limits: dict | None = None) -> None:
        from tracklane import Tracking
        from tracklane.benchmarks.thread_peer import thread_tracking

        self.name = name
        config = {"trainer": {"log_async": name == "async",
                              "async_log": {"finish_timeout_s": 600, **(async_log or {})},
                              "record_limits": record_limits or {}}}
        self.tracking = (thread_tracking if name == "thread" else Tracking)(place.project, place.experiment, trackers,
                                                                              config=config)
        if name == "async":
            self.tracking.flush(timeout=300)  # every actor opens its tracker before the timed part
        self.log = self.tracking.log
        self.log_trajectories = self.tracking.log_trajectories
        self.log_generations = self.tracking.log_generations

    def actor_pids(self) -> dict[str, int]:
        if not self.tracking.log_async:
            return {}
        return {name: lane.pid for name, lane in self.tracking.lanes().items()}  # known: flushed at start

    def finish(self) -> Any:
        return self.tracking.finish(timeout=600)


class VerlMode:
    """verl 0.9.1's tracking, used the way its trainer uses it."""

    name = "verl"

    def __init__(self, trackers: list[str], place: RunPlace) -> None:
        from verl.utils.tracking import Tracking, ValidationGenerationsLogger

        logging.getLogger("verl.utils.tracking").setLevel(logging.ERROR)  # one warning per renamed MLflow key
        self.tracking = Tracking(place.project, place.experiment, default_backend=trackers, config={"trainer": {}})
        self._trackers = trackers
        self._generations = ValidationGenerationsLogger()
        self._generations.project_name, self._generations.experiment_name = place.project, place.experiment
        self._dump = place.rollout_dump
        self.log = self.tracking.log

    def log_trajectories(self, items: list, step: int) -> None:
        """verl sends no trajectories to trackers: its trainer dumps them as JSON lines (rollout_data_dir)."""
        lines = [json.dumps({**item, "token_ids": item["token_ids"].tolist(), "step": step}) for item in items]
        with open(self._dump / f"{step}.jsonl", "w") as f:
            f.write("\n".join(lines) + "\n")

    def log_generations(self, samples: list, step: int) -> None:
        self._generations.log(self._trackers, samples, step)

    def actor_pids(self) -> dict[str, int]:
        return {}

    def finish(self) -> Any:
        self.tracking.finish()
        return None


def verl_unavailable() -> str | None:
    """Why verl's Tracking cannot be the peer here, or None when it can."""
    try:
        importlib.import_module("verl.utils.tracking")  # slow, ~7 s here: it imports torch and tensordict
    except Exception as exc:
        return (f"verl not importable ({type(exc).__name__}: {str(exc)[:120]}); install it with "
                "pip install -e '.[bench]' && pip install --no-deps verl==0.9.1")
    return None


def make_mode(name: str, trackers: list[str], place: RunPlace, async_log: dict | None = None,
              record_limits: dict | None = None):
    if name == "none":
        return NoLogging()
    if name == "verl":
        return VerlMode(trackers, place)
    return TracklaneMode(name, trackers, place, async_log, record_limits)
