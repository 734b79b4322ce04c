"""The last step each metric key reached in a run, across its processes, so a resumed run logs no step twice.

A resumed job re-runs the steps after its checkpoint: verl's trainer killed at step 7 with a checkpoint at step 5
logs steps 6 and 7 again (``trainer.resume_mode=auto``), and with ``val_before_train`` the checkpoint's own step's
validation. Every tracker would hold those points twice (MLflow a second value at the step, TensorBoard a second
event, the file a second line). Rank 0 notes, per key of the trainer's step metrics it ships, the last step it
reached; a resumed process leaves out a key's points at or below the step an earlier process reached (the first
value stays: it is in the trackers, or in the spool, which delivers it first), counts them and says so once.

Exact across a crash: the notes are written to ``<spool>/logged_steps`` before the spool deletes a segment
(``Spool.before_forget``), so whatever the file lacks is still in a spooled batch, which ``open`` reads back.
Only the trainer's step axis is kept: a producer's own axis and the system metrics' seconds restart with a process.
A judge's emitter keeps notes too (shipping/judge_emitter.py): its alerts go with their ``tracklane/alert/<rule>``
point, so an alert at a step an earlier process of the judge reached for that rule is left out with it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from typing import TypeGuard

import msgpack

from tracklane.core.alerts import ALERT_KEY
from tracklane.core.files import write_atomically
from tracklane.core.records import Alert, Metrics, Record
from tracklane.spool.segments import Spool

log = logging.getLogger("tracklane")

FILE = "logged_steps"


class LoggedSteps:
    def __init__(self, path: str, earlier: dict[str, int]) -> None:
        self._path = path
        self._earlier = earlier  # what earlier processes of the run logged: a point at or below is not logged again
        self._earlier_max = max(earlier.values(), default=-1)  # -1: a new run (steps start at 0)
        self.last = dict(earlier)  # key -> last step shipped, this process included
        self._top = self._earlier_max  # the highest step in ``last``
        self._saved = True
        self.skipped = 0  # points an earlier process had logged, left out
        self.skipped_steps: tuple[int, int] | None = None  # (lowest, highest) step they were at

    @classmethod
    def open(cls, spool: Spool, resume: bool, records_of: Callable[[bytes], list[Record]]) -> LoggedSteps:
        """A new run's notes; a resumed run's: the file, and the batches its spool still holds (``records_of``: a
        batch's records, from its bytes)."""
        path = os.path.join(spool.directory, FILE)
        if not resume:
            return cls(path, {})
        earlier = _load(path)
        for entry in spool.entries():
            blob = None if entry.bulk else spool.read(entry.seq)
            if blob is None:
                continue
            try:
                records = records_of(blob)
            except Exception:  # a damaged batch is the spool's to report (it is not delivered either)
                continue
            for record in records:
                if _on_step_axis(record):
                    _raise_to(earlier, record.values, record.step)
        return cls(path, earlier)

    def keep_new(self, records: list[Record]) -> list[Record]:
        """``records`` without the points an earlier process of the run logged; notes the step of every key."""
        if self._earlier:
            records = [kept for record in records if (kept := self._new_part(record)) is not None]
        for record in records:
            if _on_step_axis(record) and record.values:
                self._note(record)
        return records

    def _new_part(self, record: Record) -> Record | None:
        if isinstance(record, Alert):
            return record if record.step > self._earlier.get(ALERT_KEY + record.rule, -1) else None
        if not _on_step_axis(record) or record.step > self._earlier_max:
            return record
        step, earlier = record.step, self._earlier
        values = {key: value for key, value in record.values.items() if step > earlier.get(key, -1)}
        left_out = len(record.values) - len(values)
        if not left_out:
            return record
        if not self.skipped:
            log.warning("tracklane: resumed run: step %d was logged by an earlier process of this run; its points "
                        "are not logged again (the first value stays); counted in the report", step)
        self.skipped += left_out
        low, high = self.skipped_steps or (step, step)
        self.skipped_steps = (min(low, step), max(high, step))
        if not values:
            return None
        return dataclasses.replace(record, values=values, verl_data=None)  # the call's own line held the others

    def _note(self, record: Metrics) -> None:
        step = record.step
        if step >= self._top:  # the usual case: the newest step, at C speed for thousands of keys
            self.last.update(dict.fromkeys(record.values, step))
            self._top = step
        else:
            _raise_to(self.last, record.values, step)
        self._saved = False

    def save(self) -> None:
        """Write the notes (before the spool forgets a batch they cover); a no-op when unchanged."""
        if not self._saved:
            write_atomically(self._path, msgpack.packb(self.last, use_bin_type=True))
            self._saved = True


def _raise_to(last: dict[str, int], keys: Iterable[str], step: int) -> None:
    """Each of ``keys`` at ``step`` in ``last`` where that is later than what it holds."""
    for key in keys:
        if step > last.get(key, -1):
            last[key] = step


def _on_step_axis(record: Record) -> TypeGuard[Metrics]:
    return isinstance(record, Metrics) and record.axis is None


def _load(path: str) -> dict[str, int]:
    try:
        with open(path, "rb") as handle:
            data = msgpack.unpackb(handle.read(), raw=False)
        return {str(key): int(step) for key, step in data.items()}
    except FileNotFoundError:
        return {}
    except Exception as exc:  # a damaged file must not stop the run: without it a re-run step is logged again
        log.warning("tracklane: %s cannot be read (%s: %s); steps the resumed run repeats may be logged twice",
                    path, type(exc).__name__, exc)
        return {}
