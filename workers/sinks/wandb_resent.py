"""Skip what a wandb run taken over already holds, and tag each new row so that a later takeover can.

A sink that takes over a run (actor restart, resumed run) reads the run's earlier files (``workers/sinks/wandb_store.py``)
and skips the re-sent records their newest ``ROW_TAG`` per sender covers, and the artifacts already logged. Each new
row carries the tag of its last record: sender, batch, position in that batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from tracklane.core.records import Artifact
from tracklane.workers.sinks.media import safe_name
from tracklane.workers.sinks.wandb_store import Stored, run_files, stored_so_far

log = logging.getLogger("tracklane")

QUIET_S = 3.0
"""A run's earlier file is read once it has been still this long: the wandb-core of a killed actor lives on
for a second or two (measured: under 2 s); it writes nothing more, but wait to be sure."""
QUIET_WAIT_MAX_S = 15.0


class ResentRows:
    """What the run's earlier files hold, and where the batch being written puts each record."""

    def __init__(self) -> None:
        self.earlier = Stored()  # what the run's earlier files hold (a run taken over)
        self.sender, self.seq = "", 0  # the batch being written (begin_batch)
        self._positions: dict[int, int] = {}  # id(record) -> its position in that batch
        self._skipped = 0

    def read_earlier(self, wandb_dir: str, run_id: str) -> Stored:
        """What the run's earlier files hold, once they are still (their wandb-core is gone)."""
        deadline = time.monotonic() + QUIET_WAIT_MAX_S
        while time.monotonic() < deadline:
            files = run_files(wandb_dir, run_id)
            newest = max((f.stat().st_mtime for f in files), default=0.0)
            if time.time() - newest >= QUIET_S:
                break
            time.sleep(0.2)
        self.earlier = stored_so_far(run_files(wandb_dir, run_id))
        return self.earlier

    def begin_batch(self, sender: str, seq: int, records: Sequence[Any]) -> None:
        self.sender, self.seq = sender, seq
        self._positions = {id(record): position for position, record in enumerate(records)}

    def stored_artifact(self, record: Any) -> bool:
        return isinstance(record, Artifact) and \
            (safe_name(record.name, "-"), safe_name(record.type, "-"), record.step) in self.earlier.artifacts

    def fresh(self, group: Sequence[Any], run: Any) -> bool:
        """False if the run's earlier files hold this row already (a batch sent again after a takeover); ``run``,
        the wandb Run, is named in the warning."""
        position = self._position(group)
        if position < 0 or (self.seq, position) > self.earlier.rows.get(self.sender, (0, -1)):
            return True
        if not self._skipped:
            log.warning("tracklane: wandb: run %s already holds records sent again (an earlier actor or process "
                        "of this run stored them); skipping them", run.id)
        self._skipped += len(group)
        return False

    def tag(self, group: Sequence[Any]) -> str | None:
        """The row's ``ROW_TAG`` value; None outside a lane's batch (the synchronous path)."""
        position = self._position(group)
        return f"{self.sender}|{self.seq}|{position}" if position >= 0 else None

    def _position(self, group: Sequence[Any]) -> int:
        """The batch position of the row's last record; -1 outside a lane's batch (the synchronous path)."""
        return self._positions.get(id(group[-1]), -1)
