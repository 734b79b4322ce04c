"""``tracklane/*``: the pipeline's vitals (its own figures; "health" is the RL health rules'), logged with each
batch at the trainer's step."""

from __future__ import annotations

from tracklane.capture.convert import Converter
from tracklane.shipping.buffer import RecordBuffer
from tracklane.shipping.lane import Lanes, dropped_records, lane_down, unstored_bytes
from tracklane.shipping.spool_keeper import SpoolKeeper


def read_vitals(buffer: RecordBuffer, converter: Converter, lanes: Lanes, late_drops: int,
                   spool: SpoolKeeper | None) -> dict[str, float | int]:
    """The figures as they stand: the buffer, what was dropped, skipped and rejected, each lane's lag (of small
    records; ``bulk_lag_s`` of rollouts, tables and media), backlog, drops and how long its tracker has been out of
    reach (``down_s``);
    ``tracklane/spool_durable`` is 0 while a disk fault keeps new batches off the spool."""
    figures: dict[str, float | int] = {
        "tracklane/queue_bytes": buffer.nbytes,
        "tracklane/dropped_records": buffer.dropped + late_drops + sum(dropped_records(lane) for lane in lanes.values()),
        "tracklane/skipped_values": converter.metrics.skipped,
        "tracklane/rejected_records": converter.rejected,
        "tracklane/lag_s": max((lane[0].window.lag_s() for lane in lanes.values()), default=0.0),
        "tracklane/bulk_lag_s": max((lane[1].window.lag_s() for lane in lanes.values()), default=0.0),
        "tracklane/dropped_bulk_records": buffer.dropped_bulk,
    }
    if spool is not None:
        figures["tracklane/spool_bytes"] = spool.spool.nbytes
        figures["tracklane/spool_durable"] = int(spool.durable)
    for name, (small, bulk) in lanes.items():
        figures[f"tracklane/lane/{name}/lag_s"] = small.window.lag_s()
        figures[f"tracklane/lane/{name}/bulk_lag_s"] = bulk.window.lag_s()
        figures[f"tracklane/lane/{name}/unstored_bytes"] = unstored_bytes((small, bulk))
        figures[f"tracklane/lane/{name}/failed_records"] = small.report.failed_records
        figures[f"tracklane/lane/{name}/dropped_records"] = dropped_records((small, bulk))
        figures[f"tracklane/lane/{name}/down_s"] = lane_down((small, bulk))[0]  # not started, restarting, down, given up
    return figures
