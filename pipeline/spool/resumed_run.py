"""A verl job resumed from its checkpoint continues the same run in every tracker.

verl's trainer builds ``Tracking(project, experiment, loggers, config)`` with no run id. Restarted with
``trainer.resume_mode=auto`` (its default) it loads the latest checkpoint under ``trainer.default_local_dir`` and goes
on from that step; with ``resume_path``, from ``trainer.resume_from_path``. tracklane keeps the run's id beside the
checkpoints (``<default_local_dir>/tracklane_run.json``); when verl will resume from a checkpoint there, the new
``Tracking`` continues that run: the same MLflow run, wandb and SwanLab resumed, the earlier process's spool
delivered first (what its crash left undelivered), and the steps verl re-runs not logged twice
(logged_steps.py). Read with verl's own rule (``find_latest_ckpt_path``: the step in
``latest_checkpointed_iteration.txt`` whose ``global_step_N`` folder exists), without importing verl.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from tracklane.core.files import write_atomically

log = logging.getLogger("tracklane")

RUN_FILE = "tracklane_run.json"
_LATEST = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker file


def continued_run_id(trainer: Mapping[str, Any], project: str, experiment: str) -> str | None:
    """The id of the run verl's config resumes (None: verl starts from scratch, or no tracklane run is recorded
    where its checkpoint is)."""
    root = _checkpoint_root(trainer)
    if root is None:
        return None
    try:
        with open(os.path.join(root, RUN_FILE)) as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        return None
    run_id = recorded.get("run_id") if isinstance(recorded, dict) else None
    if not isinstance(run_id, str) or (recorded.get("project"), recorded.get("experiment")) != (project, experiment):
        return None
    log.info("tracklane: verl resumes from its checkpoint in %s: continuing run %s", root, run_id)
    return run_id


def remember_run(trainer: Mapping[str, Any], project: str, experiment: str, run_id: str) -> None:
    """Record the run's id beside verl's checkpoints, for the job that resumes from them."""
    if "resume_mode" not in trainer or not trainer.get("default_local_dir"):
        return  # not verl's trainer config, or no checkpoint folder
    folder = os.path.abspath(str(trainer["default_local_dir"]))
    text = json.dumps({"run_id": run_id, "project": project, "experiment": experiment})
    try:
        os.makedirs(folder, exist_ok=True)
        write_atomically(os.path.join(folder, RUN_FILE), text.encode())
    except OSError as exc:  # the run goes on; a resume of it starts a new tracker run
        log.warning("tracklane: cannot record the run id in %s (%s); a resumed job will start a new run", folder, exc)


def _checkpoint_root(trainer: Mapping[str, Any]) -> str | None:
    """The folder of the checkpoint verl's trainer will load, as its ``_load_checkpoint`` finds it (None: none)."""
    mode = trainer.get("resume_mode")
    if mode == "auto":
        folder = trainer.get("default_local_dir")
        if not folder:
            return None
        folder = os.path.abspath(str(folder))
        try:
            with open(os.path.join(folder, _LATEST), "rb") as handle:
                step = int(handle.read().decode())
        except (OSError, ValueError):
            return None
        return folder if os.path.exists(os.path.join(folder, f"global_step_{step}")) else None
    if mode == "resume_path":
        path = trainer.get("resume_from_path")
        if not isinstance(path, str) or "global_step_" not in path:
            return None
        return os.path.dirname(os.path.abspath(path).rstrip(os.sep))
    return None
