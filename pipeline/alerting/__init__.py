"""Files shipped for a user's alerting stack: ``prometheus_rules.yml``, Prometheus alerting rules over the
gauges the Prometheus tracker serves (docs/health.md). ``RULES_FILE`` is its path once installed."""

from __future__ import annotations

from pathlib import Path

RULES_FILE = Path(__file__).with_name("prometheus_rules.yml")
