"""What the judges (reduce.py, health.py) share: where they emit, and their state file, saved after ``Emitter.keep``
so that what they emitted is on disk before the state that says so (a restarted judge neither loses nor repeats it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from tracklane.core.files import write_atomically
from tracklane.core.records import Record, RunSpec
from tracklane.host.sink import Emitter, Sink


class JudgeSink(Sink):
    judges = True

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._path = str(self.settings.get("state_path") or "")  # set by the pipeline; "": in memory only
        self._emitter: Emitter | None = None

    def judge_into(self, emitter: Emitter) -> None:
        self._emitter = emitter

    def _emit(self, records: Sequence[Record]) -> None:
        if records and self._emitter is not None:
            self._emitter.emit(records)

    def _load_state(self) -> Any:
        """What an earlier actor of this judge saved (plain values), None if nothing."""
        if self._path and os.path.exists(self._path):
            with open(self._path, "rb") as handle:
                return msgpack.unpackb(handle.read(), raw=False)
        return None

    def _save_state(self, plain: Any) -> None:
        if self._emitter is not None:
            self._emitter.keep()  # what was emitted is on disk before the state says it was
        if self._path:
            write_atomically(self._path, msgpack.packb(plain, use_bin_type=True))
