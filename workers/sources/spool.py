"""A tracklane spool: the records of every batch it still holds, decoded as the lanes decode them.

A spool keeps a batch only until every tracker of its run acknowledged it, so a finished run's spool holds what
some tracker still lacked (after a crash or an outage), not the whole run; ``spool_retention_s`` keeps more.
The run (project, experiment, id, hyper-parameters) is the spool's manifest. A batch that cannot be read or
decoded is skipped and counted (its records are not known, so it counts as one). Records come in batch order,
which is the order they were logged in.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from tracklane.core.errors import CodecError
from tracklane.core.records import Record
from tracklane.host.source import Source, SourceRun, option
from tracklane.spool.manifest import RunManifest
from tracklane.spool.segments import Spool
from tracklane.wire.batch import decode_batch


class SpoolSource(Source):
    name = "spool"

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = os.path.abspath(directory)
        self._manifest = RunManifest.load(self.directory)  # ConfigError if it is no spool

    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> SpoolSource:
        return cls(option(options, "spool", cls.name))

    def run(self) -> SourceRun:
        run = self._manifest.run
        return SourceRun(project=run.project, experiment=run.experiment, params=dict(run.params), run_id=run.run_id,
                         where=f"spool {self.directory}")

    def records(self) -> Iterator[Record]:
        spool = Spool(self.directory, readonly=True)
        for entry in spool.entries():
            payload = spool.read(entry.seq)
            try:
                records = decode_batch(payload).records if payload is not None else None
            except CodecError:
                records = None
            if records is None:
                self.skip("unreadable spooled batches")
                continue
            yield from records
