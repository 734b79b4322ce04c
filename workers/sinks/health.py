"""The health judge: the run's step metrics judged by the RL health rules (core/health_rules.py).

Not a tracker but a judge (host/sink.py ``Judging``): it stores nothing. It runs in a lane actor of its own, so the
rules cost the trainer's process nothing; what fires it emits into every tracker as a sender of its own
(core/alerts.py: the console prints it as a line, every tracker holds ``tracklane/alert/<rule>`` and the alert's
text at its step). Added by ``Tracking`` while ``trainer.health.enabled`` is true (the default), never named in
``trainer.logger``. Settings: ``rules`` (``trainer.health.rules``).

Its rules' state lives in the actor: one that Ray restarts judges the steps from there on; an alert it says again
for a step an earlier actor emitted is left out by its emitter (shipping/judge_emitter.py). What fired is on disk
(``state_path``, judge.py) after each batch that fired, so the run's report lists every alert of the run; a batch
that fired nothing writes nothing (most batches).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tracklane.core.alerts import Alerts
from tracklane.core.health_rules import LANE, HealthRules, rule_settings
from tracklane.core.records import Metrics, Record, RunSpec
from tracklane.workers.sinks.judge import JudgeSink
from tracklane.workers.sinks.steps import merge_by_axis_step


class HealthSink(JudgeSink):
    name = LANE

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        return {"rules": dict((trainer.get("health") or {}).get("rules") or {}), "state_path": ""}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.rules = HealthRules(rule_settings(self.settings.get("rules")))
        self._alerts = Alerts()
        self._saved = 0  # alerts in the state on disk: the state only grows, so more means changed

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        saved = self._load_state()
        if saved is not None:
            self._alerts = Alerts.from_plain(saved)
        self._saved = len(self._alerts.fired)
        return {}

    def write(self, records: Sequence[Record]) -> None:
        self.write_metrics([r for r in records if isinstance(r, Metrics)])  # it judges metrics; the rest is no news

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        fired = [alert for axis, step, values in merge_by_axis_step(records) if axis is None  # the trainer's steps
                 for alert in self.rules.observe(step, values)]
        self._emit(self._alerts.records(fired, time.time()))

    def flush(self) -> None:
        if len(self._alerts.fired) != self._saved:  # an alert fired (and was emitted) since the last write
            self._save_state(self._alerts.to_plain())
            self._saved = len(self._alerts.fired)

    def judged(self) -> dict[str, Any]:
        return {"alerts": self._alerts.lines()}

    def where(self) -> str:
        on = [name for name, rule in self.rules.settings.items() if rule.enabled]
        return f"health: {len(on)} rules judging the step metrics"
