"""The health judge: the run's step metrics judged by the RL health rules (core/health_rules.py).

Not a tracker but a judge (host/sink.py ``Judging``): it stores nothing. It runs in a lane actor of its own, so the
rules cost the trainer's process nothing; what fires it emits into every tracker as a sender of its own
(core/alerts.py: the console prints it as a line, every tracker holds ``tracklane/alert/<rule>`` and the alert's
text at its step). Added by ``Tracking`` while ``trainer.health.enabled`` is true (the default), never named in
``trainer.logger``. Settings: ``rules`` (``trainer.health.rules``).

Its rules' state lives in the actor: one that Ray restarts judges the steps from there on; an alert it says again
for a step an earlier actor emitted is left out by its emitter (shipping/judge_emitter.py). What fired is on disk
after every batch (``state_path``, set by the pipeline), after what it emitted, so the run's report lists every
alert of the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from tracklane.core.alerts import Alerts
from tracklane.core.files import write_atomically
from tracklane.core.health_rules import LANE, HealthRules, rule_settings
from tracklane.core.records import Metrics, Record, RunSpec
from tracklane.host.sink import Emitter, Sink
from tracklane.workers.sinks.steps import merge_by_axis_step


class HealthSink(Sink):
    name = LANE
    judges = True

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        return {"rules": dict((trainer.get("health") or {}).get("rules") or {}), "state_path": ""}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.rules = HealthRules(rule_settings(self.settings.get("rules")))
        self._alerts = Alerts()
        self._emitter: Emitter | None = None
        self._path = str(self.settings.get("state_path") or "")

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        if self._path and os.path.exists(self._path):
            with open(self._path, "rb") as handle:
                self._alerts = Alerts.from_plain(msgpack.unpackb(handle.read(), raw=False))
        return {}

    def judge_into(self, emitter: Emitter) -> None:
        self._emitter = emitter

    def write(self, records: Sequence[Record]) -> None:
        self.write_metrics([r for r in records if isinstance(r, Metrics)])  # it judges metrics; the rest is no news

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        fired = [alert for axis, step, values in merge_by_axis_step(records) if axis is None  # the trainer's steps
                 for alert in self.rules.observe(step, values)]
        out = self._alerts.records(fired, time.time())
        if out and self._emitter is not None:
            self._emitter.emit(out)

    def flush(self) -> None:
        if self._emitter is not None:
            self._emitter.keep()  # what was emitted is on disk before the state says it fired
        if self._path:
            write_atomically(self._path, msgpack.packb(self._alerts.to_plain(), use_bin_type=True))

    def judged(self) -> dict[str, Any]:
        return {"alerts": self._alerts.lines()}

    def where(self) -> str:
        on = [name for name, rule in self.rules.settings.items() if rule.enabled]
        return f"health: {len(on)} rules judging the step metrics"
