"""Console tracker: one line per step, in verl's ``step:N - key:value - ...`` format, or a compact aligned one.

Rich records get one short summary line each (counts, mean score), never their full text.

Where the lines go: in-process (``log_async: false``) straight to stdout; in a lane actor they are kept
(``capture_output``) and travel back to the trainer in the actor's answers, which prints them on its own
stdout through ``tracklane.node.terminal`` (in batch order, without Ray's ``(LaneActor pid=...)`` prefix).
Its store is that stdout, so captured lines count as stored (``LaggingStore``) only once an answer to the
trainer took them: a producer's batch printed by an actor killed before then is sent again, not lost.

``trainer.console.format: compact`` (pipeline/config/console.py): each trainer step prints the chosen keys
on one line, each value in a fixed width so columns line up; the other keys follow in verl's format every
``every`` steps.
"""

from __future__ import annotations

import posixpath
import sys
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from tracklane.config.console import console_config
from tracklane.core.alerts import alert_line
from tracklane.core.records import Alert, Artifact, Generations, Histogram, Image, Metrics, RunSpec, Text, Trajectories
from tracklane.host.sink import Sink
from tracklane.workers.sinks.media import mean_score
from tracklane.workers.sinks.steps import merge_by_axis_step

MAX_KEPT_CHARS = 4 * 1024 * 1024
"""Captured text waiting for the trainer to collect it at most; older lines beyond are dropped, counted."""
_WIDTH = 11  # a compact value: "-0.0001234" and "1.235e+05" fit


class ConsoleSink(Sink):
    name = "console"
    takes_pieces = True  # prints a line a record

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        return console_config(trainer.get("console")).to_plain()

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        chosen = console_config(settings)  # {} (a spool of an older version): verl's format
        self._format, self._patterns, self._every = chosen.format, chosen.keys, chosen.every
        self._orders: dict[tuple[str, ...], list[str]] = {}  # a step's keys -> those shown, in display order
        self._kept: list[str] | None = None  # capture_output(): lines for take_output()
        self._kept_chars = 0
        self._said = 0  # characters captured so far
        self._taken = 0  # of those, characters take_output() handed on

    # -- metrics ----------------------------------------------------------------------------
    def write_metrics(self, records: Sequence[Metrics]) -> None:
        lines: list[str] = []
        for axis, step, values in merge_by_axis_step(records):
            if self._format == "verl":
                lines.append(_verl_line(f"{axis or 'step'}:{step}", values))
            elif axis is None:
                lines += self._compact(step, values)
            else:  # another axis (system metrics, a producer's): every key, the shared prefix said once
                lines.append(_compact_axis(axis, step, values))
        self._say(lines)

    def _compact(self, step: int, values: Mapping[str, Any]) -> list[str]:
        shown = self._ordered(values)
        lines = [" | ".join([f"step {step:>6}", *(f"{key} {_fixed(values[key])}" for key in shown)])] if shown else []
        rest = {key: value for key, value in values.items() if key not in shown}
        if rest and self._every and step % self._every == 0:
            lines.append(_verl_line(f"  step:{step}", rest))
        return lines

    def _ordered(self, values: Mapping[str, Any]) -> list[str]:
        """The chosen keys present in ``values``, in the order of the patterns (then the key's own order): the keys
        a compact line shows."""
        keys = tuple(values)
        ordered = self._orders.get(keys)
        if ordered is None:  # a step's keys are mostly the last step's: matched once (they were 15% of this lane)
            ordered = []
            for pattern in self._patterns:
                ordered += [key for key in keys if key not in ordered and fnmatchcase(key, pattern)]
            if len(self._orders) >= 64:
                self._orders.clear()
            self._orders[keys] = ordered
        return ordered

    # -- rich records: one summary line each --------------------------------------------
    def write_generations(self, records: Sequence[Generations]) -> None:
        self._say(f"step:{r.step} - {r.key}: {len(r.samples)} samples, mean score {mean_score(r):.4g}" for r in records)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._say(f"step:{r.step} - {r.key}: {len(r.trajectories)} trajectories, mean score {mean_score(r):.4g}"
                  for r in records)

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        self._say(f"step:{r.step} - {r.name}: histogram of {f.count} values, mean {f.mean:.4g}, min {f.min:.4g}, "
                  f"max {f.max:.4g}" for r in records for f in [r.summary()])

    def write_text(self, records: Sequence[Text]) -> None:
        self._say(f"step:{r.step} - {r.name}: {_text_line(r.text)}" for r in records)

    def write_alert(self, records: Sequence[Alert]) -> None:
        """A health rule that fired: a line per alert, the same wherever it runs (in a lane it reaches the trainer's
        terminal through the lane's answers)."""
        self._say(alert_line(r.rule, message) for r in records for message in r.text.splitlines())

    def write_image(self, records: Sequence[Image]) -> None:
        self._say(f"step:{r.step} - {r.name}: image of {len(r.png)} PNG bytes" for r in records)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        self._say(f"step:{r.step} - artifact {r.name} ({r.type}): {r.path}" for r in records)

    # -- where the lines go ---------------------------------------------------------------
    def capture_output(self) -> None:
        self._kept = []

    def take_output(self) -> str:
        self._taken = self._said
        if not self._kept:
            return ""
        text, self._kept, self._kept_chars = "".join(self._kept), [], 0
        return text

    def written(self) -> Any:
        """The lines captured so far (None: printed straight to stdout, stored already)."""
        return self._said if self._kept is not None else None

    def stored(self, point: Any) -> bool:
        """Stored once an answer to the trainer carried them (or they were dropped, counted, by the bound)."""
        return point is None or self._taken >= point

    def _say(self, lines: Iterable[str]) -> None:
        text = "".join(f"{line}\n" for line in lines)
        if not text:
            return
        if self._kept is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        self._kept.append(text)
        self._kept_chars += len(text)
        self._said += len(text)
        while self._kept_chars > MAX_KEPT_CHARS and len(self._kept) > 1:  # nobody collects: keep the newest
            dropped = self._kept.pop(0)
            self._kept_chars -= len(dropped)
            self.counts.add(self.counts.cuts, "console_lines_dropped", dropped.count("\n"))

    def where(self) -> str:
        return "console: the trainer's standard output"


def _verl_line(head: str, values: Mapping[str, Any]) -> str:
    return " - ".join([head, *(f"{key}:{value!r}" for key, value in values.items())])


def _compact_axis(axis: str, step: int, values: Mapping[str, Any]) -> str:
    prefix = posixpath.commonpath(list(values)) if len(values) > 1 and all("/" in k for k in values) else ""
    cut = len(prefix) + 1 if prefix else 0
    head = f"{axis} {step:>6}{' | ' + prefix + '/' if prefix else ''}"
    return " | ".join([head, *(f"{key[cut:]} {_fixed(value).strip()}" for key, value in values.items())])


def _fixed(value: Any) -> str:
    """A number in a fixed width: ints as they are, floats to 4 significant digits."""
    if isinstance(value, bool) or not isinstance(value, float):
        return f"{value!s:>{_WIDTH}}"
    return f"{value:>{_WIDTH}.4g}"


_TEXT_SHOWN = 300  # a text this short on one line (an error, a note) is shown; a longer one (samples) is summed up


def _text_line(text: str) -> str:
    """What the console shows of a text record: the text itself when it is one short line, else its size and start."""
    if len(text) <= _TEXT_SHOWN and "\n" not in text:
        return text
    first = text.strip().split("\n", 1)[0][:80]
    return f"text of {len(text)} characters: {first}{'...' if len(first) < len(text.strip()) else ''}"
