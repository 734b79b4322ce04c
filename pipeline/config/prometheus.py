"""``trainer.prometheus``: where the prometheus backend serves ``/metrics`` for a scrape.

    trainer:
      prometheus:
        host: 127.0.0.1   # the address the lane actor's endpoint binds
        port: 9464        # 0: any free port (the run's summary says which)
        final_scrape_s: 10  # at the close, serve the last values until scraped twice, this long at most

Each unset field falls back to ``TRACKLANE_PROMETHEUS_HOST`` / ``TRACKLANE_PROMETHEUS_PORT`` /
``TRACKLANE_PROMETHEUS_FINAL_SCRAPE_S``, then to the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracklane.config.keys import refuse_unknown_keys
from tracklane.core.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporter took; free of Prometheus' own 9090
DEFAULT_FINAL_SCRAPE_S = 10.0  # two scrapes at a 5 s interval; within the close's share of finish_timeout_s (15 s)
HOST_ENV, PORT_ENV = "TRACKLANE_PROMETHEUS_HOST", "TRACKLANE_PROMETHEUS_PORT"
FINAL_SCRAPE_ENV = "TRACKLANE_PROMETHEUS_FINAL_SCRAPE_S"


@dataclass(slots=True, kw_only=True)
class PrometheusConfig:
    host: str = DEFAULT_HOST
    """The address the endpoint binds (``TRACKLANE_PROMETHEUS_HOST`` where the config does not say); widen it only
    on a trusted network: the endpoint serves every scalar of the run."""
    port: int = DEFAULT_PORT
    """Its port, 0-65535 (0: any free one; ``TRACKLANE_PROMETHEUS_PORT`` where the config does not say)."""
    final_scrape_s: float = DEFAULT_FINAL_SCRAPE_S
    """At the close, how long at most the endpoint keeps serving the run's last values until two scrapes have read
    them (``TRACKLANE_PROMETHEUS_FINAL_SCRAPE_S`` where the config does not say): without it a short run's last
    steps, and an alert fired near the end, close before Prometheus reads them. Two, because Prometheus evaluates
    its rules on a clock of its own: the second scrape shows a whole interval passed with the values in place. A
    run nobody scraped closes at once; 0: never wait. Held to 4/5 of the close's share of ``finish_timeout_s`` (a
    quarter, 15 s at most), so finish() still answers in time."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"trainer.prometheus.host must be a host name or address, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"trainer.prometheus.port must be a port number (0-65535), got {self.port!r}")
        wait = self.final_scrape_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < float("inf"):
            raise ConfigError(f"trainer.prometheus.final_scrape_s must be a number of seconds >= 0, got {wait!r}")


def prometheus_config(section: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> PrometheusConfig:
    """The section (a plain mapping) with the environment's fallbacks, refusing unknown keys and bad values."""
    section = dict(section or {})
    refuse_unknown_keys(section, PrometheusConfig.__slots__, "trainer.prometheus")
    for key, name, default in (("host", HOST_ENV, DEFAULT_HOST), ("port", PORT_ENV, DEFAULT_PORT),
                               ("final_scrape_s", FINAL_SCRAPE_ENV, DEFAULT_FINAL_SCRAPE_S)):
        if section.get(key) is None:
            section[key] = (env or {}).get(name) or default
    _number_from_text(section, "port", int, "a port number (0-65535)")
    _number_from_text(section, "final_scrape_s", float, "a number of seconds >= 0")
    return PrometheusConfig(**section)


def _number_from_text(section: dict[str, Any], key: str, kind: type, what: str) -> None:
    """A value from the environment, or a YAML string, read as ``kind``; a clear error where it is not one."""
    if isinstance(section[key], str):
        try:
            section[key] = kind(section[key])
        except ValueError:
            raise ConfigError(f"trainer.prometheus.{key} must be {what}, got {section[key]!r}") from None
