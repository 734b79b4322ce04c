"""``Tracking.logger`` and ``Tracking.console_logger``: verl's names for one backend, as read-only views.

verl's ``Tracking.logger`` maps each backend name to the object that logs there (wandb's module, a
``SummaryWriter`` adapter, its ``LocalLogger`` as ``console_logger``), and callers use its ``log(data, step)``.
Here the trackers' own objects live in the sink hosts: in-process on the synchronous path, in each lane's
Ray actor on the asynchronous one, where no object of this process could stand for them. A view logs
through the pipeline to its one backend, exactly as ``Tracking.log(data, step, backend=name)``, and holds
its ``Tracking`` weakly, so keeping a view never keeps a dropped run from finishing.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

log = logging.getLogger("tracklane")


class BackendView:
    """One backend of a ``Tracking``: ``log(data, step)`` reaches that backend only."""

    __slots__ = ("name", "_tracking")

    def __init__(self, tracking: Any, name: str) -> None:
        self.name = name
        self._tracking = weakref.ref(tracking)

    def log(self, data: dict, step: int) -> None:
        """``Tracking.log(data, step, backend=[name])``: on the asynchronous path a copy into the buffer."""
        tracking = self._owner()
        if tracking is not None:
            tracking.log(data, step, backend=[self.name])

    def flush(self, timeout: float = 30.0) -> None:
        """Wait (up to ``timeout``) until the run's trackers have what was logged (``Tracking.flush``)."""
        tracking = self._owner()
        if tracking is not None:
            tracking.flush(timeout)

    def _owner(self) -> Any:
        tracking = self._tracking()
        if tracking is None:  # its run finished when it was dropped; as log() after finish(), never an exception
            log.warning("tracklane: %r used after its Tracking was dropped (and finished); nothing logged", self)
        return tracking

    def __repr__(self) -> str:
        return f"BackendView({self.name!r})"
