"""A lane's durable acknowledgement state: the last batch applied, how to re-attach, what was not stored.

Written atomically after every applied batch, so an actor that Ray restarts knows what its
tracker already holds (and skips re-sent batches instead of duplicating them) and continues its
counts of failed and unsupported records instead of starting them again at zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import msgpack

from pipeline.ack import SinkCounts


@dataclass(slots=True, kw_only=True)
class LaneState:
    applied: int = 0
    """Sequence number of the last batch written into the tracker."""
    resume: dict[str, Any] | None = None
    """What the sink's open() returned (e.g. the tracker run id); None before the first open."""
    counts: SinkCounts = field(default_factory=SinkCounts)
    path: str = field(default="", repr=False)

    @classmethod
    def load(cls, path: str) -> LaneState:
        try:
            with open(path, "rb") as handle:
                data = msgpack.unpackb(handle.read(), raw=False)
        except FileNotFoundError:
            return cls(path=path)
        return cls(applied=int(data["applied"]), resume=data.get("resume"),
                   counts=SinkCounts.from_plain(data.get("counts") or {}), path=path)

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(msgpack.packb({"applied": self.applied, "resume": self.resume,
                                        "counts": self.counts.to_plain()}, use_bin_type=True))
        os.replace(tmp, self.path)
