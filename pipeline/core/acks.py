"""What a sink host answers: how far its tracker got and what it could not store.

The lane actor sends an ``Ack`` back for every call, as msgpack of its plain fields (never
pickle: pipeline/wire/ack.py); the trainer side reads it in ``Stream`` and merges it into a ``LaneReport`` in exactly
one place (``LaneReport.take``). The synchronous path builds the same ``Ack`` in-process.
"""

from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import dataclass, field
from typing import Any

from tracklane.core.errors import CodecError


@dataclass(slots=True, kw_only=True)
class SinkCounts:
    """Records (or values) a tracker did not store, and why; cumulative over the lane's life.

    The lane actor saves them with its acknowledgement state, so a restarted actor continues
    the counts instead of starting again from zero.
    """

    failed_records: int = 0
    """Records the tracker rejected after every retry (or that never reached an opened tracker)."""
    unsupported: dict[str, int] = field(default_factory=dict)
    """Records of kinds this tracker cannot store (e.g. artifacts in TensorBoard), by kind."""
    artifacts_missing: int = 0
    """Artifact records whose file was gone when the sink reached them (skipped)."""
    cuts: dict[str, int] = field(default_factory=dict)
    """Values a tracker's own limits cut or left out, by what (``params_truncated``: MLflow param
    values cut to 6000 characters; ``histogram_nonfinite``: NaN/Inf histogram values wandb cannot bin)."""

    def to_plain(self) -> dict[str, Any]:
        return {"failed_records": self.failed_records, "unsupported": dict(self.unsupported),
                "artifacts_missing": self.artifacts_missing, "cuts": dict(self.cuts)}

    @classmethod
    def from_plain(cls, data: Any) -> SinkCounts:
        if not isinstance(data, dict):
            raise CodecError(f"sink counts must be a map, got {type(data).__name__}")
        return cls(failed_records=_int(data.get("failed_records", 0)), unsupported=plain_counts(data.get("unsupported")),
                   artifacts_missing=_int(data.get("artifacts_missing", 0)), cuts=plain_counts(data.get("cuts")))

    def add(self, table: dict[str, int], what: str, n: int) -> None:
        """Add ``n`` to ``table[what]`` (``table`` is ``self.unsupported`` or ``self.cuts``)."""
        table[what] = table.get(what, 0) + n


@dataclass(slots=True, kw_only=True)
class Work:
    """What a lane's host spent, cumulative over its actor's life: where the tracker's ceiling is found."""

    busy_s: float = 0.0
    """Wall time inside batch writes (decode, convert, the SDK, flush)."""
    cpu_s: float = 0.0
    """CPU time of the host's whole process (its threads included: Ray's, the SDK's) and of the processes it
    started (wandb-core)."""
    records: int = 0
    """Records written."""

    def to_plain(self) -> list[float]:
        return [self.busy_s, self.cpu_s, self.records]

    @classmethod
    def from_plain(cls, data: Any) -> Work:
        if not (isinstance(data, list) and len(data) == 3 and all(type(v) in (int, float) for v in data[:2])
                and type(data[2]) is int):
            raise CodecError("malformed acknowledgement: bad work figures")
        return cls(busy_s=float(data[0]), cpu_s=float(data[1]), records=int(data[2]))


@dataclass(slots=True, kw_only=True)
class Ack:
    """One answer of a sink host: how far its tracker got (``handed``) and how much of that its own store already
    holds (``stored``): the two watermarks of pipeline/README.md's glossary."""

    handed: int
    """Sequence number of the last batch handed to the tracker (0 on the synchronous path)."""
    stored: int | None = None
    """The last batch the tracker's store holds, when that is behind ``handed`` (None: the same). wandb's is:
    wandb-core writes its transaction log in 32 KiB blocks, so the newest rows are for a while only in its
    memory. The lane keeps those batches (in the spool) until they are stored, to send again if the actor dies."""
    gap: bool = False
    """The batch was refused: it did not follow the last one handed (the lane re-sends in order)."""
    held: bool = False
    """The tracker is down: the batch was not handed and nothing was counted (the lane sends it again
    after a backoff; it is in the spool meanwhile)."""
    opened: bool = True
    """Whether the tracker is open (False: it failed to open and is retried at the next batch)."""
    error: str | None = None
    """What is wrong with the tracker now (None once a call went through again)."""
    last_error: str | None = None
    last_error_at: float = 0.0
    """The last error the host saw and when (time.time(); 0: none), kept after the tracker recovered."""
    counts: SinkCounts = field(default_factory=SinkCounts)
    where: str = ""
    """Where the tracker writes, in one line for the end-of-run summary."""
    pid: int = 0
    """Process id of the host (the lane actor's, or the trainer's on the synchronous path)."""
    node_id: str = ""
    """Ray node id of the host ("" outside Ray)."""
    handed_by_sender: dict[str, int] = field(default_factory=dict)
    """The last batch of each producer's stream (``Tracking.producer``) its tracker was handed, by sender id."""
    stored_by_sender: dict[str, int] = field(default_factory=dict)
    """The last batch of every sender its tracker's store holds ("": the trainer's), as its state saves it:
    rank 0 keeps a copy in its spool, so a lane on another node's disk re-sends nothing after a resume."""
    work: Work = field(default_factory=lambda: Work())
    """What the host has spent so far (this actor's life)."""
    state_unsaved_since: float = 0.0
    """Since when (time.time(); 0: saved) the lane actor's acknowledgement state could not be saved (a full,
    read-only or failing disk): it is kept in memory and saved again once the disk takes it."""
    output: str = ""
    """The lines the console printed since the last answer, for the trainer's own stdout (a lane actor's stdout
    reaches the driver only through Ray's log forwarding, late and prefixed): the one thing an answer carries
    back besides watermarks and counts."""

    @property
    def stored_seq(self) -> int:
        return self.handed if self.stored is None else min(self.stored, self.handed)

    def for_sender(self, sender: str) -> Ack:
        """This answer (to the trainer's sender "") as its watermarks stand for another ``sender`` of the same
        actor: a bulk stream's (shipping/lane.py), told by a flush or a close."""
        handed = self.handed_by_sender.get(sender, 0)
        stored = self.stored_by_sender.get(sender, 0)
        return dataclasses.replace(self, handed=handed, stored=None if stored >= handed else stored, gap=False,
                                   held=False, output="")


def _int(value: Any) -> int:
    if type(value) is not int:
        raise CodecError(f"a count must be an int, got {reprlib.repr(value)}")  # bounded: value may nest 1000 deep
    return value


def plain_counts(value: Any) -> dict[str, int]:
    """A name -> count map read from plain data (CodecError for anything else)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CodecError(f"counts must be a map, got {type(value).__name__}")
    return {str(key): _int(n) for key, n in value.items()}
