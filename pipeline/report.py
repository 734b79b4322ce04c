"""What flush() and finish() return: per-lane figures and what, if anything, was left behind."""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import decode_batch
from .records import Record


@dataclass(slots=True, kw_only=True)
class LaneReport:
    """One tracker's lane at the moment of the report."""

    name: str
    acked_seq: int = 0
    """Last batch the tracker acknowledged."""
    unacked_batches: int = 0
    unacked_records: int = 0
    """Records shipped to this lane and not (yet) acknowledged."""
    dropped_records: int = 0
    """Records this lane dropped because its bound was hit, or because its actor died for good."""
    failed_records: int = 0
    """Records the tracker rejected after every retry."""
    lag_s: float = 0.0
    """Age of the oldest unacknowledged batch."""
    lag_p50_s: float = 0.0
    lag_p99_s: float = 0.0
    """log() -> acknowledgement, over the acknowledged batches (oldest record of each)."""
    unsupported: dict[str, int] = field(default_factory=dict)
    """Records of kinds this tracker cannot store (e.g. artifacts in TensorBoard), by kind."""
    artifacts_missing: int = 0
    """Artifacts skipped because their file was gone when the tracker got to them."""
    restarts: int = 0
    """Times the lane's actor died and was re-attached."""
    error: str | None = None
    where: str = ""
    snapshot: bytes | None = field(default=None, repr=False)
    """A memory sink's records, encoded as a batch."""

    @property
    def complete(self) -> bool:
        return self.unacked_records == 0 and self.dropped_records == 0 and self.failed_records == 0

    def records(self) -> list[Record]:
        """The memory sink's records (empty for other sinks)."""
        return decode_batch(self.snapshot).records if self.snapshot else []

    def line(self) -> str:
        text = (f"{self.name}: acked through batch {self.acked_seq}, {self.unacked_records} unacknowledged, "
                f"{self.dropped_records} dropped, {self.failed_records} failed, lag p50 {self.lag_p50_s * 1e3:.0f} ms "
                f"p99 {self.lag_p99_s * 1e3:.0f} ms")
        if self.unsupported:
            text += ", not storable here: " + ", ".join(f"{n} {kind}" for kind, n in self.unsupported.items())
        if self.artifacts_missing:
            text += f", {self.artifacts_missing} artifact(s) skipped: file missing"
        if self.restarts:
            text += f", {self.restarts} restart(s)"
        if self.error:
            text += f", last error: {self.error}"
        return text


@dataclass(slots=True, kw_only=True)
class PipelineReport:
    """The whole pipeline: producer side plus every lane."""

    lanes: dict[str, LaneReport] = field(default_factory=dict)
    buffered_records: int = 0
    """Records still in the producer's buffer (never shipped)."""
    dropped_records: int = 0
    """Records the producer's buffer dropped (overflow, or logged after finish)."""
    skipped_values: int = 0
    """Metric values skipped because they were not numbers."""
    rejected_records: int = 0
    """Whole records skipped: not a mapping, a bad step, or a malformed rich record."""
    truncated_strings: int = 0
    """Strings cut to ``record_limits.max_chars``."""
    sampled_out: int = 0
    """Generations, trajectories or histogram values left out by ``record_limits``."""
    elapsed_s: float = 0.0
    timed_out: bool = False

    @property
    def complete(self) -> bool:
        """Nothing buffered, dropped, failed or unacknowledged anywhere."""
        return (not self.timed_out and self.buffered_records == 0 and self.dropped_records == 0
                and self.rejected_records == 0 and all(lane.complete for lane in self.lanes.values()))

    def summary(self) -> str:
        head = (f"tracklane: {'complete' if self.complete else 'INCOMPLETE'} in {self.elapsed_s:.2f} s; "
                f"{self.buffered_records} buffered, {self.dropped_records} dropped by the producer, "
                f"{self.skipped_values} non-numeric values skipped, {self.rejected_records} records rejected, "
                f"{self.truncated_strings} strings truncated, {self.sampled_out} samples left out")
        return "\n".join([head, *(f"  {lane.line()}" for lane in self.lanes.values())])
