"""The SwanLab sink: one SwanLab run per tracklane run, started the way verl starts it.

Written against swanlab 0.10.3, where ``swanlab.init`` returns a ``Run`` object that
is logged to and finished directly. SwanLab allows one active run per process.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Mapping, Sequence

from pipeline.errors import SinkError
from pipeline.records import Metrics, RunSpec
from workers.sink import Sink, import_sdk
from workers.steps import merge_by_step

# verl's defaults (verl/utils/tracking.py); "cloud" is SwanLab's old name for "online".
DEFAULT_MODE = "cloud"
DEFAULT_LOGDIR = "swanlog"
_ONLINE = ("cloud", "online")


class SwanlabSink(Sink):
    """Logs metrics to SwanLab; hyper-parameters go to the run config."""

    name = "swanlab"
    sdk_module = "swanlab"
    extra = "swanlab"

    skipped_nonfinite: ClassVar[int] = 0
    """Always 0: SwanLab stores NaN and +-Inf as given (its cloud upload shows +-Inf as NaN)."""

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        """Mode, log folder and API key from the same variables verl reads."""
        api_key = env.get("SWANLAB_API_KEY") or None
        return {
            "mode": env.get("SWANLAB_MODE") or DEFAULT_MODE,
            "logdir": os.path.abspath(env.get("SWANLAB_LOG_DIR") or DEFAULT_LOGDIR),
            "has_api_key": api_key is not None,
            "api_key": api_key,
        }

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        # Kept apart from self.settings so that nothing printing the settings shows it.
        self._api_key: str | None = self.settings.pop("api_key", None)
        self._run: Any = None  # swanlab Run, None until open() and after close()
        self._where = f"swanlab: {self.settings.get('mode')} run (not started)"

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        swanlab = import_sdk(type(self))
        run_id = (resume or {}).get("id") or self.run.run_id or None
        try:
            self._run = swanlab.init(
                project=self.run.project,
                experiment_name=self.run.experiment,
                # On resume the same config goes again: every init rewrites the run's config
                # snapshot (an empty one if none is given, which would replace the real one on
                # upload), so identical content keeps it intact instead of duplicating it.
                config={"FRAMEWORK": "tracklane", **self.run.params},
                logdir=self.settings["logdir"],
                mode=self.settings["mode"],
                # "allow": re-attach when a run with this id exists (online), else create it.
                id=run_id,
                resume="allow" if run_id else None,
                settings=self._sdk_settings(swanlab),
            )
        except Exception as exc:  # translated at the boundary; the cause is kept
            raise SinkError(f"swanlab.init failed: {exc}") from exc
        self._where = _describe(self._run, self.settings["logdir"])
        return {"id": self._run.id}

    def _sdk_settings(self, swanlab: Any) -> Any:
        # Never prompt for a login (a lane actor has no terminal); the key is only needed
        # to log in to the cloud, so offline and local runs never receive it.
        if self._api_key and self.settings["mode"] in _ONLINE:
            return swanlab.Settings(interactive=False, api_key=self._api_key)
        return swanlab.Settings(interactive=False)

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        if self._run is None:
            raise SinkError("swanlab sink written to before open() or after close()")
        log = self._run.log  # swanlab reports its own logging errors and does not raise them
        for step, values in merge_by_step(records):
            log(values, step=step)

    def close(self, exit_code: int) -> None:
        run, self._run = self._run, None
        if run is None or not run.alive:  # closed already, or finished by swanlab's atexit hook
            return
        if exit_code == 0:
            run.finish(state="success")
        else:
            run.finish(state="crashed", error=f"trainer exited with code {exit_code}")

    def where(self) -> str:
        return self._where


def _describe(run: Any, logdir: str) -> str:
    """One line: where the run lives and the command that shows it."""
    if run.mode == "online":
        return f"swanlab: run {run.id} at {run.url}"
    if run.mode == "local":
        return f"swanlab: local run {run.id} in {run.dir}; view with `swanlab watch {logdir}`"
    if run.mode == "offline":
        return f"swanlab: offline run {run.id} in {run.dir}; upload with `swanlab sync {run.dir}`"
    return "swanlab: disabled, nothing recorded"
