"""The health lane's sink: the run's step metrics judged by the RL health rules (core/health_rules.py).

Not a tracker: it stores nothing. It runs in a lane actor of its own, so the rules cost the trainer's process
nothing; what fires goes back to rank 0 in the lane's answers (``take_alerts``), which prints it on the console
and logs it into every tracker (shipping/alerts.py). Added by ``Tracking`` while ``trainer.health.enabled`` is true
(the default), never named in ``trainer.logger``. Settings: ``rules`` (``trainer.health.rules``).

Its rules' state lives in the actor: one that Ray restarts judges the steps from there on, and a rule whose
episode it already reported may report it again (rank 0 logs an alert once per rule, key and step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracklane.core.health_rules import LANE, HealthRules, rule_settings
from tracklane.core.records import Metrics, Record, RunSpec
from tracklane.host.sink import Sink
from tracklane.workers.sinks.steps import merge_by_axis_step


class HealthSink(Sink):
    name = LANE

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        return {"rules": dict((trainer.get("health") or {}).get("rules") or {})}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.rules = HealthRules(rule_settings(self.settings.get("rules")))
        self._fired: list[list[Any]] = []

    def write(self, records: Sequence[Record]) -> None:
        self.write_metrics([r for r in records if isinstance(r, Metrics)])  # it judges metrics; the rest is no news

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        for axis, step, values in merge_by_axis_step(records):
            if axis is None:  # the trainer's steps (not system/elapsed_s and the other axes)
                self._fired += [alert.to_plain() for alert in self.rules.observe(step, values)]

    def take_alerts(self) -> list[list[Any]]:
        fired, self._fired = self._fired, []
        return fired

    def where(self) -> str:
        on = [name for name, rule in self.rules.settings.items() if rule.enabled]
        return f"health: {len(on)} rules judging the step metrics"
