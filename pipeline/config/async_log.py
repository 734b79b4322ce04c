"""Typed settings read once from a verl-style config: ``trainer.log_async`` and ``trainer.async_log``.

Every tuning key has a default, a docstring and a check; an unknown or ill-typed
key raises ``ConfigError`` naming it, before anything starts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracklane.config.keys import refuse_unknown_keys
from tracklane.core.errors import ConfigError

log = logging.getLogger("tracklane")

OVERFLOW_POLICIES = ("spill", "drop_oldest", "block")
DEFAULT_FINISH_TIMEOUT_S = 60.0


@dataclass(slots=True, kw_only=True)
class AsyncLogConfig:
    """Tuning of the asynchronous pipeline (``trainer.async_log``)."""

    queue_max_bytes: int = 64 * 2**20
    """Bound on records buffered on the trainer side before the shipper takes them (``overflow`` says what passing
    it does)."""
    lane_max_bytes: int = 64 * 2**20
    """Bound on encoded bytes each lane holds that its tracker has not stored."""
    flush_interval_s: float = 0.5
    """The shipper sends a batch at least this often while records wait."""
    busy_flush_interval_s: float = 2.0
    """The interval instead, while the thread that built the pipeline (the trainer's) keeps its CPU busy
    (computes, or waits for a CPU, 80% of the time): each batch costs every lane, Ray and the tracker servers a
    fixed amount of CPU, which a CPU-bound trainer gets back. 0: always ``flush_interval_s``."""
    max_batch_bytes: int = 4 * 2**20
    """A batch is sent as soon as this many (estimated) bytes are buffered."""
    max_inflight_batches: int = 2
    """Batches submitted to a lane's actor and not answered yet; the rest wait on the trainer side."""
    overflow: str = "spill"
    """What a full buffer does. "spill": nothing is dropped and the caller never waits: the shipper spools what
    waits, and what the lanes cannot hold in ``lane_max_bytes`` waits on disk (only a full or failing spool disk
    drops, as "drop_oldest"). "drop_oldest": evict at once. "block": wait up to block_timeout_s, then
    evict. Eviction takes bulk records (rollouts, generations, images, artifacts) first; metrics, params and the
    vitals are never evicted to make room for bulk."""
    block_timeout_s: float = 5.0
    """Longest wait under the "block" policy."""
    compression_level: int = 1
    """zstd level for batches (1 fastest .. 22 smallest). 1: measured on trajectories 510 MB/s at ratio 2.77 where
    3 gave 144 MB/s at 2.76 (it was a third of the shipper's time); on verl scalars 6.7 vs 7.9, as fast."""
    bulk_compression_level: int | None = None
    """zstd level for bulk batches (a dump's rollout rows, tables, media); None: stored uncompressed in the frame
    (its checksum still checked). Measured on 4 KB rollout rows of word-like text: level 1 packs them 3.1x at
    4.0 ms/MB to compress and 0.93 ms/MB to decompress, more than orjson's whole encoding of the rows (~1 ms/MB);
    stored costs 0.36 and 0.15 ms/MB. A dump is written once to the spool and read once by each lane on the same
    disk: set 1..22 where that disk is scarcer than CPU."""
    finish_timeout_s: float = DEFAULT_FINISH_TIMEOUT_S
    """Deadline for finish(): draining every lane and closing every tracker."""
    system_metrics_s: float = 10.0
    """Every this many seconds, one sampler per node hosting the trainer or a producer logs
    ``system/<node>/...`` (CPU, memory, disk, network, GPUs) on the axis ``system/elapsed_s``; 0: off."""
    sink_retries: int = 3
    """Attempts after a tracker write fails, with doubling backoff, before the batch is counted failed."""
    retry_backoff_s: float = 0.5
    """First backoff between retries of a failed tracker write."""
    max_restarts: int = 5
    """Restarts Ray may give a lane actor that died; the batches its tracker had not stored are sent again after each."""
    spool_dir: str | None = None
    """The spool's folder. Every shipped batch is kept there until every tracker stored it: what a crash,
    an outage or a dead actor left undelivered is delivered after ``resume`` or by ``tracklane replay`` (with
    ``log_async: false`` it keeps only what a tracker did not take after its retries). Default:
    ``<trainer.default_local_dir>/tracklane_spool/<run id>`` when the config has ``default_local_dir``, else
    ``$TRACKLANE_SPOOL_ROOT`` or ``./tracklane_spool``, then ``<project>/<experiment>/<run id>``. A resumed run
    finds its spool there; the lane actors keep their state in its ``lanes/`` folder."""
    spool_max_bytes: int = 4 * 2**30
    """Disk bound of the spool. When reached, the oldest segment is deleted even if a tracker has not
    stored it yet; what that loses is counted per tracker and warned about."""
    spool_segment_bytes: int = 8 * 2**20
    """Size at which the spool starts a new segment file (the unit of deletion)."""
    spool_fsync_s: float = 1.0
    """How often the spool is fsynced, for power loss (0: after every batch). A killed process needs
    none: written bytes stay in the page cache."""
    spool_retention_s: float = 0.0
    """Keep segments this long after every tracker stored them (for replay and migration)."""
    max_outage_s: float | None = None
    """How long a tracker that is down is retried before its records are counted failed; None: until
    finish()'s deadline (what is left stays in the spool for ``tracklane replay``)."""
    max_retry_backoff_s: float = 30.0
    """Cap of the doubling backoff between attempts at a tracker that is down."""
    reductions: bool = False
    """Start the run's reduce lane, for ``log(..., reduce=...)`` from rank 0 and any producer: one point per key
    and step, reduced over every producer that logged it (core/reduction.py)."""
    reduce_timeout_s: float = 60.0
    """A step still waiting after this long for a producer that got no further (alive, but not logging) is
    reduced over what it has; what comes later for it is counted late."""
    log_vitals: bool = True
    """Log the pipeline's own figures as ``tracklane/*`` metrics."""
    background_priority: str | int = 10
    """The CPU priority of the lane actors' processes once their trackers are open, so logging yields to the
    trainer: a nice level 1..19 (default 10: a tenth of a normal task's share where both want a CPU), "idle" (Linux
    SCHED_IDLE: they run when a core is free, and on a saturated machine barely at all), or "normal" (0: unchanged).
    Measured under busy processes at 4x the cores (docs/performance.md): the trainer's step the same at 10 and at
    "idle" (within the rounds' noise), the lanes' lag 4-5 s at 10 and 53-68 s, growing, at "idle"; "normal" cost
    the trainer a quarter more. The console's lane (the user's terminal) stays at normal priority. See
    pipeline/node/priority.py."""
    actor_options: dict[str, Any] = field(default_factory=dict)
    """Extra Ray actor options for the lane actors (e.g. {"num_cpus": 0, "resources": {...}})."""
    ray_init: dict[str, Any] = field(default_factory=dict)
    """Arguments for ray.init() when Ray is not running yet (defaults: a Ray of the run's own, address "local", unless
    RAY_ADDRESS names a cluster to join; num_cpus one per lane up to the cores, so their workers start together; no
    dashboard)."""

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            _positive(name, getattr(self, name))
        for name in _NOT_NEGATIVE:
            if name != "max_outage_s" or self.max_outage_s is not None:  # None: until finish()'s deadline
                _positive(name, getattr(self, name), allow_zero=True)
        if 0 < self.system_metrics_s < 1:
            raise ConfigError("trainer.async_log.system_metrics_s must be 0 (off) or at least 1 second (its axis counts "
                              f"whole seconds), got {self.system_metrics_s}")
        self.background_priority = _priority(self.background_priority)
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(f"trainer.async_log.overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.overflow!r}")
        if not 1 <= self.compression_level <= 22:
            raise ConfigError(f"trainer.async_log.compression_level must be in 1..22, got {self.compression_level}")
        if self.bulk_compression_level is not None and not 1 <= self.bulk_compression_level <= 22:
            raise ConfigError("trainer.async_log.bulk_compression_level must be null (stored) or in 1..22, "
                              f"got {self.bulk_compression_level}")
        if self.sink_retries < 0 or self.max_restarts < 0:
            raise ConfigError("trainer.async_log.sink_retries and max_restarts must be >= 0")
        if not isinstance(self.reductions, bool):
            raise ConfigError(f"trainer.async_log.reductions must be true or false, got {self.reductions!r}")
        if self.spool_segment_bytes > self.spool_max_bytes:
            raise ConfigError("trainer.async_log.spool_segment_bytes must not exceed spool_max_bytes")
        if self.max_batch_bytes > min(self.lane_max_bytes, self.queue_max_bytes):
            raise ConfigError("trainer.async_log.max_batch_bytes must not exceed lane_max_bytes or queue_max_bytes")


_POSITIVE = ("queue_max_bytes", "lane_max_bytes", "max_batch_bytes", "max_inflight_batches", "flush_interval_s",
             "finish_timeout_s", "spool_max_bytes", "spool_segment_bytes", "max_retry_backoff_s", "reduce_timeout_s")
_NOT_NEGATIVE = ("busy_flush_interval_s", "block_timeout_s", "retry_backoff_s", "system_metrics_s", "spool_fsync_s",
                 "spool_retention_s", "max_outage_s")


def _positive(name: str, value: Any, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"trainer.async_log.{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"trainer.async_log.{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _priority(value: Any) -> str | int:
    """background_priority as "idle", "normal" or a nice level 1..19 (0 is "normal")."""
    if value in ("idle", "normal"):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 19:
        return "normal" if value == 0 else value
    raise ConfigError(f'trainer.async_log.background_priority must be "idle", "normal" or a nice level 1..19, '
                      f"got {value!r}")


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(AsyncLogConfig)}


REMOVED_KEYS = {
    "gil_switch_interval_s": "its effect measured within noise (1.0019 vs 1.0027 at 50 ms steps, docs/performance.md) "
                             "and it changed the whole process's thread switching",
    "spool": "every shipped batch is on local disk; without the spool the step-time ratio measured the same "
             "(0.992 with and without, docs/reliability.md), and it kept a second mode in every hot class",
    "state_dir": "it only placed the lane actors' state with the spool off; they keep it in the spool's lanes/ "
                 "folder",
    "startup_timeout_s": "a lane no longer gives up on a clock: an actor that is pending (resources, a node that "
                         "joins late, its runtime_env) or slow to open its tracker is waited for, and only one Ray "
                         "reports dead is given up on, its records kept in the spool (docs/reliability.md)",
}
"""Settings that existed and were taken out, with why: a config naming one still runs (warned, ignored)."""

SYSTEM_METRICS_ENV = "TRACKLANE_SYSTEM_METRICS_S"
"""Sets ``system_metrics_s`` where the config does not (e.g. 0 to keep a test suite's runs free of them)."""


def async_log_config(section: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> AsyncLogConfig:
    """Build the config from ``trainer.async_log`` (a plain mapping), refusing unknown keys; ``env`` may
    set what the section does not say (``TRACKLANE_SYSTEM_METRICS_S``)."""
    section = dict(section or {})
    seconds = (env or {}).get(SYSTEM_METRICS_ENV)
    if "system_metrics_s" not in section and seconds:
        try:
            section["system_metrics_s"] = float(seconds)
        except ValueError:
            raise ConfigError(f"{SYSTEM_METRICS_ENV} must be a number of seconds, got {seconds!r}") from None
    for name in sorted(set(section) & set(REMOVED_KEYS)):
        log.warning("tracklane: trainer.async_log.%s was removed (%s); ignored", name, REMOVED_KEYS[name])
        del section[name]
    refuse_unknown_keys(section, _FIELD_TYPES, "trainer.async_log")
    for name in ("actor_options", "ray_init"):
        if name in section and not isinstance(section[name], Mapping):
            raise ConfigError(f"trainer.async_log.{name} must be a mapping, got {section[name]!r}")
        if name in section:
            section[name] = dict(section[name])
    return AsyncLogConfig(**section)


def closing_share_s(timeout: float) -> float:
    """Of a finish() deadline of ``timeout`` seconds, what is kept for the trackers to close properly (the rest
    drains the lanes): a quarter, 15 s at most."""
    return min(0.25 * timeout, 15.0)


def configured_closing_share_s(section: Mapping[str, Any] | None) -> float:
    """``closing_share_s`` of the ``finish_timeout_s`` a ``trainer.async_log`` section says (or its default),
    without checking the section again: ``Tracking`` checked it, and warned once about what it holds."""
    return closing_share_s(float((section or {}).get("finish_timeout_s", DEFAULT_FINISH_TIMEOUT_S)))


def trainer_section(config: Any) -> dict[str, Any]:
    """``config["trainer"]`` as a plain dict ({} when absent), for dicts and OmegaConf alike."""
    try:
        trainer = config["trainer"]
    except (KeyError, TypeError, IndexError):  # OmegaConf's missing-key error is a KeyError; None is no config
        return {}
    if trainer is None:
        return {}
    from omegaconf import DictConfig, OmegaConf

    if isinstance(trainer, DictConfig):
        trainer = OmegaConf.to_container(trainer, resolve=True)
    if not isinstance(trainer, Mapping):
        raise ConfigError(f"config['trainer'] must be a mapping, got {type(trainer).__name__}")
    return dict(trainer)
