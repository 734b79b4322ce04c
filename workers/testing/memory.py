"""Reading back what the ``memory`` test sink got (workers/sinks/memory.py), from any process."""

from __future__ import annotations

import os

from tracklane.core.records import Record
from tracklane.wire.batch import decode_batch


def memory_records(run_id: str, folder: str | None = None) -> list[Record]:
    """Every record the memory sink of run ``run_id`` wrote, in order ([] if it wrote nothing).

    ``folder`` is ``trainer.memory_sink.dir`` when the run set one.
    """
    from tracklane.workers.sinks.memory import FRAME_HEADER, RECORDS_FILE, memory_dir

    try:
        with open(os.path.join(folder or memory_dir(run_id), RECORDS_FILE), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    records: list[Record] = []
    offset = 0
    while offset < len(data):
        (size,) = FRAME_HEADER.unpack_from(data, offset)
        offset += FRAME_HEADER.size
        records += decode_batch(data[offset:offset + size]).records
        offset += size
    return records
