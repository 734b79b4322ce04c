"""A lane's acknowledgement state: the last batch its tracker stored, how to re-attach, what was not stored.

Written atomically by the lane actor around every batch it hands its tracker, so an actor that Ray restarts (or
the actor of a resumed run) knows what its tracker already holds, skips re-sent batches instead of duplicating
them, and continues its counts instead of starting again at zero.
Read on the trainer side too, to know what a resumed run still has to deliver.

``pending``/``mark``: before a batch is written, a sink that can undo a partial write (the file
logger, TensorBoard: truncate back to a byte offset) records where it stood; if the actor dies
before ``stored`` moves, its successor rolls the tracker back to that mark and the re-sent batch
lands exactly once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import msgpack

from tracklane.core.acks import SinkCounts
from tracklane.core.files import write_atomically
from tracklane.spool.manifest import stored_copy_path

log = logging.getLogger("tracklane")

BULK = "~bulk"
"""Suffix of the sender id of a bulk stream (shipping/lane.py); "~" is in no producer name."""


def bulk_sender(sender: str) -> str:
    """The sender id of the bulk stream of ``sender`` ("": rank 0's)."""
    return sender + BULK


@dataclass(slots=True, kw_only=True)
class LaneState:
    stored: dict[str, int] = field(default_factory=dict)
    """Per sender ("": the trainer's; a producer's sender id: producers number their own batches), the last batch
    its tracker's store holds."""
    resume: dict[str, Any] | None = None
    """What the sink's open() returned (e.g. the tracker run id); None before the first open."""
    counts: SinkCounts = field(default_factory=SinkCounts)
    pending: int = 0
    """A batch being written when this was saved (0: none)."""
    mark: dict[str, Any] | None = None
    """Where the sink stood before ``pending`` (its ``mark()``), to roll back to."""
    path: str = field(default="", repr=False)

    def stored_of(self, sender: str) -> int:
        return self.stored.get(sender, 0)

    def catch_up(self, stored: dict[str, int]) -> bool:
        """Take rank 0's copy of what the store holds (sender -> last batch) where it is ahead of this state;
        True if it was anywhere."""
        ahead = {sender: seq for sender, seq in stored.items() if seq > self.stored_of(sender)}
        self.stored.update(ahead)
        return bool(ahead)

    @classmethod
    def load(cls, path: str) -> LaneState:
        try:
            with open(path, "rb") as handle:
                data = msgpack.unpackb(handle.read(), raw=False)
            return cls(stored=_stored_map(data), resume=data.get("resume"),
                       counts=SinkCounts.from_plain(data.get("counts") or {}), pending=int(data.get("pending") or 0),
                       mark=data.get("mark"), path=path)
        except FileNotFoundError:
            return cls(path=path)
        except Exception as exc:  # a damaged state must not stop the run: start over, say so
            log.warning("tracklane: lane state %s cannot be read (%s: %s); the lane starts from nothing",
                        path, type(exc).__name__, exc)
            return cls(path=path)

    def save(self) -> None:
        write_atomically(self.path, msgpack.packb({"stored": self.stored, "resume": self.resume,
                                                   "counts": self.counts.to_plain(),
                                                   "pending": self.pending, "mark": self.mark}, use_bin_type=True))


def _stored_map(data: dict[str, Any]) -> dict[str, int]:
    """The ``stored`` map of a saved state; a state saved before it had one holds the trainer's as ``applied``
    and the producers' as ``sources``."""
    if "stored" in data:
        return {str(k): int(v) for k, v in data["stored"].items()}
    return {"": int(data["applied"]), **{str(k): int(v) for k, v in (data.get("sources") or {}).items()}}


class StoredCopies:
    """Rank 0's copy of every lane's state, from the acknowledgements (``Ack.stored_by_sender``): ``lanes/<name>.stored``
    in its spool. A lane actor on another node keeps its own state on that node's disk; a resumed run without
    shared storage hands this copy to the new actor, which then skips what its tracker holds already. Written
    when it changes (no fsync: like the spool's segments, it survives a killed process)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._written: dict[str, dict[str, int]] = {}

    def update(self, lane: str, stored: dict[str, int]) -> None:
        if not stored or self._written.get(lane) == stored:
            return
        state = LaneState(stored=dict(stored), path=stored_copy_path(self._directory, lane))
        try:
            state.save()
        except OSError:  # a full or failing disk: the spool's report says durability is off; kept for next time
            return
        self._written[lane] = stored
