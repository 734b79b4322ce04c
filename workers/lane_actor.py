"""The Ray actor that drains one lane into one tracker.

It decodes each batch, skips what it already applied (re-sends after a restart),
writes the rest into its sink with retries and backoff, records the sequence number
durably, and acknowledges it. A failing tracker costs only this lane.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import msgpack

from pipeline.codec import decode_batch
from pipeline.errors import CodecError
from pipeline.records import Record, RunSpec
from workers.lane_state import LaneState
from workers.sink import Sink, backend_class

log = logging.getLogger("tracklane")


class LaneActor:
    """Hosts one sink. Ray calls run one at a time, in submission order."""

    def __init__(self, lane: str, opening: bytes) -> None:
        spec = msgpack.unpackb(opening, raw=False)
        self.lane = lane
        self._retries = int(spec["sink_retries"])
        self._backoff_s = float(spec["retry_backoff_s"])
        self._state = LaneState.load(os.path.join(spec["state_dir"], f"{lane}.state"))
        run = RunSpec(**spec["run"])
        self._sink: Sink = backend_class(spec["backend"])(run, spec["settings"])
        self._opened = False
        self._open_error: str | None = None
        self._failed_records = 0
        self._failed_batches = 0
        self._last_error: str | None = None
        self._try_open()

    def _try_open(self) -> bool:
        if self._opened:
            return True
        try:
            resume = self._sink.open(self._state.resume)
        except Exception as exc:  # the tracker may be down: report, retry on the next batch
            self._open_error = f"{type(exc).__name__}: {exc}"
            log.warning("tracklane: lane %s could not open its tracker: %s", self.lane, self._open_error)
            return False
        self._opened, self._open_error = True, None
        if self._state.resume is None:
            self._state.resume = resume or {}
            self._state.save()
        return True

    def ready(self) -> dict[str, Any]:
        """Whether the tracker opened; what was applied before (non-zero after a restart)."""
        return {"opened": self._opened, "error": self._open_error, "applied": self._state.applied, "pid": os.getpid()}

    def apply(self, seq: int, prev: int, blob: bytes) -> dict[str, Any]:
        """Write batch ``seq`` if it follows ``prev``, the last batch the lane sent before it."""
        applied = self._state.applied
        if seq <= applied:
            return self._ack(duplicate=True)
        if prev != applied:
            return self._ack(gap=True)
        started = time.monotonic()
        try:
            batch = decode_batch(blob)
        except CodecError as exc:
            self._note_failure(0, f"corrupt batch {seq}: {exc}")
            return self._advance(seq, started, corrupt=True)
        records = [r for r in batch.records if _addressed_to(r, self.lane)]
        if records:
            self._write_with_retries(records, seq)
        return self._advance(seq, started, records=len(records))

    def _write_with_retries(self, records: list[Record], seq: int) -> None:
        delay = self._backoff_s
        for attempt in range(self._retries + 1):
            if self._try_open():
                try:
                    self._sink.write(records)
                    return
                except Exception as exc:  # any SDK error: isolate it to this lane
                    self._last_error = f"{type(exc).__name__}: {exc}"
            else:
                self._last_error = f"tracker not open: {self._open_error}"
            if attempt < self._retries:
                time.sleep(delay)
                delay *= 2
        self._note_failure(len(records), f"batch {seq}: {self._last_error}")

    def _note_failure(self, records: int, message: str) -> None:
        self._failed_records += records
        self._failed_batches += 1
        self._last_error = message
        log.warning("tracklane: lane %s dropped %d record(s) after retries: %s", self.lane, records, message)

    def _advance(self, seq: int, started: float, **extra: Any) -> dict[str, Any]:
        self._state.applied = seq
        self._state.save()
        return self._ack(apply_s=time.monotonic() - started, **extra)

    def _ack(self, **extra: Any) -> dict[str, Any]:
        return {
            "applied": self._state.applied,
            "failed_records": self._failed_records,
            "failed_batches": self._failed_batches,
            "error": self._last_error,
            "unsupported": dict(self._sink.unsupported),
            "artifacts_missing": self._sink.artifacts_missing,
            **extra,
        }

    def flush(self) -> dict[str, Any]:
        if self._opened:
            try:
                self._sink.flush()
            except Exception as exc:
                self._last_error = f"flush: {type(exc).__name__}: {exc}"
        return self._ack()

    def close(self, exit_code: int) -> dict[str, Any]:
        """End the tracker run; returns the final figures (and, for a memory sink, its records encoded)."""
        error = None
        if self._opened:
            try:
                self._sink.close(exit_code)
            except Exception as exc:
                error = f"close: {type(exc).__name__}: {exc}"
                self._last_error = error
        report = self._ack(closed=error is None and self._opened, where=self._sink.where())
        snapshot = getattr(self._sink, "snapshot", None)
        if callable(snapshot):
            report["snapshot"] = snapshot()
        return report


def _addressed_to(record: Record, lane: str) -> bool:
    return record.only is None or lane in record.only


def opening_bytes(backend: str, run: RunSpec, settings: dict[str, Any], state_dir: str, retries: int, backoff_s: float) -> bytes:
    """Everything a lane actor needs to start, as msgpack (never pickle)."""
    spec = {
        "backend": backend,
        "run": {"project": run.project, "experiment": run.experiment, "params": run.params, "run_id": run.run_id,
                "resume": run.resume},
        "settings": settings,
        "state_dir": state_dir,
        "sink_retries": retries,
        "retry_backoff_s": backoff_s,
    }
    return msgpack.packb(spec, use_bin_type=True)

