"""A run's producer for the processes nobody can hand one to: verl's agent-loop workers (rollout traces).

``Tracking.producer(name)`` gives a producer to code the user writes. verl makes its agent-loop workers itself, and
their ``RolloutTraceConfig.init`` runs before the trainer's ``Tracking`` exists, so rank 0 posts a producer under a
name the workers can look up: a named Ray actor of no CPU, ``tracklane-run:<project>/<experiment>`` (verl's trace
config names the trainer's project and experiment by default), in the job's namespace. Each worker process that
takes it starts its own shipper and spool (producer.py), so its traces outlive it, and rank 0's ``finish()`` waits
for them. The post is made only when the config names a trace backend (``actor_rollout_ref.rollout.trace.backend``)
or rl-insight is on (``VERL_RL_INSIGHT_ENABLE=1``), and removed at ``finish()``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("tracklane")

PREFIX = "tracklane-run:"
PRODUCER = "rollout_trace"
"""The posted producer's name (its records carry no key prefix)."""
RL_INSIGHT_ENV = "VERL_RL_INSIGHT_ENABLE"


def post_name(project: str, experiment: str) -> str:
    return f"{PREFIX}{project}/{experiment}"


def wants_post(params: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Whether verl's workers will trace: a trace backend in the run's (plain) config, or rl-insight on."""
    trace = _section(_section(_section(params, "actor_rollout_ref"), "rollout"), "trace")
    return bool(trace.get("backend")) or env.get(RL_INSIGHT_ENV) == "1"


def _section(params: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = params.get(name)
    return value if isinstance(value, Mapping) else {}


class RunPost:
    """Holds the run's producer for whoever asks by name (a Ray actor: no CPU, no state but the producer)."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer

    def producer(self) -> Any:
        return self._producer


def post(producer: Any, project: str, experiment: str) -> Any:
    """Post ``producer`` under the run's name; the actor's handle, or None where the name is taken (another live
    run of the same project and experiment in this job: its workers keep theirs, and this run's say so)."""
    import ray

    name = post_name(project, experiment)
    try:
        return ray.remote(num_cpus=0, max_restarts=0)(RunPost).options(name=name).remote(producer)
    except ValueError:  # the name is taken
        log.warning("tracklane: another run posted %r in this Ray job; verl's rollout traces go to that run", name)
        return None


def take(project: str | None, experiment: str | None, timeout: float = 10.0) -> Any:
    """The producer posted under the run's name (or, when none is, the only run posted in this job); None if no
    run is posted yet."""
    import ray

    names = [post_name(project, experiment)] if project and experiment else []
    try:
        if not any(_exists(name) for name in names):
            posted = [n["name"] if isinstance(n, dict) else n for n in ray.util.list_named_actors()]
            names = [name for name in posted if isinstance(name, str) and name.startswith(PREFIX)]
            if len(names) != 1:
                return None
        return ray.get(ray.get_actor(names[0]).producer.remote(), timeout=timeout)
    except Exception as exc:  # the post went with its run, Ray is shutting down: no run to trace into
        log.debug("tracklane: no run to trace into: %s", exc)
        return None


def _exists(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def remove(handle: Any) -> None:
    """End the post (at the run's finish): workers that took the producer keep it."""
    if handle is None:
        return
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # Ray is already shutting down
        pass
