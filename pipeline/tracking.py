"""``Tracking``: a drop-in for ``verl.utils.tracking.Tracking``.

Same constructor, ``log(data, step, backend=None)`` and ``finish(exit_code)``; plus
``flush(timeout)``, a context manager, and finishing at interpreter exit.
An uncaught exception leaves its traceback in every unfinished run (text record
``error/traceback`` at the last step logged) before the runs are finished as failed.
A ``Tracking`` dropped unfinished (verl's ``RayPPOTrainer.fit`` keeps it in a local and returns without
``finish()``) finishes right there, as verl's own ``Tracking.__del__`` does; the interpreter-exit hook
finishes the ones still alive. ``config["trainer"]["log_async"]`` picks the path: false (verl's default) calls the
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
import threading
import time
import traceback
import weakref
from types import MappingProxyType
from typing import Any

from tracklane.backend_view import BackendView
from tracklane.capture.captured import REDUCE_NOTICE
from tracklane.capture.rich import RecordLimits, record_limits
from tracklane.config.async_log import AsyncLogConfig, async_log_config, trainer_section
from tracklane.config.console import console_config
from tracklane.config.health import health_config
from tracklane.config.prometheus import prometheus_config
from tracklane.core.errors import ConfigError
from tracklane.core.params import plain_config
from tracklane.core.records import RunSpec
from tracklane.core.reduction import DECLARE, FINISH
from tracklane.core.report import LaneInfo, PipelineReport
from tracklane.core.values import as_number
from tracklane.host.registry import BACKENDS, backend_names, resolve_backends, skip_platform, with_judges
from tracklane.log_calls import LogCalls
from tracklane.pipe import open_pipe
from tracklane.producer import Producer
from tracklane.shipping import run_post
from tracklane.spool import resumed_run
from tracklane.spool.manifest import default_spool_dir

log = logging.getLogger("tracklane")


class Tracking(LogCalls):
    """Log metrics from the rank-0 trainer to every configured tracker."""

    supported_backend = list(BACKENDS)

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | list[str] = "console",
                 config: Any = None, run_id: str | None = None, resume: bool = False) -> None:
        """``run_id`` names the run in every tracker (random when None; keep ``tracking.run_id`` in your
        checkpoint; verl's trainer names none: a job that verl resumes from a checkpoint continues the run recorded
        beside it, spool/resumed_run.py). ``resume=True`` with that id continues the earlier run: wandb and SwanLab resume the
        id, MLflow reopens the run tagged with it, the file logger appends."""
        trainer = trainer_section(config)
        self.log_async, self._cfg, limits = _settings(trainer)
        self._health_rules = health_config(trainer.get("health"))
        self.run = _run_spec(project_name, experiment_name, config, run_id, resume, trainer)
        if not self._cfg.spool_dir:
            self._cfg = dataclasses.replace(self._cfg, spool_dir=default_spool_dir(self.run, trainer, os.environ))
        backends = self._resolve_backends(default_backend, trainer)
        self.backends = list(backends)
        self._pipe = open_pipe(self.log_async, self._cfg, limits, self.run, backends, os.environ)
        # Bound once: log() is the hot path. It is fed plain tuples in Captured's field order (captured.py
        # says why: Captured(...) itself costs microseconds on a cold cache).
        self._put: Any = self._pipe.put
        self._put_bulk: Any = self._pipe.put_bulk
        self._max_chars = limits.max_chars  # the converter cuts longer text (head kept): the crash record fits in it
        self._report: PipelineReport | None = None
        self._warned_late = False
        self._rejected = 0  # log*() calls whose data could not even be copied
        self._post = self._post_for_workers()  # verl's workers find this run's producer by name (shipping/run_post.py)
        _finish_at_exit(self)

    def _resolve_backends(self, default_backend: str | list[str],
                          trainer: dict[str, Any]) -> dict[str, tuple[type, dict[str, Any]]]:
        """name -> (sink class, settings) for the backends this platform runs, the reduce lane last; the others
        are warned about and kept in ``_skipped_backends`` for the report."""
        names, self._skipped_backends = skip_platform(backend_names(default_backend))
        # the health rules judge the step metrics in a lane of their own (config/health.py)
        names = with_judges(names, reduce=self._cfg.reductions, health=self._health_rules.enabled)
        for name, why in self._skipped_backends.items():
            log.warning("tracklane: backend %s %s", name, why)
        return resolve_backends(names, self.run, os.environ, trainer)

    def _post_for_workers(self) -> Any:
        """This run's producer, posted where verl's workers look for it by name (None where they will not trace)."""
        if not (self.log_async and run_post.wants_post(self.run.params, os.environ)):
            return None
        producer = Producer(run_post.PRODUCER, self._pipe.producer_spec(), key_prefix="")
        return run_post.post(producer, self.run.project, self.run.experiment)

    @property
    def run_id(self) -> str:
        """The id every tracker knows this run by; pass it back with ``resume=True`` to continue the run."""
        return self.run.run_id

    @property
    def logger(self) -> MappingProxyType[str, BackendView]:
        """verl's ``Tracking.logger``: backend name -> something to ``log(data, step)`` to that backend alone.
        Read-only views (``BackendView``), not the trackers' own objects: those live in the sink hosts, in each
        lane's Ray actor on the asynchronous path; a view logs through the pipeline like ``log(..., backend=name)``."""
        return MappingProxyType({name: BackendView(self, name) for name in self.backends})

    @property
    def console_logger(self) -> BackendView:
        """verl's ``Tracking.console_logger`` (its ``LocalLogger``): the console backend's view; like verl, only
        when ``console`` is one of the backends (AttributeError otherwise)."""
        if "console" not in self.backends:
            raise AttributeError("'Tracking' object has no attribute 'console_logger' (no console backend)")
        return BackendView(self, "console")

    def producer(self, name: str, key_prefix: str | None = None, axis: str | None = None) -> Any:
        """A picklable ``Producer`` that logs into this run from any Ray actor or task (``log_async: true``):
        the same ``log*()`` calls and ``flush(timeout)``, each producer's records in its own order, keys
        prefixed with ``key_prefix`` (default ``"<name>/"``; ``""`` for none). ``finish()`` waits (within its
        deadline) for what live producers shipped before it and reports each of them. ``axis``: what its
        metrics' steps count when not the trainer's step (``rollout/step``, ``param_version``). With
        ``trainer.async_log.reductions`` on, a step's reduction (``log(..., reduce=)``) waits until every process
        logging under ``name`` got past it, ended, or ``reduce_timeout_s`` passed."""
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise ConfigError(f"a producer name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
        if self._report is not None:
            raise ConfigError("Tracking.producer() after finish()")
        if axis is not None and (not isinstance(axis, str) or not re.fullmatch(r"[A-Za-z0-9_./-]{1,128}", axis)):
            raise ConfigError(f"a producer axis must be 1-128 letters, digits, '_', '.', '/' or '-', got {axis!r}")
        spec = self._pipe.producer_spec()
        self._put((0, (DECLARE, {name: 0}), time.time(), None, REDUCE_NOTICE, 64))  # the reducer waits for its name
        return Producer(name, spec, key_prefix=key_prefix, axis=axis)

    def vitals(self) -> dict[str, float | int]:
        """The pipeline's latest ``tracklane/*`` figures (lag, queue bytes, drops), as of the last batch
        shipped; cheap enough for a progress bar. Empty on the synchronous path."""
        return self._pipe.vitals

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait (up to ``timeout``) until every tracker has opened: on the asynchronous path the lane actors
        start and open their trackers in the background (seconds each: Ray's worker, the SDK's import, the
        tracker's run), and what is logged before that waits for them. A trainer that wants its first steps
        on the dashboards at once calls this after its own warm-up, before the first step; the synchronous
        path opened them in the constructor already. Returns False if one is still opening."""
        return self._report is not None or self._pipe.wait_ready(timeout)

    def lanes(self) -> dict[str, LaneInfo]:
        """Where each tracker's sink host runs (name, pid, Ray node id) and what it holds unacknowledged.
        On the asynchronous path a lane's pid is known once its actor answered: ``flush()`` first."""
        return self._pipe.lanes()

    def flush(self, timeout: float = 30.0) -> PipelineReport:
        """Wait (up to ``timeout``) until every tracker acknowledged what was logged so far."""
        if self._report is not None:
            return self._report
        return self._with_own_figures(self._pipe.flush(timeout))

    def finish(self, exit_code: int = 0, timeout: float | None = None) -> PipelineReport:
        """Drain with a deadline, close every tracker (exit code / run status) and report. Idempotent.

        The one way a run ends: ``__exit__``, ``__del__``, the interpreter-exit hook (after ``sys.excepthook``
        logged the crash record) and verl's actor-method wrapper (``finish_left_by``) all call it. It returns
        within ``timeout`` (default ``finish_timeout_s``) plus the report's 0.5 s (barrier.py ``ANSWER_S``)."""
        if self._report is not None:
            return self._report
        deadline = self._cfg.finish_timeout_s if timeout is None else timeout
        run_post.remove(getattr(self, "_post", None))  # no worker starts tracing into a run that is closing
        self._put((0, (FINISH, {}), time.time(), None, REDUCE_NOTICE, 64))  # the reducer completes every open step
        report = self._report = self._with_own_figures(self._pipe.close(exit_code, deadline))
        _unfinished.pop(self, None)
        if report.complete:
            log.info("%s", report.summary())
        else:
            log.warning("%s", report.summary())
        return report

    def _with_own_figures(self, report: PipelineReport) -> PipelineReport:
        """The pipeline's report plus what only this facade knows: calls rejected here, backends skipped."""
        report.dropped_records += self._rejected
        report.skipped_backends = dict(self._skipped_backends)
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

    def __del__(self) -> None:
        """Dropped unfinished: finish like ``finish(exit_code=0)`` (verl's ``Tracking.__del__`` does, and verl's
        ``RayPPOTrainer.fit`` relies on it), or as failed after an uncaught exception. On the asynchronous path
        this drains within ``finish_timeout_s`` before the last reference is gone, so a Ray actor whose method
        returns has delivered everything before its caller can tear it down."""
        if getattr(self, "_report", True) is not None or "_pipe" not in self.__dict__:
            return  # finished already, or the constructor failed before there was anything to finish
        exit_code = 1 if _uncaught else 0
        try:
            if threading.current_thread().name.startswith("tracklane-"):
                # Collected on one of the pipeline's own threads (a cycle that held it): finishing there would
                # wait on that thread itself. A thread of its own finishes it; the interpreter waits for it.
                threading.Thread(target=self.finish, args=(exit_code,), name="finish-dropped-tracking").start()
            else:
                self.finish(exit_code=exit_code)
        except Exception:  # __del__ must not raise; what was not delivered is in the spool and the log
            log.warning("tracklane: finishing dropped run %s failed", self.run.run_id, exc_info=True)

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


def check_settings(config: Any = None, default_backend: str | list[str] = "console") -> None:
    """Raise ``ConfigError`` for what ``Tracking(default_backend=..., config=config)`` would refuse, without
    starting anything, so a trainer can check its config when it loads it: ``trainer.async_log``,
    ``trainer.record_limits``, ``trainer.console``, ``trainer.prometheus``, ``trainer.health`` and the backend names
    (said as ``trainer.logger``)."""
    trainer = trainer_section(config)
    async_log_config(trainer.get("async_log"), os.environ)
    record_limits(trainer.get("record_limits"))
    console_config(trainer.get("console"))
    prometheus_config(trainer.get("prometheus"), os.environ)
    health_config(trainer.get("health"))
    try:
        names, _ = skip_platform(backend_names(default_backend))  # Tracking warns about the skipped ones
    except ConfigError as exc:
        raise ConfigError(f"trainer.logger: {exc}") from exc
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(f"trainer.logger: unknown backend {name!r}; valid backends are: {', '.join(BACKENDS)}")


def _settings(trainer: dict[str, Any]) -> tuple[bool, AsyncLogConfig, RecordLimits]:
    """``trainer``'s ``log_async``, ``async_log`` and ``record_limits``, each checked; ``prometheus`` is checked too."""
    log_async = bool(trainer.get("log_async", False))
    cfg = async_log_config(trainer.get("async_log"), os.environ)  # checked even when unused
    limits = record_limits(trainer.get("record_limits"))
    prometheus_config(trainer.get("prometheus"), os.environ)  # checked even when the backend is not chosen
    return log_async, cfg, limits


def _run_spec(project_name: str, experiment_name: str, config: Any, run_id: str | None, resume: bool,
              trainer: dict[str, Any]) -> RunSpec:
    if resume and not run_id:
        raise ConfigError("Tracking(resume=True) needs the run_id of the run to continue")
    if run_id is None:  # verl's trainer names no run: a job resuming its checkpoint continues the run recorded there
        run_id = resumed_run.continued_run_id(trainer, project_name, experiment_name)
        resume = run_id is not None
    run = RunSpec(project=project_name, experiment=experiment_name, params=plain_config(config),
                  run_id=_checked_run_id(run_id) if run_id else secrets.token_hex(6), resume=resume)
    resumed_run.remember_run(trainer, project_name, experiment_name, run.run_id)
    return run


def _checked_run_id(run_id: str) -> str:
    # The strictest of the trackers' id rules (wandb refuses "/", SwanLab wants short plain ids).
    if not isinstance(run_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_id):
        raise ConfigError(f"run_id must be 1-64 letters, digits, '_' or '-', got {run_id!r}")
    return run_id


# -- finishing at interpreter exit ---------------------------------------------------------
# Weak references: a Tracking dropped by its owner finishes in __del__ (verl's semantics); the exit hook
# finishes those still alive. Insertion-ordered: the newest is last.
_unfinished: weakref.WeakKeyDictionary[Tracking, None] = weakref.WeakKeyDictionary()
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


def has_unfinished() -> bool:
    """Whether a Tracking of this process is still unfinished (cheap: the weak registry's size)."""
    return len(_unfinished) > 0


def finish_left_by(exc: BaseException) -> None:
    """Finish as failed the unfinished Trackings held in the locals of the frames a traceback passes through:
    the runs an exception left behind (a Ray actor method that raised; Ray, not sys.excepthook, gets its
    exception). The crash record is logged first, as for an uncaught exception; never raises."""
    try:
        tb = exc.__traceback__
        trace = "".join(traceback.format_exception(type(exc), exc, tb))
        while tb is not None:
            for value in list(tb.tb_frame.f_locals.values()):
                if type(value) is Tracking and value in _unfinished:
                    value._log_crash(type(exc), trace)
                    value.finish(exit_code=1)
            tb = tb.tb_next
    except Exception:
        log.warning("tracklane: finishing the runs an exception left behind failed", exc_info=True)


def _finish_all() -> None:
    for tracking in list(_unfinished):
        tracking.finish(exit_code=1 if _uncaught else 0)
