"""Where the lane actors run: the Ray actor options built from ``trainer.async_log.actor_options``.

By default every lane actor is pinned to the trainer's node, because the paths its sink writes
(TensorBoard's folder, the file logger, sqlite, wandb's folder) were resolved there. A placement
moves them, e.g. to a CPU node of the cluster: ``resources`` (a custom resource the node offers,
``{"logging_node": 0.01}``), ``label_selector`` (node labels), ``node_id`` (one node, by its Ray
node id) or a ``scheduling_strategy``. Anything else Ray's actor ``.options()`` takes passes
through (``num_cpus``, ``memory``, ``runtime_env``). The tracker settings of the trainer's environment
(``FORWARDED_ENV_PREFIXES``) go to each lane in its opening (``lane_env``), not in a runtime_env: a
``runtime_env.env_vars`` of the user's wins over them.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from tracklane.core.errors import ConfigError
from tracklane.core.params import is_secret_key

PLACEMENT_KEYS = ("resources", "label_selector", "node_id", "scheduling_strategy")
"""Options that say where the lane actors go; without any of them they stay on the trainer's node."""
_OURS = ("max_restarts", "max_task_retries")  # the lane's ordering and restarts depend on these

# Tracker SDK settings the actors must see even if Ray started before they were set.
FORWARDED_ENV_PREFIXES = ("WANDB_", "MLFLOW_", "SWANLAB_", "TENSORBOARD_", "VERL_")
PROCESS_BOUND_ENV = (
    "WANDB_SERVICE",  # the address of the wandb-core service of wandb.init's process (wandb/sdk/lib/service/service_token.py)
    "WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH",  # the run a sweep agent gave the trainer itself
    "CLEARML_PROC_MASTER_ID", "TRAINS_PROC_MASTER_ID",  # "<pid>:<task>" of the process that ran Task.init
    "_MLFLOW_ACTIVE_MODEL_ID",  # the model mlflow.set_active_model made active in that process
)
"""What the trackers' SDKs write into their own process's environment about that process's sessions (found
by reading where each SDK assigns ``os.environ``). A lane inherits them from the trainer when Ray started
after the trainer used a tracker itself; its SDK would then talk to the trainer's services (a wandb lane to
the trainer's wandb-core, lost when that ends). Never forwarded, and removed in every lane (``forget_process_bound``)."""


def lane_actor_options(actor_options: Mapping[str, Any], max_restarts: int, trainer_node_id: str) -> dict[str, Any]:
    """The ``.options()`` of every lane actor."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    user = dict(actor_options)
    for key in _OURS:
        if key in user:
            raise ConfigError(f"trainer.async_log.actor_options.{key} is tracklane's own (use "
                              f"trainer.async_log.max_restarts; batches are re-sent in order by the lane)")
    secret = sorted(key for key in _user_env_vars(user) if is_secret_key(key))
    if secret:  # Ray keeps runtime_env in its metadata and logs
        raise ConfigError(f"trainer.async_log.actor_options.runtime_env.env_vars names secret(s) {', '.join(secret)}: "
                          f"set them in the environment of the Ray nodes instead, never in the config")
    node_id = user.pop("node_id", None)
    placed = node_id is not None or any(key in user for key in PLACEMENT_KEYS)
    # No runtime_env of ours: an actor with one starts through Ray's setup_worker (a second Python start and Ray
    # import, ~0.3 CPU-s) and cannot take a worker Ray prestarted. The tracker settings travel in the opening
    # instead (lane_env); a user's runtime_env passes through.
    options: dict[str, Any] = {
        "num_cpus": 0,  # lane actors only do I/O
        "max_restarts": max_restarts,
        "max_task_retries": 0,  # re-sending in order is ours to do, not Ray's
        **user,
    }
    if node_id is not None:
        try:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(str(node_id), soft=False)
        except ValueError as exc:
            raise ConfigError(f"trainer.async_log.actor_options.node_id: {exc}") from exc
    elif not placed:  # the sinks' paths are the trainer's: stay on its node
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(trainer_node_id, soft=False)
    return options


def lane_env(actor_options: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """The tracker settings a lane actor puts into its environment before its SDK starts: the trainer's, less
    those the user's ``actor_options.runtime_env.env_vars`` set (Ray gives the actor those, and they win)."""
    own = _user_env_vars(actor_options)
    return {key: value for key, value in forwarded_env(env).items() if key not in own}


def _user_env_vars(actor_options: Mapping[str, Any]) -> dict[str, Any]:
    return dict((actor_options.get("runtime_env") or {}).get("env_vars") or {})


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    # Secrets are not forwarded: Ray keeps runtime_env in its metadata; actors inherit them from Ray's own env.
    return {k: v for k, v in env.items()
            if k.startswith(FORWARDED_ENV_PREFIXES) and k not in PROCESS_BOUND_ENV and not is_secret_key(k)}


def forget_process_bound(environ: MutableMapping[str, str]) -> list[str]:
    """Remove the variables of another process's tracker sessions from this one's ``environ``; returns their names.
    Ray's workers inherit the environment Ray started with, so a lane actor calls it before its SDK starts."""
    return [name for name in PROCESS_BOUND_ENV if environ.pop(name, None) is not None]
