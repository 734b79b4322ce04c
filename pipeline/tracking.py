"""``Tracking``: a drop-in for ``verl.utils.tracking.Tracking``.

Same constructor, ``log(data, step, backend=None)`` and ``finish(exit_code)``; plus
``flush(timeout)``, a context manager, and finishing at interpreter exit.
An uncaught exception leaves its traceback in every unfinished run (text record
``error/traceback`` at the last step logged) before the runs are finished as failed.
``config["trainer"]["log_async"]`` picks the path: false (verl's default) calls the
sinks in-process; true hands records to the asynchronous pipeline, and ``log()``
only copies them into a bounded buffer.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import re
import secrets
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from .backends import BACKENDS, backend_names, resolve_backends
from .config import async_log_config, trainer_section
from .convert import METRICS
from .errors import ConfigError
from .params import plain_config
from .pipe import open_pipe
from .records import RunSpec
from .report import LaneInfo, PipelineReport
from .rich import record_limits
from .spool_manifest import default_spool_dir
from .values import BYTES_PER_ENTRY, as_number

log = logging.getLogger("tracklane")
_now = time.time


class Tracking:
    """Log metrics from the rank-0 trainer to every configured tracker."""

    supported_backend = list(BACKENDS)

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | list[str] = "console",
                 config: Any = None, run_id: str | None = None, resume: bool = False) -> None:
        """``run_id`` names the run in every tracker (random when None; keep ``tracking.run_id`` in your
        checkpoint). ``resume=True`` with that id continues the earlier run: wandb and SwanLab resume the
        id, MLflow reopens the run tagged with it, the file logger appends."""
        trainer = trainer_section(config)
        self.log_async = bool(trainer.get("log_async", False))
        self._cfg = async_log_config(trainer.get("async_log"))  # checked even when unused
        limits = record_limits(trainer.get("record_limits"))
        if resume and not run_id:
            raise ConfigError("Tracking(resume=True) needs the run_id of the run to continue")
        self.run = RunSpec(project=project_name, experiment=experiment_name, params=plain_config(config),
                           run_id=_checked_run_id(run_id) if run_id else secrets.token_hex(6), resume=resume)
        if self._cfg.spool and not self._cfg.spool_dir:
            self._cfg = dataclasses.replace(self._cfg, spool_dir=default_spool_dir(self.run, trainer, os.environ))
        backends = resolve_backends(backend_names(default_backend), self.run, os.environ, trainer)
        self.backends = list(backends)
        self._pipe = open_pipe(self.log_async, self._cfg, limits, self.run, backends, os.environ)
        # Bound once: log() is the hot path. It is fed plain tuples in Captured's field order (captured.py
        # says why: Captured(...) itself costs microseconds on a cold cache).
        self._put: Any = self._pipe.put
        self._max_chars = limits.max_chars  # the converter cuts longer text (head kept): the crash record fits in it
        self._report: PipelineReport | None = None
        self._warned_late = False
        self._rejected = 0  # log*() calls whose data could not even be copied
        _finish_at_exit(self)

    @property
    def run_id(self) -> str:
        """The id every tracker knows this run by; pass it back with ``resume=True`` to continue the run."""
        return self.run.run_id

    def log(self, data: dict, step: int, backend: str | list[str] | None = None) -> None:
        """Hand over the metrics of one step. In async mode this is a shallow copy and an append."""
        try:
            if self._report is not None:
                return self._drop_late()
            values = data.copy() if type(data) is dict else dict(data)
            self._put((step, values, _now(), backend, METRICS, len(values) * BYTES_PER_ENTRY))  # a Captured
        except Exception:  # bad input must never stop the training loop; it is counted
            self._reject("log", data)

    # -- rich records: each takes a cheap copy here; conversion happens off this thread -------
    def log_generations(self, samples: Sequence[Sequence[Any]], step: int, backend: str | list[str] | None = None,
                        key: str = "val/generations") -> None:
        """Validation samples of ``(input, output, score)``, as verl's ValidationGenerationsLogger gets them."""
        try:
            rows = list(samples)
            size = sum(len(row[0]) + len(row[1]) for row in rows if len(row) >= 2) + 64 * len(rows)
            self._rich("generations", step, (rows, key), backend, size)
        except Exception:
            self._reject("log_generations", samples)

    def log_trajectories(self, trajectories: Sequence[Any], step: int, backend: str | list[str] | None = None,
                         key: str = "rollout/trajectories") -> None:
        """Rollout trajectories: dicts (or ``Trajectory``) with messages, tool_calls, rewards, meta, token_ids."""
        try:
            items = list(trajectories)
            self._rich("trajectories", step, (items, key), backend, _trajectories_size(items))
        except Exception:
            self._reject("log_trajectories", trajectories)

    def log_histogram(self, name: str, values: Any, step: int, backend: str | list[str] | None = None) -> None:
        """A distribution (rewards, advantages, KL per token ...): a list, array or tensor of numbers."""
        try:
            copied = values.copy() if hasattr(values, "copy") else list(values)  # arrays change in place
            self._rich("histogram", step, (name, copied), backend, 8 * len(copied) + 64)
        except Exception:
            self._reject("log_histogram", values)

    def log_text(self, name: str, text: str, step: int, backend: str | list[str] | None = None) -> None:
        try:
            self._rich("text", step, (name, text), backend, len(text) + 64)
        except Exception:
            self._reject("log_text", text)

    def log_image(self, name: str, image: Any, step: int, backend: str | list[str] | None = None) -> None:
        """PNG bytes, or an HxW / HxWxC uint8 array (encoded to PNG off the caller's thread)."""
        try:
            if isinstance(image, bytes):
                self._rich("image", step, (name, image), backend, len(image))
            else:
                copied = image.copy()  # arrays change in place
                self._rich("image", step, (name, copied), backend, copied.nbytes)
        except Exception:
            self._reject("log_image", image)

    def log_artifact(self, path: str, name: str | None = None, type: str = "artifact", step: int = 0,
                     backend: str | list[str] | None = None) -> None:
        """A file to store with the run (read by the trackers later: keep it in place until finish())."""
        try:
            absolute = os.path.abspath(path)
            self._rich("artifact", step, (absolute, name or os.path.basename(absolute), type), backend, 256)
        except Exception:
            self._reject("log_artifact", path)

    def _rich(self, kind: str, step: int, payload: tuple, backend: Any, size: int) -> None:
        if self._report is not None:
            return self._drop_late()
        self._put((step, payload, _now(), backend, kind, size))  # a Captured

    def _reject(self, call: str, data: Any) -> None:
        self._rejected += 1
        log.warning("tracklane: %s() could not take %s; skipped and counted", call, type(data).__name__,
                    exc_info=True)

    def health(self) -> dict[str, float | int]:
        """The pipeline's latest ``tracklane/*`` figures (lag, queue bytes, drops), as of the last batch
        shipped; cheap enough for a progress bar. Empty on the synchronous path."""
        return self._pipe.health

    def lanes(self) -> dict[str, LaneInfo]:
        """Where each tracker's sink host runs (name, pid, Ray node id) and what it holds unacknowledged.
        On the asynchronous path a lane's pid is known once its actor answered: ``flush()`` first."""
        return self._pipe.lanes()

    def flush(self, timeout: float = 30.0) -> PipelineReport:
        """Wait (up to ``timeout``) until every tracker acknowledged what was logged so far."""
        if self._report is not None:
            return self._report
        report = self._pipe.flush(timeout)
        report.dropped_records += self._rejected
        return report

    def finish(self, exit_code: int = 0, timeout: float | None = None) -> PipelineReport:
        """Drain with a deadline, close every tracker (exit code / run status) and report. Idempotent."""
        if self._report is not None:
            return self._report
        deadline = self._cfg.finish_timeout_s if timeout is None else timeout
        report = self._pipe.close(exit_code, deadline)
        report.dropped_records += self._rejected
        self._report = report
        _unfinished.pop(self, None)
        if report.complete:
            log.info("%s", report.summary())
        else:
            log.warning("%s", report.summary())
        return report

    def _last_logged_step(self) -> int | None:
        """The step of the newest ``log*()`` call (None if none was logged or its step is no integer)."""
        step = self._pipe.last_step()
        number = as_number(step) if step is not None else None
        return number if type(number) is int else None

    def _log_crash(self, exc_type: Any, trace: str) -> None:
        """The crash record: ``error/traceback`` at the last step logged, through ``log_text``."""
        if self._report is not None:
            return
        step = self._last_logged_step()
        when = f"last step logged: {step}" if step is not None else "no step logged"
        header = f"Uncaught {getattr(exc_type, '__name__', exc_type)} in the trainer (pid {os.getpid()}); {when}\n"
        self.log_text(CRASH_TEXT, _capped(header, trace, min(CRASH_TEXT_MAX_CHARS, self._max_chars)),
                      step=0 if step is None else step)

    def _drop_late(self) -> None:
        assert self._report is not None
        self._pipe.drop_late()
        self._report.dropped_records += 1
        if not self._warned_late:
            self._warned_late = True
            log.warning("tracklane: log() after finish(); the record is dropped and counted")

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


def _checked_run_id(run_id: str) -> str:
    # The strictest of the trackers' id rules (wandb refuses "/", SwanLab wants short plain ids).
    if not isinstance(run_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_id):
        raise ConfigError(f"run_id must be 1-64 letters, digits, '_' or '-', got {run_id!r}")
    return run_id


_SIZE_SAMPLES = 8


def _trajectories_size(items: list) -> int:
    """Rough bytes of a list of trajectories, from at most 8 evenly spaced ones: sizing all 256 of a
    step on the caller's thread cost ~0.3 ms, and the buffer's bound only needs an estimate."""
    if len(items) <= _SIZE_SAMPLES:
        return sum(map(_trajectory_size, items))
    stride = len(items) / _SIZE_SAMPLES
    sampled = sum(_trajectory_size(items[int(i * stride)]) for i in range(_SIZE_SAMPLES))
    return sampled * len(items) // _SIZE_SAMPLES


def _trajectory_size(item: Any) -> int:
    """Rough bytes of one trajectory (text and token ids), for the buffer's bound; kept cheap."""
    if type(item) is not dict:
        return 4096
    size = 256
    for message in item.get("messages") or ():
        size += len(message.get("content") or "")
    token_ids = item.get("token_ids")
    return size if token_ids is None else size + 4 * len(token_ids)


# -- finishing at interpreter exit ---------------------------------------------------------
# Strong references on purpose: an unfinished Tracking must live until it is finished.
_unfinished: dict[Tracking, None] = {}  # insertion-ordered: the newest is last
_uncaught = False
_hooked = False

CRASH_TEXT = "error/traceback"
"""Name of the text record an uncaught exception leaves in every unfinished run."""
CRASH_TEXT_MAX_CHARS = 64 * 1024
"""Longest crash record (and never above ``record_limits.max_chars``); the tail of the traceback is kept."""


def _finish_at_exit(tracking: Tracking) -> None:
    global _hooked
    if not _hooked:
        _hooked = True
        _install_excepthook()
        atexit.register(_finish_all)
    _unfinished[tracking] = None


def _install_excepthook() -> None:
    previous = sys.excepthook

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        global _uncaught
        _uncaught = True  # a crash: finish the runs as failed
        try:
            _log_crash(exc_type, exc, tb)  # queued before atexit's _finish_all drains and closes
        finally:
            previous(exc_type, exc, tb)

    sys.excepthook = hook


def _log_crash(exc_type: Any, exc: Any, tb: Any) -> None:
    """Leave the traceback in every unfinished run; never raises (it runs inside sys.excepthook)."""
    try:
        try:
            trace = "".join(traceback.format_exception(exc_type, exc, tb))
        except Exception:
            trace = f"{getattr(exc_type, '__name__', exc_type)}: (the traceback could not be formatted)\n"
        for tracking in list(_unfinished):
            try:
                tracking._log_crash(exc_type, trace)
            except Exception:
                log.warning("tracklane: the crash record of run %s could not be logged", tracking.run_id,
                            exc_info=True)
    except BaseException:  # even logging may fail this late; the crash itself is reported by the previous hook
        pass


def _capped(header: str, body: str, limit: int) -> str:
    """``header + body`` in at most ``limit`` characters: the header and the end of ``body`` are kept
    (a traceback's last lines name the exception), from a line start, after a note of what was cut."""
    if len(header) + len(body) <= limit:
        return header + body
    note_room = len(f"[... {len(body)} of {len(body)} characters cut ...]\n")
    keep = limit - len(header) - note_room
    if keep <= 0:
        return (header + body)[-limit:] if limit > 0 else ""
    tail = body[-keep:]
    start = tail.find("\n") + 1
    if 0 < start < len(tail):
        tail = tail[start:]
    return f"{header}[... {len(body) - len(tail)} of {len(body)} characters cut ...]\n{tail}"


def active_tracking(project_name: str | None = None, experiment_name: str | None = None) -> Tracking | None:
    """The newest unfinished Tracking for this project and experiment (None matches any)."""
    for tracking in reversed(list(_unfinished)):
        if project_name in (None, tracking.run.project) and experiment_name in (None, tracking.run.experiment):
            return tracking
    return None


def _finish_all() -> None:
    for tracking in list(_unfinished):
        tracking.finish(exit_code=1 if _uncaught else 0)
