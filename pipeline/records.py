"""The typed records that travel from ``Tracking.log`` to the sinks.

Records hold only plain values (str, int, float, bool, bytes, lists and dicts of
them) so the codec can encode them with msgpack and never needs pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union


@dataclass(slots=True, kw_only=True)
class Metrics:
    """Scalars logged for one step, keys flattened with ``/``."""

    step: int
    """Training step the values belong to."""
    values: dict[str, float | int]
    """Metric name -> number; NaN and +-Inf are kept."""
    time: float
    """Wall-clock time (``time.time()``) at which ``log()`` was called."""
    only: list[str] | None = None
    """Backends this record is for (``log(..., backend=...)``); None means all."""

    kind = "metrics"


Record = Union[Metrics]
"""Every record kind a sink may receive."""

RECORD_TYPES: dict[str, type] = {Metrics.kind: Metrics}
"""Kind tag on the wire -> record class."""


@dataclass(slots=True, kw_only=True)
class Batch:
    """What the shipper sends down every lane: numbered records."""

    seq: int
    """1-based sequence number; lanes acknowledge up to it, in order."""
    created: float
    """Wall-clock time the shipper encoded the batch."""
    records: list[Record] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class RunSpec:
    """What every sink is told when it opens: the run's identity and hyper-parameters."""

    project: str
    experiment: str
    params: dict[str, Any] = field(default_factory=dict)
    """The run's config as nested plain values, secrets already redacted."""
    run_id: str = ""
    """A stable id for this run, shared by all sinks (wandb run id, state folder name)."""
