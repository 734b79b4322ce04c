"""The test double: a sink that keeps records in memory, optionally slow or failing.

Selected as backend ``"memory"``; configured under ``trainer.memory_sink``
(``delay_s`` per write, ``fail_writes``, ``fail_open``). Tests read back what
arrived from ``Tracking.finish()``'s report (``lanes["memory"].records()``).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from pipeline.codec import encode_batch
from pipeline.errors import SinkError
from pipeline.records import Batch, Record, RunSpec
from workers.sink import Sink


class MemorySink(Sink):
    name = "memory"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        options = dict(trainer.get("memory_sink") or {})
        return {
            "delay_s": float(options.get("delay_s", 0.0)),
            "fail_writes": bool(options.get("fail_writes", False)),
            "fail_open": bool(options.get("fail_open", False)),
        }

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        if self.settings["fail_open"]:
            raise SinkError("memory sink told to fail on open")
        self.records: list[Record] = []
        self.closed_with: int | None = None
        return {}

    def write(self, records: Sequence[Record]) -> None:
        if self.settings["delay_s"]:
            time.sleep(self.settings["delay_s"])
        if self.settings["fail_writes"]:
            raise SinkError("memory sink told to fail every write")
        self.records.extend(records)

    def close(self, exit_code: int) -> None:
        self.closed_with = exit_code

    def snapshot(self) -> bytes:
        """Everything received, encoded like a batch (msgpack + zstd, never pickle)."""
        return encode_batch(Batch(seq=0, created=time.time(), records=list(getattr(self, "records", []))))
