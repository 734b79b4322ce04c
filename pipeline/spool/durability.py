"""Whether what should be on disk is: a disk fault turns durability off, and the disk itself turns it back on.

A full disk (ENOSPC, EFBIG), a failing one (EIO), one gone read-only (EROFS) or a folder removed under
the writer (ENOENT) must cost durability, never the run: the writer keeps its data in memory, says so
once (a warning with the time it went off), tries the disk again at most every ``retry_s`` and is
durable again from the first write that goes through. Used by the spool (spool_keeper.py) and by each
lane actor's acknowledgement state (lane_actor.py), which live on the same disk.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("tracklane")


@dataclass(slots=True, kw_only=True)
class Durability:
    what: str
    """What is written, for the warnings (``the spool /data/run``)."""
    while_off: str
    """What happens to the data while durability is off, for the warning."""
    retry_s: float = 1.0
    off_since: float = 0.0
    """time.time() when durability went off, while it is off (0: on)."""
    outages: int = 0
    """Times it went off."""
    last_error: str | None = None
    """The last disk error, as ``ENOSPC: [Errno 28] No space left on device: ...``."""
    _off_before_s: float = 0.0
    _off_at: float = field(default=0.0, repr=False)  # monotonic, of the current outage
    _tried_at: float = field(default=0.0, repr=False)  # monotonic, of the last failed try

    @property
    def on(self) -> bool:
        return not self.off_since

    @property
    def off_s(self) -> float:
        """Seconds durability was off, the current outage included."""
        return self._off_before_s + (time.monotonic() - self._off_at if self.off_since else 0.0)

    def due(self) -> bool:
        """Whether to write to disk now: always while on; while off, once every ``retry_s`` (a full disk
        fails fast, but a failing one can take long to say so)."""
        return self.on or time.monotonic() - self._tried_at >= self.retry_s

    def failed(self, exc: OSError) -> None:
        """The disk refused a write: durability is off (one warning per outage)."""
        self._tried_at = time.monotonic()
        self.last_error = f"{errno.errorcode.get(exc.errno or 0, 'OSError')}: {exc}"
        if not self.on:
            return
        self.off_since, self._off_at = time.time(), self._tried_at
        self.outages += 1
        log.warning("tracklane: durability is OFF for %s since %s (%s); %s. The disk is tried again every %g s.",
                    self.what, time.strftime("%H:%M:%S", time.localtime(self.off_since)), self.last_error,
                    self.while_off, self.retry_s)

    def succeeded(self) -> None:
        """A write went through: durability is back on."""
        if self.on:
            return
        off = time.monotonic() - self._off_at
        self._off_before_s += off
        self.off_since = 0.0
        log.warning("tracklane: durability is back on for %s after %.1f s off", self.what, off)
