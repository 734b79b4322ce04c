"""``tracklane/*``: the pipeline's vitals (its own figures; "health" is the RL health rules'), logged with each
batch at the trainer's step."""

from __future__ import annotations

from collections.abc import Iterable

from tracklane.capture.convert import Converter
from tracklane.shipping.buffer import RecordBuffer
from tracklane.shipping.spool_keeper import SpoolKeeper
from tracklane.shipping.streams import TrackerLane


def read_vitals(buffer: RecordBuffer, converter: Converter, lanes: Iterable[TrackerLane], late_drops: int,
                   spool: SpoolKeeper | None) -> dict[str, float | int]:
    """The figures as they stand: the buffer, what was dropped, skipped and rejected, each lane's lag (of small
    records; ``bulk_lag_s`` of rollouts, tables and media), backlog, drops and how long its tracker has been out of
    reach (``down_s``);
    ``tracklane/spool_durable`` is 0 while a disk fault keeps new batches off the spool."""
    lanes = list(lanes)
    figures: dict[str, float | int] = {
        "tracklane/queue_bytes": buffer.nbytes,
        "tracklane/dropped_records": buffer.dropped + late_drops + sum(lane.dropped_records for lane in lanes),
        "tracklane/skipped_values": converter.metrics.skipped,
        "tracklane/rejected_records": converter.rejected,
        "tracklane/lag_s": max((lane.lag_s() for lane in lanes), default=0.0),
        "tracklane/bulk_lag_s": max((lane.bulk_lag_s() for lane in lanes), default=0.0),
        "tracklane/dropped_bulk_records": buffer.dropped_bulk,
    }
    if spool is not None:
        figures["tracklane/spool_bytes"] = spool.spool.nbytes
        figures["tracklane/spool_durable"] = int(spool.durable)
    for lane in lanes:
        figures[f"tracklane/lane/{lane.name}/lag_s"] = lane.lag_s()
        figures[f"tracklane/lane/{lane.name}/bulk_lag_s"] = lane.bulk_lag_s()
        figures[f"tracklane/lane/{lane.name}/unstored_bytes"] = lane.unstored_bytes
        figures[f"tracklane/lane/{lane.name}/failed_records"] = lane.report.failed_records
        figures[f"tracklane/lane/{lane.name}/dropped_records"] = lane.dropped_records
        figures[f"tracklane/lane/{lane.name}/down_s"] = lane.down()[0]  # not started, restarting, down or given up
    return figures
