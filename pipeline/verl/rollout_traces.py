"""verl's rollout traces through tracklane, in every process of the job that traces (``patch``, by the drop-in).

verl 0.9.1 traces its agent-loop workers' calls (``rollout_trace_op`` on the agent loops, tools and generate calls;
``verl/utils/rollout_trace.py``) straight to the backend of ``actor_rollout_ref.rollout.trace.backend`` (mlflow,
trackio, weave), synchronously and from every worker. With the drop-in, verl's own code still decides what and when
to trace (its sampling, its attributes, its rendering), and each trace becomes a tracklane record instead:

- ``RolloutTraceConfig.init`` keeps verl's settings but puts verl on its trackio path, the one that hands each
  finished call to one function (``_log_trackio_trace``); that function renders the call as verl's trackio
  ``Trace`` (messages and metadata) for any backend, so tracklane stores what verl would, as verl renders it.
- That function is replaced by ``TraceForwarder.record``: verl's rendering runs with a client that keeps the call,
  and the trace goes to the run's posted producer (shipping/run_post.py), addressed to the tracker verl would have
  used and to the file tracker (``tracklane view`` reads it there). Spooled, shipped asynchronously, exactly once,
  delivered by rank 0 if the worker dies.
- The call's start: verl's trackio path reports a call when it ends; the flag its wrappers read first
  (``_trace_enabled``) is wrapped so each traced call's start time is kept (a stack per task).
- ``RLInsightLogger.trace_state`` / ``trace_span`` (with ``VERL_RL_INSIGHT_ENABLE=1``) become spans of the same run.

The run is looked up at the first trace (verl's workers start before the trainer's ``Tracking``): traces wait for
it, at most ``PENDING_MAX`` of them; if none is posted within ``WAIT_S`` (a synchronous ``Tracking``, a run without
the drop-in on rank 0), verl's own path takes over and the traces that waited are counted and reported as lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from tracklane.shipping import run_post

log = logging.getLogger("tracklane")

TRACE_MODULE = "verl.utils.rollout_trace"
FILE = "file"
STORES_TRACES = ("mlflow", "trackio", FILE)
"""Trackers of tracklane that store traces (weave is verl's too, but no tracklane tracker)."""
WAIT_S = 120.0
PENDING_MAX = 10_000
RETRY_S = 1.0


class _StartTimes:
    """Stands in for verl's ``_trace_enabled`` ContextVar: the same answers, and each traced call's start kept."""

    def __init__(self, flag: ContextVar) -> None:
        self.flag = flag
        self._starts: ContextVar[tuple[int, ...]] = ContextVar("tracklane_trace_starts", default=())

    def get(self, *default: Any) -> Any:
        enabled = self.flag.get(*default)
        if enabled:  # verl's wrapper asks first, then runs the call: it starts now
            self._starts.set(self._starts.get()[-63:] + (time.time_ns(),))
        return enabled

    def set(self, value: Any) -> Any:
        return self.flag.set(value)

    def reset(self, token: Any) -> None:
        self.flag.reset(token)

    def pop(self) -> int | None:
        starts = self._starts.get()
        if not starts:
            return None
        self._starts.set(starts[:-1])
        return starts[-1]


@dataclass(slots=True)
class _Kept:
    """verl's ``trackio.Trace(messages=..., metadata=...)``, kept as given."""

    messages: Any = None
    metadata: Any = None


class _KeepingClient:
    """The client verl's trackio rendering logs to: it keeps the one call, per thread."""

    Trace = _Kept

    def __init__(self) -> None:
        self._local = threading.local()

    def log(self, data: dict, step: Any = None) -> None:
        self._local.logged = (data, step)

    def take(self) -> tuple[dict, Any]:
        logged = self._local.__dict__.pop("logged", None)
        if logged is None:
            raise RuntimeError("verl's trace rendering logged nothing")
        return logged


class TraceForwarder:
    """One process's way from verl's traces to the run: its producer, what waits for it, verl's functions."""

    def __init__(self, module: Any, target: str, project: str | None, experiment: str | None) -> None:
        self.module = module
        self.target = target
        self.project, self.experiment = project, experiment
        self.render = module._log_trackio_trace  # verl's own
        self.flag = _StartTimes(module._trace_enabled)
        self.client = _KeepingClient()
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.last_step = 0
        self.lost = 0
        self.producer: Any = None
        self._only: list[str] = []
        self._pending: deque[dict[str, Any]] = deque()
        self._first_wait: float | None = None
        self._next_try = 0.0
        self._lock = threading.Lock()

    # -- verl's trackio path lands here --------------------------------------------------------
    def record(self, op_name: str, inputs: Any, output: Any = None, exception: Any = None) -> None:
        """verl's ``_log_trackio_trace``: render the call as verl does, and log it to the run."""
        end_ns = time.time_ns()
        start_ns = self.flag.pop() or end_ns
        self.render(op_name, inputs, output=output, exception=exception)
        data, step = self.client.take()
        ((key, kept),) = data.items()
        metadata = kept.metadata if isinstance(kept.metadata, dict) else {}
        attributes = self.module._current_trace_attributes()  # made plain by the shipper (numpy ints too)
        self.log(op_name, step, start_ns, end_ns, str(metadata.get("status", "success")),
                 {**attributes, "worker": self.worker}, kept.messages, metadata, key)

    def log(self, name: str, step: Any, start_ns: int, end_ns: int, status: str, attributes: dict,
            messages: Any, metadata: dict, key: str) -> None:
        if isinstance(step, int):
            self.last_step = step
        trace = dict(name=name, step=step if isinstance(step, int) else self.last_step, start_ns=start_ns,
                     end_ns=end_ns, status=status, attributes=attributes, messages=messages, metadata=metadata, key=key)
        with self._lock:
            if self._take_producer():
                self._send(trace)
            elif self.producer is None:
                self._wait(trace)

    # -- the run -------------------------------------------------------------------------------
    def _take_producer(self) -> bool:
        if self.producer is not None:
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + RETRY_S
        producer = run_post.take(self.project, self.experiment)
        if producer is None:
            return False
        self.producer = producer
        backends = list(producer.backends)
        self._only = [name for name in dict.fromkeys((self.target, FILE)) if name in backends] \
            if self.target in STORES_TRACES or FILE in backends else []
        if self.target not in backends:
            log.warning("tracklane: verl traces to %s, which is not one of this run's trackers (%s): its traces go "
                        "to %s", self.target, ", ".join(backends), ", ".join(self._only) or "no tracker (counted)")
        while self._pending:
            self._send(self._pending.popleft())
        return True

    def _send(self, trace: dict[str, Any]) -> None:
        if not self._only:
            self.lost += 1
            return
        self.producer.log_trace(**trace, backend=self._only)

    def _wait(self, trace: dict[str, Any]) -> None:
        now = time.monotonic()
        self._first_wait = self._first_wait or now
        if now - self._first_wait > WAIT_S:
            self._fall_back()
            self.lost += 1
            return
        if len(self._pending) >= PENDING_MAX:
            self._pending.popleft()
            self.lost += 1
        self._pending.append(trace)

    def _fall_back(self) -> None:
        """No run posted: verl's own path from now on; what waited is lost, and said so."""
        self.lost += len(self._pending)
        self._pending.clear()
        log.warning("tracklane: no tracklane run posted for verl's traces within %.0f s (trainer.log_async false, or "
                    "no drop-in on the trainer?); verl traces to %s itself from now on; %d traces lost",
                    WAIT_S, self.target, self.lost)
        unpatch(self.module)
        config = self.module.RolloutTraceConfig.get_instance()
        config._initialized = False
        self.module.RolloutTraceConfig.init(self.project, self.experiment, self.target, config.token2text,
                                            config.max_samples_per_step_per_worker)

    # -- RLInsightLogger's spans ------------------------------------------------------------------
    @contextlib.contextmanager
    def span(self, name: str, attributes: dict) -> Iterator[None]:
        start_ns, status = time.time_ns(), "success"
        try:
            yield
        except BaseException:
            status = "error"
            raise
        finally:
            self.log(name, None, start_ns, time.time_ns(), status, attributes, [], {"status": status}, f"span/{name}")


_FORWARDER: TraceForwarder | None = None


def forwarder() -> TraceForwarder | None:
    """This process's forwarder, once verl's trace config was initialised through tracklane."""
    return _FORWARDER


def patch(module: Any) -> None:
    """Route ``module`` (verl's ``verl.utils.rollout_trace``) through tracklane in this process (idempotent)."""
    config_class = getattr(module, "RolloutTraceConfig", None)
    if config_class is None or not all(hasattr(module, n) for n in ("_log_trackio_trace", "_trace_enabled",
                                                                    "_current_trace_attributes")):
        log.warning("tracklane: this verl's rollout_trace is not the one tracklane knows (0.9.1); its traces go "
                    "to the tracker directly")
        return
    if getattr(config_class.init, "__tracklane__", False):
        return
    verl_init = config_class.init.__func__

    def init(cls: Any, project_name: str, experiment_name: str, backend: str, token2text: bool = False,
             max_samples_per_step_per_worker: int | None = None) -> None:
        if backend not in ("mlflow", "trackio", "weave") or not _in_ray_worker():
            return verl_init(cls, project_name, experiment_name, backend, token2text, max_samples_per_step_per_worker)
        config = cls.get_instance()
        if config._initialized:
            return None
        _start(module, backend, project_name, experiment_name)
        config.backend, config.client = "trackio", _FORWARDER.client if _FORWARDER else None
        config.token2text, config.project_name, config.experiment_name = token2text, project_name, experiment_name
        config.max_samples_per_step_per_worker = max_samples_per_step_per_worker
        config._initialized = True
        return None

    init.__tracklane__ = True  # type: ignore[attr-defined]
    module._verl_init = verl_init
    config_class.init = classmethod(init)


def _start(module: Any, target: str, project: str | None, experiment: str | None) -> None:
    global _FORWARDER
    _FORWARDER = TraceForwarder(module, target, project, experiment)
    module._trace_enabled = _FORWARDER.flag
    module._log_trackio_trace = _FORWARDER.record


def unpatch(module: Any) -> None:
    """verl's own functions back in ``module`` (its init stays ours: it falls back to verl's outside Ray)."""
    global _FORWARDER
    if _FORWARDER is not None:
        module._trace_enabled = _FORWARDER.flag.flag
        module._log_trackio_trace = _FORWARDER.render
    verl_init = getattr(module, "_verl_init", None)
    if verl_init is not None:
        module.RolloutTraceConfig.init = classmethod(verl_init)
    _FORWARDER = None


def patch_rl_insight(logger_class: Any) -> None:
    """``RLInsightLogger.trace_state`` / ``trace_span`` as spans of the run, where rl-insight is on and a run is
    posted (else verl's own, which needs the rl_insight package)."""
    if getattr(logger_class, "__tracklane__", False) or not hasattr(logger_class, "trace_state"):
        return
    verl_state, verl_span = logger_class.trace_state.__func__, logger_class.trace_span.__func__

    @contextlib.contextmanager
    def trace_state(cls: Any, state_name: str, *, state_lane_id: Any = None, **labels: Any) -> Iterator[None]:
        spans = _span_forwarder() if cls.enabled() else None
        if spans is None:
            with verl_state(cls, state_name, state_lane_id=state_lane_id, **labels):
                yield
            return
        with spans.span(state_name, {**labels, "state_lane_id": state_lane_id, "worker": spans.worker}):
            yield

    def trace_span(cls: Any, name: str, *, start_time_ns: int, end_time_ns: int,
                   attributes: dict | None = None) -> None:
        spans = _span_forwarder() if cls.enabled() else None
        if spans is None:
            return verl_span(cls, name, start_time_ns=start_time_ns, end_time_ns=end_time_ns, attributes=attributes)
        spans.log(name, None, int(start_time_ns), int(end_time_ns), "success",
                  {**(attributes or {}), "worker": spans.worker}, [], {"status": "success"}, f"span/{name}")
        return None

    logger_class.trace_state = classmethod(trace_state)
    logger_class.trace_span = classmethod(trace_span)
    logger_class.__tracklane__ = True


_SPANS: TraceForwarder | None = None


def _span_forwarder() -> TraceForwarder | None:
    """The process's forwarder for spans: the rollout traces' one, or (a process that traces no rollout, a vLLM
    server's) one to every tracker of the run that stores traces; None outside Ray or with no run posted."""
    global _SPANS
    if _FORWARDER is not None:
        return _FORWARDER
    if not _in_ray_worker():
        return None
    if _SPANS is None:
        module = sys.modules.get(TRACE_MODULE)
        if module is None:
            return None
        _SPANS = TraceForwarder(module, FILE, None, None)
    if _SPANS.producer is None and not _SPANS._take_producer():
        return None
    _SPANS._only = [name for name in _SPANS.producer.backends if name in STORES_TRACES]
    return _SPANS


def _in_ray_worker() -> bool:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:
        return False
