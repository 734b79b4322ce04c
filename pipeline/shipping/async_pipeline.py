"""Starting the asynchronous path: Ray, the spool, one lane actor per tracker, the buffer and the shipper."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from tracklane.capture.convert import Converter
from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.config.placement import lane_actor_options, lane_env
from tracklane.core.health_rules import LANE as HEALTH_LANE
from tracklane.core.health_rules import RunRules, rule_settings
from tracklane.core.records import RunSpec
from tracklane.core.reduction import LANE as REDUCE_LANE
from tracklane.core.report import LaneInfo, PipelineReport
from tracklane.host.registry import backend_traits
from tracklane.host.sink import CapturedOutput
from tracklane.node.system_metrics import start_node_sampling
from tracklane.node.terminal import TERMINAL
from tracklane.shipping.buffer import RecordBuffer
from tracklane.shipping.hub import ProducerHub, ProducerSpec
from tracklane.shipping.lane import Lanes, lane_info, lane_preload, open_lane
from tracklane.shipping.lane_actor import LaneActor
from tracklane.shipping.orphans import Orphans
from tracklane.shipping.shipper import Shipper
from tracklane.shipping.spool_keeper import SpoolKeeper, SpoolReloader
from tracklane.shipping.stages import (
    EndedStage,
    OrphansStage,
    ProducersStage,
    RunRulesStage,
    Stage,
    StoredCopiesStage,
)
from tracklane.shipping.stream import Stream, StreamSettings
from tracklane.shipping.tracker_calls import TrackerCalls
from tracklane.spool.lane_state import StoredCopies
from tracklane.spool.producers import producers_dir
from tracklane.spool.recovery import Spooling, open_spooling
from tracklane.wire.opening import LaneOpening

_CONSOLE_DRAIN_S = 5.0


def _start_ray(cfg: AsyncLogConfig, lanes: int) -> None:
    import ray

    if ray.is_initialized():
        return
    # RAY_ADDRESS names a running cluster that ray.init() joins: it refuses num_cpus then. Without it, a Ray of this
    # run's own ("local"): ray.init() with no address joins whichever cluster another process last started on this
    # machine (/tmp/ray/ray_current_cluster), another job's or a test suite's.
    joining = os.environ.get("RAY_ADDRESS", "local") not in ("", "local")
    # Ray starts at most num_cpus worker processes at a time: one per lane (up to the cores) opens them together
    # (the lane actors reserve no CPU slot, so nothing else changes)
    start = {} if joining else {"address": "local", "num_cpus": max(1, min(os.cpu_count() or 1, lanes)),
                                "include_dashboard": False}
    ray.init(**{**start, "log_to_driver": True, **cfg.ray_init})


class AsyncPipeline:
    def __init__(self, cfg: AsyncLogConfig, limits: RecordLimits, run: RunSpec,
                 backends: dict[str, tuple[type, dict[str, Any]]], env: Mapping[str, str]) -> None:
        import ray

        _start_ray(cfg, len(backends))
        spooling = open_spooling(cfg, run, {name: settings for name, (_, settings) in backends.items()})
        trainer_node = ray.get_runtime_context().get_node_id()
        self._cfg, self._limits, self._run_id = cfg, limits, run.run_id
        self._traits = backend_traits(backends)
        self._producers = ProducersStage()  # rank 0's stages: _stages
        self._hub: Any = None  # made with the first producer (or judge)
        self._hub_name = ""
        self._lanes = self._make_lanes(backends, cfg, run, spooling, trainer_node, env)
        self.buffer = RecordBuffer(cfg.queue_max_bytes, cfg.max_batch_bytes, cfg.overflow, cfg.block_timeout_s)
        converter = Converter(limits, backends=list(self._lanes), traits=self._traits)
        self._shipper = Shipper(cfg, self.buffer, self._lanes, converter, spool=SpoolKeeper(spooling, cfg.spool_max_bytes),
                                tracker_calls=TrackerCalls(), stages=self._stages(cfg, spooling, backends))
        self._shipper.start()
        # log()'s one call into the pipeline; log_trajectories()'s and the other bulk kinds' (BULK_KINDS)
        self.put, self.put_bulk = self.buffer.put, self.buffer.put_bulk
        self._started = time.time()
        self._sampling = start_node_sampling(self.put, run.run_id, cfg.system_metrics_s, self._started, trainer_node)

    def _make_lanes(self, backends: dict[str, tuple[type, dict[str, Any]]], cfg: AsyncLogConfig, run: RunSpec,
                    spooling: Spooling, trainer_node: str, env: Mapping[str, str]) -> Lanes:
        """In the run's order: the judges last (host/registry.py JUDGES), each emitting into the lanes made before it."""
        self._lanes = {}
        for name, (sink_class, settings) in backends.items():
            self._lanes[name] = self._lane(name, sink_class, settings, cfg, run, spooling, trainer_node, env)
        return self._lanes

    def _lane(self, name: str, sink_class: type, settings: dict[str, Any], cfg: AsyncLogConfig, run: RunSpec,
              spooling: Spooling, trainer_node: str, env: Mapping[str, str]) -> list[Stream]:
        """A tracker's lane actor started (it opens its tracker meanwhile), and its lane, with what the spool holds
        that its tracker lacks."""
        import ray

        state_dir = spooling.state_dir
        judge = name in self._traits["judges"]
        if judge:  # its state beside the lanes' own (workers/sinks/reduce.py, health.py)
            settings = {**settings, "state_path": os.path.join(state_dir, f"{name}.judge")}
        opening = LaneOpening(backend=name, run=run, settings=settings, state_dir=state_dir,
                              sink_retries=cfg.sink_retries, retry_backoff_s=cfg.retry_backoff_s,
                              trainer_node=trainer_node, priority=_priority(sink_class, cfg.background_priority),
                              stored=spooling.stored_copies.get(name, {}), env=lane_env(cfg.actor_options, env))
        options = lane_actor_options(cfg.actor_options, cfg.max_restarts, trainer_node)
        hub = ""
        if judge:  # the lanes made before it, held by the hub for it (no node metrics: run "")
            self._hub_actor().hold_spec.remote(name, self._spec(self._lanes, run=("", 0.0)))  # never waited for
            hub = self._hub_name
        actor = ray.remote(LaneActor).options(**options).remote(name, opening.pack(), hub)
        lane = open_lane(name, actor, StreamSettings.of(cfg), reload=SpoolReloader(spooling.spool),
                           on_output=TERMINAL.write)
        lane_preload(lane, spooling.pending.get(name, ()), through=spooling.first_seq)
        return lane

    def _stages(self, cfg: AsyncLogConfig, spooling: Spooling, backends: dict[str, tuple[type, dict[str, Any]]],
                ) -> list[Stage]:
        """Rank 0's stages (stages.py): its producers and judges, the spools of producers that die (orphans.py,
        under the run's spool), its copy of the lanes' states, what the reduce judge hears of ended producers, and
        rank 0's own health rules."""
        actors = {name: lane[0].actor for name, lane in self._lanes.items()}
        ended = EndedStage(self._producers, REDUCE_LANE) if REDUCE_LANE in self._lanes else None
        orphans = Orphans(producers_dir(spooling.spool.directory), actors, StreamSettings.of(cfg),
                          on_gone=ended.gone if ended is not None else None, others=spooling.others_stored)
        stages: list[Stage] = [self._producers, OrphansStage(orphans), StoredCopiesStage(StoredCopies(spooling.spool.directory))]
        if ended is not None:
            stages.append(ended)
        if (health := backends.get(HEALTH_LANE)) is not None:  # the health judge's settings hold the rules
            stages.append(RunRulesStage(RunRules(rule_settings(health[1].get("rules")))))
        return stages

    def producer_spec(self) -> ProducerSpec:
        """What a producer of this run needs (``Tracking.producer`` makes the picklable handle of it)."""
        return self._spec(self._lanes, run=(self._run_id, self._started))

    def _spec(self, lanes: Lanes, run: tuple[str, float]) -> ProducerSpec:
        """``lanes``' actors, for a producer or a judge."""
        actors = {name: lane[0].actor for name, lane in lanes.items()}
        return ProducerSpec(lanes=actors, hub=self._hub_actor(), cfg=self._cfg, limits=self._limits, run=run,
                            traits=self._traits)

    def _hub_actor(self) -> Any:
        """The run's hub, made with the first producer or judge (a run without either costs no actor); named, so
        a judge's lane actor finds it."""
        import ray

        if self._hub is None:
            self._hub_name = f"tracklane-hub-{uuid.uuid4().hex[:12]}"
            self._hub = ray.remote(num_cpus=0, max_restarts=0)(ProducerHub).options(name=self._hub_name).remote()
            self._producers.watch(self._hub)
        return self._hub

    @property
    def vitals(self) -> dict[str, float | int]:
        return self._shipper.vitals

    def drop_late(self) -> None:
        self._shipper.late_drops += 1

    def last_step(self) -> Any:
        return self.buffer.last_step()

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not all(lane[0].answered for lane in self._lanes.values()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def lanes(self) -> dict[str, LaneInfo]:
        """Each lane's actor as of its latest answer (pid 0 until it answered: ``flush()`` first)."""
        return {name: lane_info(lane) for name, lane in self._lanes.items()}

    def flush(self, timeout: float) -> PipelineReport:
        return self._shipper.flush(timeout)

    def close(self, exit_code: int, timeout: float) -> PipelineReport:
        """Drain, close the trackers and report, all within ``timeout`` (plus the shipper's half second to answer)."""
        deadline = time.monotonic() + timeout
        if self._sampling is not None:
            self._sampling.stop(min(0.5, timeout / 10))
        report = self._shipper.close(exit_code, max(0.0, deadline - time.monotonic()))
        TERMINAL.drain(min(_CONSOLE_DRAIN_S, max(0.0, deadline - time.monotonic())))  # its last lines, then the summary
        console = report.lanes.get("console")
        if console is not None and TERMINAL.dropped_chars:  # stdout did not keep up: said in the summary too
            console.cuts["stdout_chars_dropped"] = TERMINAL.dropped_chars
        return report


def _priority(sink_class: type, background: str | int) -> str | int:
    """A sink that prints to the user's terminal (the console: ``CapturedOutput``) costs little CPU and keeps its
    place at normal priority, so its lines are printed (stored) promptly. A lag there widens what a SIGKILLed
    trainer takes with it: the lines an answer carried that it had not printed yet."""
    return "normal" if issubclass(sink_class, CapturedOutput) else background
