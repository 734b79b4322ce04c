"""The peer a user would write instead of tracklane's async path: a bounded queue and one logging thread.

The shape of open-instruct's ``AsyncWandbLogger`` and of most hand-rolled async loggers: ``log()`` copies
the call onto a ``queue.Queue`` and returns; one daemon thread in the trainer's own process takes each call
and runs tracklane's synchronous pipeline with it (every tracker written in turn, in-process). Same
records, same trackers and the same sink hosts as tracklane's sync path, so the benchmark compares only
where the work happens: on the trainer's thread (sync), on a thread beside it (thread), or in Ray actors
(async).

A full queue blocks the caller (a peer that drops would be measured delivering less).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from tracklane import PipelineReport, Tracking

QUEUE_CALLS = 1024
_STOP = object()


class ThreadedPipe:
    """A synchronous pipeline behind a bounded queue and one thread; the rest of ``Pipe`` passes through."""

    def __init__(self, inner: Any, maxsize: int = QUEUE_CALLS) -> None:
        self._inner = inner
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._drain, name="thread-peer-logger", daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        self._queue.put((self._inner.put, item))

    def put_bulk(self, item: Any) -> None:
        # Through the same queue: a bulk item written beside the thread would race it for the trackers' rows
        # (wandb ignores a row logged below its newest step).
        self._queue.put((self._inner.put_bulk, item))

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                put, captured = item
                put(captured)
            finally:
                self._queue.task_done()

    def __getattr__(self, name: str) -> Any:  # health, drop_late, wait_ready, lanes, last_step, producer_spec
        return getattr(self._inner, name)

    def flush(self, timeout: float) -> PipelineReport:
        self._queue.join()
        return self._inner.flush(timeout)

    def close(self, exit_code: int, timeout: float) -> PipelineReport:
        self._queue.put(_STOP)
        self._thread.join()
        return self._inner.close(exit_code, timeout)


def thread_tracking(project_name: str, experiment_name: str, default_backend: Any = "console",
                    config: dict | None = None, **kwargs: Any) -> Tracking:
    """A ``Tracking`` on the synchronous path whose calls go through a ``ThreadedPipe``; same arguments."""
    config = config or {}
    trainer = {**(config.get("trainer") or {}), "log_async": False}
    tracking = Tracking(project_name, experiment_name, default_backend, config={**config, "trainer": trainer}, **kwargs)
    # Tracking binds its pipe's puts once (log() is the hot path): all three are swapped together.
    tracking._pipe = ThreadedPipe(tracking._pipe)
    tracking._put, tracking._put_bulk = tracking._pipe.put, tracking._pipe.put_bulk
    return tracking
