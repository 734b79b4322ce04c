"""The test double: a sink that keeps every record it gets, optionally slow or failing.

Selected as backend ``"memory"``; configured under ``trainer.memory_sink`` (``delay_s`` per
write, ``fail_writes``, ``fail_open``, ``down_while``, ``store_lag``, ``dir``, ``discard``). It
appends each write as one encoded batch (msgpack + zstd, never pickle) to ``<dir>/records.tlb``, so
what it got can be read back from any process, whether it ran in a lane actor or in-process:
``tracklane.workers.testing.memory.memory_records(run_id)``.
The default ``dir`` is ``<temp>/tracklane-memory/<run_id>``; a fresh run starts it empty.
With ``discard`` it keeps only counts (``<dir>/tally.json`` at close: records, scalar values,
trajectories): the pipeline's own ceiling, with a sink that costs nothing (``tracklane.benchmarks.capacity``).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tracklane.core.errors import SinkError
from tracklane.core.records import Batch, Record, RunSpec
from tracklane.host.sink import Sink
from tracklane.wire.batch import encode_batch

RECORDS_FILE = "records.tlb"
FRAME_HEADER = struct.Struct("<I")  # byte length of the encoded batch that follows


def memory_dir(run_id: str) -> str:
    """Where the memory sink of run ``run_id`` keeps its records unless told otherwise."""
    return os.path.join(tempfile.gettempdir(), "tracklane-memory", run_id)


class MemorySink(Sink):
    name = "memory"
    takes_pieces = True  # keeps every record

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        options = dict(trainer.get("memory_sink") or {})
        return {
            "delay_s": float(options.get("delay_s", 0.0)),
            "fail_writes": bool(options.get("fail_writes", False)),
            "fail_open": bool(options.get("fail_open", False)),
            # While this file exists the sink behaves like a tracker that cannot be reached (a
            # ConnectionError), so a test can take it down and bring it back across processes.
            "down_while": str(options.get("down_while") or ""),
            # A store that lags like wandb-core's: a write counts as stored once this many more came after it.
            "store_lag": int(options.get("store_lag", 0)),
            "dir": os.path.abspath(options.get("dir") or memory_dir(run.run_id)),
            "discard": bool(options.get("discard", False)),
        }

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        if self.settings["fail_open"]:
            raise SinkError("memory sink told to fail on open")
        os.makedirs(self.settings["dir"], exist_ok=True)
        fresh = resume is None and not self.run.resume
        self._path = os.path.join(self.settings["dir"], RECORDS_FILE)
        with open(self._path, "wb" if fresh else "ab"):
            pass
        self._writes = 0
        self._tally = {"records": 0, "values": 0, "trajectories": 0}
        return {}

    def write(self, records: Sequence[Record]) -> None:
        if self.settings["delay_s"]:
            time.sleep(self.settings["delay_s"])
        if self.settings["fail_writes"]:
            raise SinkError("memory sink told to fail every write")
        if self.settings["down_while"] and os.path.exists(self.settings["down_while"]):
            raise ConnectionError(f"memory sink down while {self.settings['down_while']} exists")
        if self.settings["discard"]:
            self._count(records)
        else:
            blob = encode_batch(Batch(seq=0, created=time.time(), records=list(records)))
            with open(self._path, "ab") as handle:
                handle.write(FRAME_HEADER.pack(len(blob)) + blob)
        self._writes += 1

    def _count(self, records: Sequence[Record]) -> None:
        tally = self._tally
        tally["records"] += len(records)
        for record in records:
            if record.kind == "metrics":
                tally["values"] += len(record.values)  # type: ignore[union-attr]
            elif record.kind == "trajectories":
                tally["trajectories"] += len(record.trajectories)  # type: ignore[union-attr]

    def close(self, exit_code: int) -> None:
        if self.settings["discard"]:
            with open(os.path.join(self.settings["dir"], "tally.json"), "w", encoding="utf-8") as handle:
                json.dump(self._tally, handle)

    def written(self) -> int | None:
        return self._writes if self.settings["store_lag"] else None

    def stored(self, point: int) -> bool:
        return point <= self._writes - self.settings["store_lag"]

    def where(self) -> str:
        return f"memory: {os.path.join(self.settings['dir'], RECORDS_FILE)}"
