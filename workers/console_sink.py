"""Console tracker: one line per step, in verl's ``step:N - key:value - ...`` format."""

from __future__ import annotations

import sys
from typing import Sequence

from pipeline.records import Metrics
from workers.sink import Sink
from workers.steps import merge_by_step


class ConsoleSink(Sink):
    name = "console"

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        lines = [
            " - ".join([f"step:{step}", *(f"{key}:{value!r}" for key, value in values.items())])
            for step, values in merge_by_step(records)
        ]
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()

    def where(self) -> str:
        return "console: the trainer's standard output"
