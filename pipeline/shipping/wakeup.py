"""The shipper thread's one wait: until whichever comes first of every reason it has to wake.

The reasons: a batch's worth of records logged or a flush/finish posted (the buffer's condition is notified;
fewer records wake no one, so log() stays lock-free, and are due within ``flush_interval_s``), an actor answering a
call the loop awaits (each awaited Ray answer's future wakes it when it completes), and the earliest timed reason
(records due by ``flush_interval_s``, a lane's backoff or probe deadline, a barrier's deadline, the
vitals' age), which is the wait's timeout. One condition, as aiokafka's sender waits once for all of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any


class Wakeup:
    def __init__(self, ready: threading.Condition) -> None:
        """``ready``: the buffer's condition, notified by log() once a batch's worth is buffered (or the bound is
        reached) and by a flush or finish being posted."""
        self._ready = ready
        self._futures: dict[Any, Any] = {}  # awaited Ray answer -> its future (kept: it holds the callback)
        self._answered = False  # an answer came since the last wait

    def watch(self, refs: Iterable[Any]) -> None:
        """Wake when any of ``refs`` (Ray object refs) is ready; refs no longer awaited are forgotten."""
        futures = {}
        for ref in refs:
            future = self._futures.get(ref)
            if future is None:
                future = ref.future()  # ~8 µs; its callback runs on Ray's thread when the answer arrives
                future.add_done_callback(self._wake)
            futures[ref] = future
        self._futures = futures

    def _wake(self, _future: Any) -> None:
        with self._ready:
            self._answered = True
            self._ready.notify_all()

    def wait(self, timeout: float) -> None:
        """Until a reason to wake comes, or ``timeout`` seconds."""
        with self._ready:
            if not self._answered and timeout > 0:
                self._ready.wait(timeout)
            self._answered = False
