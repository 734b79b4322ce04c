"""What an alert of the RL health rules (health_rules.py) becomes: a console line and records for every tracker.

Each is printed as one line on the trainer's console (the console tracker prints ``Alert`` records so), and logged
into every tracker at the step it fired: ``tracklane/alert/<rule>`` (1.0, once per rule and step) and an ``Alert``
record saying what and why: the text ``alert/<rule>`` in every tracker, and the tracker's own alert where it has one
(wandb's ``run.alert``, trackio's alerts, an MLflow tag, a ClearML tag). The health judge (workers/sinks/health.py)
emits those of its rules, rank 0 those of its own (the trainer's pace, the lanes: shipping/stages.py).
"""

from __future__ import annotations

from typing import Any

from tracklane.core.health_rules import ERROR_RULES, Alert
from tracklane.core.records import Alert as AlertRecord
from tracklane.core.records import Metrics, Record

ALERT_KEY = "tracklane/alert/"


def alert_line(rule: str, message: str) -> str:
    return f"tracklane ALERT {rule}: {message}"


class Alerts:
    """The alerts fired so far, each once (rule, key and step), and the records of the new ones."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, int]] = set()
        self._pointed: set[tuple[str, int]] = set()  # (rule, step) whose tracklane/alert/<rule> point went out
        self.fired: list[Alert] = []

    def records(self, alerts: list[Alert], now: float) -> list[Record]:
        """The records of those of ``alerts`` not taken before: per rule and step, the point (once) and one alert
        record of their messages."""
        fresh: dict[tuple[str, int], list[Alert]] = {}
        for alert in alerts:
            if (alert.rule, alert.key, alert.step) not in self._seen:
                self._seen.add((alert.rule, alert.key, alert.step))
                self.fired.append(alert)
                fresh.setdefault((alert.rule, alert.step), []).append(alert)
        out: list[Record] = []
        for (rule, step), group in fresh.items():
            if (rule, step) not in self._pointed:
                self._pointed.add((rule, step))
                out.append(Metrics(step=step, values={f"{ALERT_KEY}{rule}": 1.0}, time=now))
            out.append(AlertRecord(step=step, rule=rule, text="\n".join(a.message for a in group), time=now,
                                   level="ERROR" if rule in ERROR_RULES else "WARN"))
        return out

    def to_plain(self) -> list[list[Any]]:
        return [alert.to_plain() for alert in self.fired]

    @classmethod
    def from_plain(cls, data: Any) -> Alerts:
        """The alerts of an earlier process of the judge (``to_plain``), taken again: each stays once."""
        alerts = cls()
        alerts.records([Alert.from_plain(plain) for plain in data], 0.0)
        return alerts

    def lines(self) -> list[str]:
        """One line per alert taken, for the report."""
        return [f"{a.rule} at step {a.step}: {a.message}" for a in self.fired]
