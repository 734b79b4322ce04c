"""What ``Tracking``'s ``log*()`` calls leave in the buffer: one tuple per call, laid out as ``Captured``.

Built on the caller's thread, so it holds only what was cheap to take there (the shallow copy
of a metrics dict, or the raw arguments of a rich ``log_*`` call); ``convert.py`` turns it into a
typed record on the shipper thread.

``Captured`` is the one definition of the layout. The caller's hot path builds a plain tuple in
this field order rather than calling ``Captured(...)``: NamedTuple's ``__new__`` is a Python-level
call, and on the cold cache a trainer's step leaves behind (sleep or GPU wait between ``log()``
calls) it cost log() ~10 us more at p50 in a micro-benchmark and ~4 us at p50 in
``tracklane.benchmarks.overhead --only gpu50ms/full/all``. Everything else may pass ``Captured`` items (a
NamedTuple is a tuple) and reads fields through the names or the indices below.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple


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


# Indices for the hot path (literals, so type checkers know the field types).
STEP: Final = 0
TIME: Final = 2
KIND: Final = 4
SIZE: Final = 5

METRICS: Final = "metrics"
"""``log(...)``: the payload is the dict's shallow copy."""
METRICS_ON_AXIS: Final = "metrics_on_axis"
"""``log(..., axis=...)``: the payload is (values, axis)."""
SYSTEM_METRICS: Final = "system_metrics"
"""A node's system metrics (system_metrics.py): keyed as they are, never prefixed; the step is seconds."""
REDUCE: Final = "reduce"
"""``log(..., reduce=op)``: the payload is (values, op or {key: op}, keep_per_producer, axis)."""
REDUCE_NOTICE: Final = "reduce_notice"
"""Rank 0's notice to the reducer (``Tracking.producer`` declares a name; ``finish``): the payload is (role, values)."""
RECORD: Final = "record"
"""A record made already (a judge's: workers/sinks/reduce.py, health.py): the payload is the record, sent as it is."""
OTHER_AXES: Final = frozenset({METRICS_ON_AXIS, SYSTEM_METRICS, REDUCE_NOTICE})
"""Kinds whose step is not the trainer's."""
assert Captured._fields[STEP] == "step" and Captured._fields[TIME] == "time" and Captured._fields[SIZE] == "size"
assert Captured._fields[KIND] == "kind"
