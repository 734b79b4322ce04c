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
the lane, and a little longer: at the close it keeps serving the last values until two scrapes have read them
(``trainer.prometheus.final_scrape_s`` at most; a run nobody scraped closes at once), so a short run's last steps
and an alert fired near its end reach Prometheus and its rules. After that there is nothing to scrape. A lane actor
that is restarted serves again from the next batch on (the values before it are in whatever Prometheus scraped).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tracklane.config.async_log import configured_closing_share_s
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
        # The wait for the last scrapes fits in the close's share of finish(), with room for the answer.
        close_s = configured_closing_share_s(trainer.get("async_log"))
        return {"host": chosen.host, "port": chosen.port, "final_scrape_s": min(chosen.final_scrape_s, 0.8 * close_s)}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._latest: dict[str, tuple[str | None, int, float]] = {}  # key -> (axis, step, value)
        self._step: int | None = None
        self._server: Any = None
        self.port: int = self.settings["port"]
        self._scrapes = _ScrapeCount()

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
        self._scrapes.changed()

    def samples(self) -> Iterator[tuple[str, str, float]]:
        """(gauge name, original key, value) for every key held, and the step: what a scrape reads."""
        self._scrapes.scraped()
        if self._step is not None:
            yield STEP_GAUGE, "step", float(self._step)
        for key, (_axis, _step, value) in list(self._latest.items()):
            yield prometheus_name(key), key, value

    def close(self, exit_code: int) -> None:
        if self._server is not None:
            self._scrapes.wait_for_two(self.settings["final_scrape_s"])
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def where(self) -> str:
        return f"prometheus: http://{self.settings['host']}:{self.port}/metrics (scrape it while the run lives)"


class _ScrapeCount:
    """How many scrapes have read the values since they last changed (the HTTP server's thread scrapes, the lane's
    thread writes), and a wait for two at the close."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._any = False  # has anyone scraped this run at all
        self._since_change = 0

    def changed(self) -> None:
        with self._ready:
            self._since_change = 0

    def scraped(self) -> None:
        with self._ready:
            self._any = True
            self._since_change += 1
            self._ready.notify_all()

    def wait_for_two(self, timeout_s: float) -> None:
        """Until two scrapes have read the values since their last change, ``timeout_s`` at most; at once where
        nobody has scraped: nobody is waiting for them."""
        with self._ready:
            if self._any:
                self._ready.wait_for(lambda: self._since_change >= 2, timeout=timeout_s)


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
