"""Rank 0's end of the health rules: what the health lane says fired goes everywhere a user looks.

The health lane (workers/sinks/health.py) answers with the alerts its rules fired (``Ack.answers["alerts"]``).
Each is printed as one line on the trainer's console, and logged into every tracker through rank 0's own stream
(spooled, exactly once like anything rank 0 logs) at the step it fired: ``tracklane/alert/<rule>`` (1.0, once per
rule and step) and an ``Alert`` record saying what and why: the text ``alert/<rule>`` in every tracker, and the
tracker's own alert where it has one (wandb's ``run.alert``, trackio's alerts, an MLflow tag, a ClearML tag). The
report at ``finish()`` lists them. An alert a restarted health actor says again (same rule, key and step) is logged once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tracklane.core.health_rules import ERROR_RULES, Alert, LaneHealth, RunRules
from tracklane.core.records import Alert as AlertRecord
from tracklane.core.records import Metrics, Record
from tracklane.core.report import PipelineReport
from tracklane.node.terminal import TERMINAL
from tracklane.shipping.barrier import Barrier
from tracklane.shipping.stages import Loop, Stage

log = logging.getLogger("tracklane")

ALERT_KEY = "tracklane/alert/"


def alert_records(alerts: list[Alert], now: float, point: bool = True) -> list[Record]:
    """What every tracker gets of one rule's alerts at one step (one per key it fired on): the point
    ``tracklane/alert/<rule>`` (unless ``point`` is False: it is there already) and one alert of their messages."""
    rule, step = alerts[0].rule, alerts[0].step
    alert = AlertRecord(step=step, rule=rule, text="\n".join(a.message for a in alerts), time=now,
                        level="ERROR" if rule in ERROR_RULES else "WARN")
    return [Metrics(step=step, values={f"{ALERT_KEY}{rule}": 1.0}, time=now), alert] if point else [alert]


def alert_line(alert: Alert) -> str:
    return f"tracklane ALERT {alert.rule}: {alert.message}"


class AlertsStage(Stage):
    """Takes the health lane's answers (``take``, on the shipper thread) and sends each new alert on."""

    def __init__(self, say: Callable[[str], None] = TERMINAL.write, run_rules: RunRules | None = None) -> None:
        """``say``: where the console line goes (the terminal's printing thread; the synchronous path prints at
        once, among the console tracker's own lines). ``run_rules``: rank 0's own rules (the trainer's pace, the
        lanes), looked at every round."""
        self._say = say
        self._run_rules = run_rules
        self._seen: set[tuple[str, str, int]] = set()
        self._pointed: set[tuple[str, int]] = set()  # (rule, step) whose tracklane/alert/<rule> point went out
        self._fired: list[Alert] = []
        self._out: list[Record] = []
        self._last_sent = 0  # the batch its latest alerts went in

    def take(self, answer: Any) -> None:
        """The health lane's ``alerts`` answer (checked by wire/ack.py)."""
        self._take([Alert.from_plain(plain) for plain in answer])

    def _take(self, alerts: list[Alert]) -> None:
        now = time.time()
        fresh: dict[tuple[str, int], list[Alert]] = {}
        for alert in alerts:
            if (alert.rule, alert.key, alert.step) in self._seen:
                continue
            self._seen.add((alert.rule, alert.key, alert.step))
            self._fired.append(alert)
            self._say(alert_line(alert) + "\n")
            fresh.setdefault((alert.rule, alert.step), []).append(alert)
        for (rule, step), alerts in fresh.items():
            self._out += alert_records(alerts, now, point=(rule, step) not in self._pointed)
            self._pointed.add((rule, step))

    def drain(self) -> list[Record]:
        """The records of the alerts taken since the last call (every tracker's)."""
        records, self._out = self._out, []
        return records

    def round(self, loop: Loop) -> None:
        if self._run_rules is not None and not loop.closing:  # O(lanes) a round: cheap
            lanes = {name: _health(lane) for name, lane in loop.lanes.items()}
            self._take(self._run_rules.look(time.monotonic(), loop.last_step if loop.seq else None, lanes))
        if self._out and not loop.closing:
            loop.send(self.drain())
            self._last_sent = loop.seq

    def finish(self, barrier: Barrier, loop: Loop) -> bool:
        """Closing: the alerts on the last steps (the health lane has answered for them once everything settled)
        are in the trackers before they close."""
        self.round(loop)
        return barrier.target is not None and self._last_sent > barrier.target

    def lines(self) -> list[str]:
        """One line per alert taken, for the report."""
        return [f"{a.rule} at step {a.step}: {a.message}" for a in self._fired]

    def report(self, report: PipelineReport, barrier: Barrier, loop: Loop) -> None:
        report.alerts = self.lines()


def _health(lane: Any) -> LaneHealth:
    """What rank 0's rules look at in one lane (a ``TrackerLane``)."""
    down_s, why = lane.down()
    return LaneHealth(down_s=down_s, lag_s=lane.lag_s(), down=why)
