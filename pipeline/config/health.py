"""``trainer.health``: the RL health rules (core/health_rules.py), judged in a lane of their own.

    trainer:
      health:
        enabled: true               # false by default (a drop-in starts no actor unasked): no health lane, no alerts
        rules:
          kl_blowup: {threshold: 2.0}
          flat_groups: {enabled: false}

The rules, what each means and its defaults: docs/health.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracklane.config.keys import refuse_unknown_keys
from tracklane.core.errors import ConfigError
from tracklane.core.health_rules import rule_settings


@dataclass(slots=True, kw_only=True)
class HealthConfig:
    enabled: bool = False
    """Judge the run's step metrics by the health rules, in a lane actor of their own (nothing on the trainer's
    thread), and send what fires to the console, every tracker and the report. Off by default (a drop-in for verl's
    Tracking starts no actor unasked); the main job turns it on (trainer/config.py)."""
    rules: dict[str, Any] = field(default_factory=dict)
    """Per rule, what differs from its defaults: ``enabled``, ``threshold``, ``for_steps``, ``ratio``,
    ``warmup``, ``points`` (docs/health.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"trainer.health.enabled must be true or false, got {self.enabled!r}")
        if not isinstance(self.rules, Mapping):
            raise ConfigError(f"trainer.health.rules must be a map of rule -> settings, got {self.rules!r}")
        rule_settings(self.rules)  # an unknown rule or setting, or a bad value: a ConfigError naming it


def health_config(section: Mapping[str, Any] | None) -> HealthConfig:
    """The section (a plain mapping), refusing unknown keys and bad values."""
    section = dict(section or {})
    refuse_unknown_keys(section, HealthConfig.__slots__, "trainer.health")
    rules = section.get("rules")
    return HealthConfig(enabled=section.get("enabled", False),
                        rules=dict(rules) if isinstance(rules, Mapping) else rules if rules is not None else {})
