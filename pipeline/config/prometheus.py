"""``trainer.prometheus``: where the prometheus backend serves ``/metrics`` for a scrape.

    trainer:
      prometheus:
        host: 127.0.0.1   # the address the lane actor's endpoint binds
        port: 9464        # 0: any free port (the run's summary says which)

Each unset field falls back to ``TRACKLANE_PROMETHEUS_HOST`` / ``TRACKLANE_PROMETHEUS_PORT``, then to the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracklane.config.keys import refuse_unknown_keys
from tracklane.core.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporter took; free of Prometheus' own 9090
HOST_ENV, PORT_ENV = "TRACKLANE_PROMETHEUS_HOST", "TRACKLANE_PROMETHEUS_PORT"


@dataclass(slots=True, kw_only=True)
class PrometheusConfig:
    host: str = DEFAULT_HOST
    """The address the endpoint binds (``TRACKLANE_PROMETHEUS_HOST`` where the config does not say); widen it only
    on a trusted network: the endpoint serves every scalar of the run."""
    port: int = DEFAULT_PORT
    """Its port, 0-65535 (0: any free one; ``TRACKLANE_PROMETHEUS_PORT`` where the config does not say)."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"trainer.prometheus.host must be a host name or address, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"trainer.prometheus.port must be a port number (0-65535), got {self.port!r}")


def prometheus_config(section: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> PrometheusConfig:
    """The section (a plain mapping) with the environment's fallbacks, refusing unknown keys and bad values."""
    section = dict(section or {})
    refuse_unknown_keys(section, PrometheusConfig.__slots__, "trainer.prometheus")
    env = env or {}
    if section.get("host") is None:
        section["host"] = env.get(HOST_ENV) or DEFAULT_HOST
    if section.get("port") is None:
        section["port"] = env.get(PORT_ENV) or DEFAULT_PORT
    if isinstance(section["port"], str):  # from the environment, or a YAML string
        try:
            section["port"] = int(section["port"])
        except ValueError:
            raise ConfigError(f"trainer.prometheus.port must be a port number (0-65535), got {section['port']!r}") \
                from None
    return PrometheusConfig(**section)
