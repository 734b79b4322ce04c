"""``Tracking``: a drop-in for ``verl.utils.tracking.Tracking``.

Same constructor, ``log(data, step, backend=None)`` and ``finish(exit_code)``; plus
``flush(timeout)``, a context manager, and finishing at interpreter exit.
``config["trainer"]["log_async"]`` picks the path: false (verl's default) calls the
sinks in-process; true hands records to the asynchronous pipeline, and ``log()``
only copies them into a bounded buffer.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import sys
import time
from typing import Any

from workers.sink import BACKENDS

from .backends import backend_names, resolve_backends
from .config import async_log_config, trainer_section
from .params import plain_config
from .records import RunSpec
from .report import PipelineReport
from .values import BYTES_PER_ENTRY

log = logging.getLogger("tracklane")
_now = time.time


class Tracking:
    """Log metrics from the rank-0 trainer to every configured tracker."""

    supported_backend = list(BACKENDS)

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | list[str] = "console",
                 config: Any = None) -> None:
        trainer = trainer_section(config)
        self.log_async = bool(trainer.get("log_async", False))
        self._cfg = async_log_config(trainer.get("async_log"))  # checked even when unused
        self.run = RunSpec(project=project_name, experiment=experiment_name, params=plain_config(config),
                           run_id=secrets.token_hex(6))
        backends = resolve_backends(backend_names(default_backend), self.run, os.environ, trainer)
        self.backends = list(backends)
        if self.log_async:
            from .async_pipeline import AsyncPipeline

            self._pipe: Any = AsyncPipeline(self._cfg, self.run, backends, os.environ)
        else:
            from .sync_fanout import SyncFanout

            self._pipe = SyncFanout({name: cls(self.run, settings) for name, (cls, settings) in backends.items()})
        self._put = self._pipe.put  # bound once: log() is the hot path
        self._report: PipelineReport | None = None
        self._warned_late = False
        self._rejected = 0  # log() calls whose data was not a mapping
        _finish_at_exit(self)

    def log(self, data: dict, step: int, backend: str | list[str] | None = None) -> None:
        """Hand over the metrics of one step. In async mode this is a shallow copy and an append."""
        try:
            if self._report is not None:
                return self._drop_late()
            values = data.copy() if type(data) is dict else dict(data)
            self._put((step, values, _now(), backend, len(values) * BYTES_PER_ENTRY))
        except Exception:  # bad input must never stop the training loop; it is counted
            self._rejected += 1
            log.warning("tracklane: log() could not take data of type %s at step %r", type(data).__name__, step,
                        exc_info=True)

    def flush(self, timeout: float = 30.0) -> PipelineReport:
        """Wait (up to ``timeout``) until every tracker acknowledged what was logged so far."""
        if self._report is not None:
            return self._report
        report = self._pipe.flush(timeout) if self.log_async else self._pipe.flush()
        report.dropped_records += self._rejected
        return report

    def finish(self, exit_code: int = 0, timeout: float | None = None) -> PipelineReport:
        """Drain with a deadline, close every tracker (exit code / run status) and report. Idempotent."""
        if self._report is not None:
            return self._report
        deadline = self._cfg.finish_timeout_s if timeout is None else timeout
        report = self._pipe.close(exit_code, deadline) if self.log_async else self._pipe.close(exit_code)
        report.dropped_records += self._rejected
        self._report = report
        _unfinished.discard(self)
        if report.complete:
            log.info("%s", report.summary())
        else:
            log.warning("%s", report.summary())
        return report

    def _drop_late(self) -> None:
        if self.log_async:
            self._pipe.drop_late()
        self._report.dropped_records += 1
        if not self._warned_late:
            self._warned_late = True
            log.warning("tracklane: log() after finish(); the record is dropped and counted")

    def __enter__(self) -> "Tracking":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


# -- finishing at interpreter exit ---------------------------------------------------------
# Strong references on purpose: an unfinished Tracking must live until it is finished.
_unfinished: set[Tracking] = set()
_uncaught = False
_hooked = False


def _finish_at_exit(tracking: Tracking) -> None:
    global _hooked
    if not _hooked:
        _hooked = True
        _install_excepthook()
        atexit.register(_finish_all)
    _unfinished.add(tracking)


def _install_excepthook() -> None:
    previous = sys.excepthook

    def hook(*args: Any) -> None:
        global _uncaught
        _uncaught = True  # a crash: finish the runs as failed
        previous(*args)

    sys.excepthook = hook


def _finish_all() -> None:
    for tracking in list(_unfinished):
        tracking.finish(exit_code=1 if _uncaught else 0)
