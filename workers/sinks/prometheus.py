"""Prometheus tracker: the latest value of every scalar key, served as gauges on ``/metrics`` for a scrape.

Prometheus keeps no run of its own here: it scrapes what the lane's process serves, so this sink holds only the
latest value per key (and the trainer's latest step) and an HTTP endpoint (``prometheus_client``'s, on its own
registry: nothing else of the process leaks into it). Each key becomes a gauge named after it, sanitised to
Prometheus' ``[a-zA-Z_][a-zA-Z0-9_]*`` (``actor/pg_loss`` -> ``actor_pg_loss``, as verl's ``rl_insight`` names
them); the original key is the ``key`` label, beside ``project`` and ``experiment``, so two keys that sanitise
alike stay two series. ``tracklane_step`` is the trainer's step; the pipeline's health (``tracklane/*``) comes
as ordinary keys.

Where it serves: ``trainer.prometheus.host`` / ``.port``, else ``TRACKLANE_PROMETHEUS_HOST`` /
``TRACKLANE_PROMETHEUS_PORT``, else 127.0.0.1:9464 (pipeline/config/prometheus.py). The endpoint lives as long as
the lane: after ``finish()`` there is nothing to scrape. A lane actor that is restarted serves again from the next
batch on (the values before it are in whatever Prometheus scraped).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tracklane.config.prometheus import prometheus_config
from tracklane.core.records import Alert, Metrics, RunSpec
from tracklane.host.sink import Sink, import_sdk

STEP_GAUGE = "tracklane_step"
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(key: str) -> str:
    """``key`` as a Prometheus metric name: every other character an underscore, never a leading digit."""
    name = _NOT_IN_NAME.sub("_", key)
    return name if name and not name[0].isdigit() else f"_{name}"


class PrometheusSink(Sink):
    name = "prometheus"
    sdk_module = "prometheus_client"
    extra = "prometheus"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        chosen = prometheus_config(trainer.get("prometheus"), env)
        return {"host": chosen.host, "port": chosen.port}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._latest: dict[str, tuple[str | None, int, float]] = {}  # key -> (axis, step, value)
        self._step: int | None = None
        self._server: Any = None
        self.port: int = self.settings["port"]

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        client = import_sdk(type(self))
        registry = client.CollectorRegistry(auto_describe=False)
        registry.register(_LatestValues(self, import_sdk(type(self), "prometheus_client.core").GaugeMetricFamily))
        # Its own registry: the process's default one (Python's GC and process figures) stays out.
        self._server, _thread = client.start_http_server(self.port, addr=self.settings["host"], registry=registry)
        self.port = self._server.server_port  # port 0: the one the OS gave
        return {}

    def write_alert(self, records: Sequence[Alert]) -> None:
        """Nothing more: the alert's point ``tracklane/alert/<rule>`` is its gauge (``tracklane_alert_<rule>``)."""

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        for record in records:
            for key, value in record.values.items():
                held = self._latest.get(key)
                # A producer a step behind never hides a newer value of the same key on the same axis.
                if held is None or held[0] != record.axis or record.step >= held[1]:
                    self._latest[key] = (record.axis, record.step, float(value))
            # The step after its values: a scrape that sees the step sees what was logged at it.
            if record.axis is None and (self._step is None or record.step >= self._step):
                self._step = record.step

    def samples(self) -> Iterator[tuple[str, str, float]]:
        """(gauge name, original key, value) for every key held, and the step."""
        if self._step is not None:
            yield STEP_GAUGE, "step", float(self._step)
        for key, (_axis, _step, value) in list(self._latest.items()):
            yield prometheus_name(key), key, value

    def close(self, exit_code: int) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def where(self) -> str:
        return f"prometheus: http://{self.settings['host']}:{self.port}/metrics (scrape it while the run lives)"


class _LatestValues:
    """The registry's one collector: a gauge family per name, a series per original key."""

    def __init__(self, sink: PrometheusSink, gauge_family: Any) -> None:
        self._sink, self._family = sink, gauge_family
        self._labels = {"project": sink.run.project, "experiment": sink.run.experiment}

    def collect(self) -> Iterator[Any]:
        families: dict[str, Any] = {}
        for name, key, value in self._sink.samples():
            family = families.get(name)
            if family is None:
                family = families[name] = self._family(name, "tracklane: the latest value logged",
                                                       labels=["key", "project", "experiment"])
            family.add_metric([key, self._labels["project"], self._labels["experiment"]], value)
        yield from families.values()
