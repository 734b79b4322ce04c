"""What ``Tracking``'s ``log*()`` calls leave in the buffer: one named tuple per call.

Built on the caller's thread, so it holds only what was cheap to take there (the shallow copy
of a metrics dict, or the raw arguments of a rich ``log_*`` call); ``convert.py`` turns it into a
typed record on the shipper thread. A ``NamedTuple`` keeps field access at tuple speed.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Captured(NamedTuple):
    step: Any
    """As the caller passed it; checked to be an int on the shipper side."""
    payload: Any
    """metrics: the dict's shallow copy; a rich kind: the tuple its ``log_*`` call took."""
    time: float
    """``time.time()`` of the call."""
    backend: Any
    """``backend=`` of the call: None (every tracker), a name or a list of names."""
    kind: str
    """"metrics" or a rich record kind (records.py)."""
    size: int
    """Estimated bytes, for the buffer's bound."""
