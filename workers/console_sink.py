"""Console tracker: one line per step, in verl's ``step:N - key:value - ...`` format.

Rich records get one short summary line each (counts, mean score), never their full text.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from pipeline.records import Artifact, Generations, Histogram, Image, Metrics, Text, Trajectories
from workers.media import mean_score
from workers.sink import Sink
from workers.steps import merge_by_axis_step


class ConsoleSink(Sink):
    name = "console"

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        self._say(" - ".join([f"{axis or 'step'}:{step}", *(f"{key}:{value!r}" for key, value in values.items())])
                  for axis, step, values in merge_by_axis_step(records))

    def write_generations(self, records: Sequence[Generations]) -> None:
        self._say(f"step:{r.step} - {r.key}: {len(r.samples)} samples, mean score {mean_score(r):.4g}" for r in records)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._say(f"step:{r.step} - {r.key}: {len(r.trajectories)} trajectories, mean score {mean_score(r):.4g}"
                  for r in records)

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        for r in records:
            figures = r.summary()
            self._say([f"step:{r.step} - {r.name}: histogram of {figures.count} values, "
                       f"mean {figures.mean:.4g}, min {figures.min:.4g}, max {figures.max:.4g}"])

    def write_text(self, records: Sequence[Text]) -> None:
        self._say(f"step:{r.step} - {r.name}: text of {len(r.text)} characters" for r in records)

    def write_image(self, records: Sequence[Image]) -> None:
        self._say(f"step:{r.step} - {r.name}: image of {len(r.png)} PNG bytes" for r in records)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        self._say(f"step:{r.step} - artifact {r.name} ({r.type}): {r.path}" for r in records)

    @staticmethod
    def _say(lines: Iterable[str]) -> None:
        text = "".join(f"{line}\n" for line in lines)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()

    def where(self) -> str:
        return "console: the trainer's standard output"
