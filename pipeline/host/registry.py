"""The edge: backend names -> sink classes and their settings, read once from the environment.

This registry is the only way ``pipeline/`` reaches ``workers/``: by name, imported where it is
used, so ``import tracklane`` loads no sink, no tracker SDK and no Ray actor code.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tracklane.core import health_rules, reduction
from tracklane.core.errors import ConfigError, MissingExtraError
from tracklane.core.records import RunSpec

if TYPE_CHECKING:
    from tracklane.host.sink import Sink
    from tracklane.host.source import Source

# backend name -> "module:Class"; a module is imported only when its backend is used.
BACKENDS: dict[str, str] = {
    "console": "tracklane.workers.sinks.console:ConsoleSink",
    "wandb": "tracklane.workers.sinks.wandb:WandbSink",
    "mlflow": "tracklane.workers.sinks.mlflow:MlflowSink",
    "swanlab": "tracklane.workers.sinks.swanlab:SwanlabSink",
    "tensorboard": "tracklane.workers.sinks.tensorboard:TensorboardSink",
    "file": "tracklane.workers.sinks.file:FileSink",
    "trackio": "tracklane.workers.sinks.trackio:TrackioSink",
    "clearml": "tracklane.workers.sinks.clearml:ClearmlSink",
    "prometheus": "tracklane.workers.sinks.prometheus:PrometheusSink",
}
# Not in verl's list, but selectable by name: the test double (workers/sinks/memory.py).
# The reduce lane's (trainer.async_log.reductions) and the health lane's (trainer.health.enabled): added by
# Tracking, not named in trainer.logger.
EXTRA_SINKS: dict[str, str] = {"memory": "tracklane.workers.sinks.memory:MemorySink",
                                "reduce": "tracklane.workers.sinks.reduce:ReduceSink",
                                "health": "tracklane.workers.sinks.health:HealthSink"}
# source name -> "module:Class": what ``tracklane migrate --from`` reads, and what reads a migration's
# targets back to compare them (pipeline/host/source.py); a module is imported only when used.
SOURCES: dict[str, str] = {
    "mlflow": "tracklane.workers.sources.mlflow:MlflowSource",
    "tensorboard": "tracklane.workers.sources.tensorboard:TensorboardSource",
    "wandb": "tracklane.workers.sources.wandb:WandbSource",
    "file": "tracklane.workers.sources.file:FileSource",
    "trackio": "tracklane.workers.sources.trackio:TrackioSource",
    "spool": "tracklane.workers.sources.spool:SpoolSource",
}

_ALIASES = {"tracking": "wandb"}  # verl's deprecated name for wandb
# verl's backends that are platform services tracklane does not ship. verl builds rl_insight as a no-op unless
# VERL_RL_INSIGHT_ENABLE=1, and vemlp_wandb only where its SDK imports; where verl runs, tracklane runs too:
# nothing goes there, one warning says what to use instead, and the report lists it (``skip_platform``).
PLATFORM_BACKENDS: dict[str, str] = {
    "vemlp_wandb": (
        "the vemlp_wandb backend is Volcano Engine ML Platform's hosted wandb: verl logs in with "
        "volcengine_ml_platform.init(ak=VOLC_ACCESS_KEY_ID, sk=VOLC_SECRET_ACCESS_KEY, region=MLP_TRACKING_REGION) "
        "and needs the volcengine_ml_platform SDK (not on PyPI) and the platform's service; tracklane does not "
        "ship it. Its API is wandb's: use `wandb` (online with WANDB_BASE_URL, or offline and `wandb sync` later)"),
    "rl_insight": (
        "the rl_insight backend sends each scalar as a Prometheus gauge to an RL-Insight server (rl-insight on "
        "PyPI, a Ray hub actor plus Prometheus, Tempo and Grafana started with `rl-insight server start`; verl sends "
        "only when VERL_RL_INSIGHT_ENABLE=1) and keeps no history of its own; tracklane does not ship it. For the "
        "history use `tensorboard`, `mlflow` or `wandb`; for RL-Insight's live dashboards keep verl's own Tracking"),
}
_PLATFORM_SDK = {"vemlp_wandb": "volcengine_ml_platform"}  # verl imports it when the backend is named: no SDK, no run
# A platform backend whose package is not installed, served by one of tracklane's own: name -> (backend, package).
STAND_INS: dict[str, tuple[str, str]] = {"rl_insight": ("prometheus", "rl_insight")}
STAND_IN_NOTE = (
    "served by tracklane's `prometheus` backend instead (verl's rl_insight package is not installed): the same scalars "
    "as gauges (`actor/pg_loss` -> `actor_pg_loss`, the key in a label), on an endpoint for your Prometheus to "
    "scrape (trainer.prometheus.host/port, default 127.0.0.1:9464) instead of pushed to an RL-Insight server; "
    "no traces or spans, and nothing is sent without a scrape")


def skip_platform(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """``names`` without verl's platform backends, and those skipped (name -> why). A platform backend with a
    stand-in (``STAND_INS``) whose package is absent is replaced by it, and said so under "why". A platform backend
    verl could not start either (its SDK missing) is a ConfigError saying what it needs, as verl's ImportError
    would be."""
    kept: list[str] = []
    skipped = {}
    for name in names:
        if name not in PLATFORM_BACKENDS:
            kept.append(name)
            continue
        stand_in, package = STAND_INS.get(name, ("", ""))
        if stand_in and importlib.util.find_spec(package) is None:
            kept.append(stand_in)
            skipped[name] = STAND_IN_NOTE
            continue
        sdk = _PLATFORM_SDK.get(name)
        if sdk is not None and importlib.util.find_spec(sdk) is None:
            raise ConfigError(PLATFORM_BACKENDS[name])
        skipped[name] = f"skipped, not shipped by tracklane, nothing is logged there: {PLATFORM_BACKENDS[name]}"
    return list(dict.fromkeys(kept)), skipped


def load(target: str) -> Any:
    """The object named ``"module:attribute"`` (imports the module)."""
    module_name, _, name = target.partition(":")
    return getattr(importlib.import_module(module_name), name)


def backend_names(default_backend: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Normalise verl's ``default_backend`` / ``trainer.logger``: a name or a list of names."""
    if default_backend is None:
        return []
    names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"backend names must be strings, got {name!r}; valid backends are: {', '.join(BACKENDS)}")
        if name in _ALIASES:
            warnings.warn(f"`{name}` logger is deprecated. use `{_ALIASES[name]}` instead.", DeprecationWarning, stacklevel=3)
            name = _ALIASES[name]
        if name not in out:
            out.append(name)
    return out


def backend_class(name: str) -> type[Sink]:
    """The sink class registered for ``name`` (imports its module, not its SDK)."""
    target = BACKENDS.get(name) or EXTRA_SINKS.get(name)
    if target is None and name in PLATFORM_BACKENDS:  # skip_platform() takes these out first where verl would run
        raise ConfigError(PLATFORM_BACKENDS[name])
    if target is None:
        raise ConfigError(f"unknown backend {name!r}; valid backends are: {', '.join(BACKENDS)}")
    sink_class: type[Sink] = load(target)
    return sink_class


def source_class(name: str) -> type[Source]:
    """The migration source registered for ``name`` (imports its module, not its SDK)."""
    target = SOURCES.get(name)
    if target is None:
        raise ConfigError(f"unknown source {name!r}; valid sources are: {', '.join(SOURCES)}")
    cls: type[Source] = load(target)
    return cls


def check_installed(cls: type[Sink] | type[Source]) -> None:
    """Raise ``MissingExtraError`` naming the pip extra if the tracker SDK is absent."""
    if cls.sdk_module and importlib.util.find_spec(cls.sdk_module) is None:
        raise MissingExtraError(cls.name, cls.sdk_module, cls.extra or cls.name)


def resolve_backends(names: list[str], run: RunSpec, env: Mapping[str, str],
                     trainer: Mapping[str, Any]) -> dict[str, tuple[type[Sink], dict[str, Any]]]:
    """name -> (sink class, settings). Raises ConfigError for an unknown name, MissingExtraError for a missing SDK."""
    classes = {name: backend_class(name) for name in names}  # every name checked before anything starts
    for cls in classes.values():
        check_installed(cls)
    return {name: (cls, cls.resolve(run, env, trainer)) for name, cls in classes.items()}


JUDGES = (health_rules.LANE, reduction.LANE)
"""The judges' backends, last in a run and in this order: each emits into the lanes before it (the health rules
judge the reduced points too)."""


def with_judges(names: list[str], **switched_on: bool) -> list[str]:
    """``names`` with the judges last, in ``JUDGES``' order: those named and those ``switched_on`` (by their names)
    by the config."""
    return [n for n in names if n not in JUDGES] + [j for j in JUDGES if j in names or switched_on.get(j)]


TRAITS = ("takes_pieces", "writes_verl_lines", "judges", "reduces")
"""The sinks' class-level traits (host/sink.py) the trainer side shapes records by."""


def backend_traits(backends: dict[str, tuple[type, dict[str, Any]]]) -> dict[str, frozenset[str]]:
    """Each trait (``TRAITS``) -> the backends whose sink has it."""
    return {trait: frozenset(name for name, (sink_class, _) in backends.items() if getattr(sink_class, trait, False))
            for trait in TRAITS}
