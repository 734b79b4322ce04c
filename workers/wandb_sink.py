"""Deliver metrics to one Weights & Biases run, started the way verl starts it."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from pipeline.errors import SinkError
from pipeline.records import Metrics, RunSpec
from workers.sink import Sink, import_sdk
from workers.steps import merge_by_step


class WandbSink(Sink):
    """One wandb run per tracker run; ``flush`` is the base no-op (wandb-core writes in the background)."""

    name = "wandb"
    sdk_module = "wandb"
    extra = "wandb"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        # The lane actor may run with another cwd and environment: pin the folder here.
        return {
            "mode": env.get("WANDB_MODE"),
            "dir": os.path.abspath(env.get("WANDB_DIR") or "."),
            "entity": env.get("WANDB_ENTITY"),
            "proxy": trainer.get("wandb_proxy"),
        }

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._run: Any = None  # the wandb Run; kept, since wandb.run is only the latest one
        self._run_dir: str | None = None

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        wandb = import_sdk(type(self))
        proxy = self.settings.get("proxy")
        kwargs: dict[str, Any] = {
            "project": self.run.project,
            "name": self.run.experiment,
            "entity": self.settings.get("entity"),
            "mode": self.settings.get("mode"),
            "dir": self.settings.get("dir"),
            "settings": wandb.Settings(https_proxy=proxy) if proxy else None,
            "reinit": "create_new",  # several runs may live in one process, one after another
        }
        if not resume:
            kwargs.update(id=self.run.run_id or None, config=self.run.params)
        else:  # an actor restart: same run, hyper-parameters already logged
            kwargs.update(id=resume["id"], resume="allow")
        try:
            self._run = wandb.init(**kwargs)
        except wandb.Error as exc:
            raise SinkError(f"wandb.init failed: {exc}") from exc
        self._run_dir = os.path.dirname(self._run.dir)  # run.dir is the run's files/ folder
        return {"id": str(self._run.id)}

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        # wandb keeps the newest step's row open, so a record of the same step in the
        # next batch still merges into it.
        for step, values in merge_by_step(records):
            self._run.log(values, step=step)

    def close(self, exit_code: int) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.finish(exit_code=exit_code)
            self._wait_for_files()

    def _wait_for_files(self) -> None:
        """finish() returns before wandb-core has flushed and closed the run file; its teardown
        waits for that. Skipped while another wandb run of this process is still active."""
        wandb = import_sdk(type(self))
        if wandb.setup().most_recent_active_run is not None:
            return
        try:
            wandb.teardown()
        except SystemExit as exc:  # wandb exits when its service process failed
            raise SinkError(f"wandb service ended with status {exc.code}") from exc

    def where(self) -> str:
        folder = self._run_dir or os.path.join(self.settings.get("dir") or ".", "wandb")
        return f"wandb: run files in {folder} (upload offline runs with `wandb sync {folder}`)"
