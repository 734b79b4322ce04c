"""``tracklane inspect SPOOL_DIR``: one JSON line per spooled record, with the lanes that acknowledged it."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from tracklane.core.errors import CodecError
from tracklane.core.records import Metrics, Record, Reduction
from tracklane.spool.lane_state import LaneState
from tracklane.spool.manifest import lanes_dir, state_path
from tracklane.spool.segments import Spool
from tracklane.wire.batch import decode_batch


def inspect_spool(directory: str, out: Any) -> int:
    spool = Spool(directory, readonly=True)
    stored = _lane_watermarks(directory)
    for entry in spool.entries():
        payload = spool.read(entry.seq)
        try:
            records = decode_batch(payload).records if payload is not None else None
        except CodecError as exc:
            records, problem = None, str(exc)
        else:
            problem = "unreadable" if records is None else ""
        stored_by = sorted(name for name, seq in stored.items() if seq >= entry.seq)
        pending = sorted(set(stored) - set(stored_by))
        if records is None:
            out.write(json.dumps({"seq": entry.seq, "error": problem, "stored_by": stored_by, "pending": pending}) + "\n")
            continue
        for record in records:
            out.write(json.dumps({"seq": entry.seq, "step": record.step, "kind": record.kind, "keys": _keys(record),
                                  "time": record.time, "only": record.only, "stored_by": stored_by, "pending": pending}) + "\n")
    stats = spool.stats
    print(f"tracklane: {spool.batches} batches in {directory}; {stats.corrupt_frames} corrupt frame(s), "
          f"{stats.missing_batches} missing batch(es), {stats.torn_bytes} torn byte(s)", file=sys.stderr)
    return 0


def _keys(record: Record) -> list[str]:
    if isinstance(record, (Metrics, Reduction)):  # a Reduction: the keys it reduces, or the producers it names
        return sorted(record.values)
    name = getattr(record, "name", None) or getattr(record, "key", None)
    return [name] if name else []


def _lane_watermarks(directory: str) -> dict[str, int]:
    folder = lanes_dir(directory)
    names = sorted(n[:-len(".state")] for n in os.listdir(folder) if n.endswith(".state")) \
        if os.path.isdir(folder) else []
    return {name: LaneState.load(state_path(directory, name)).stored_of("") for name in names}
