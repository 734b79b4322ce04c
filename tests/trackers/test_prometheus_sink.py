"""The prometheus backend: every scalar key's latest value as a gauge, scraped by a real Prometheus and read back
through its query API; ``rl_insight`` served by it where verl's rl_insight package is absent."""

from __future__ import annotations

import math
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import log_verl_steps, same_value
from tracklane import ConfigError, Tracking
from tracklane.core.records import RunSpec
from tracklane.testing import prometheus_server
from tracklane.testing.server_process import free_port
from tracklane.workers.sinks.prometheus import PrometheusSink, prometheus_name
from tracklane.workers.testing.readers.file_reader import file_points

client_parser = pytest.importorskip("prometheus_client.parser")
REQUIRE_SERVER = os.environ.get("TRACKLANE_REQUIRE_SYSTEM_SERVERS") == "1"  # .ci/run: a missing binary fails


def scrape(port: int) -> dict[tuple[str, str], float]:
    """(gauge name, original key) -> value, from the endpoint, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(sample.name, sample.labels["key"]): sample.value
            for family in client_parser.text_string_to_metric_families(text) for sample in family.samples}


def latest_in_file(path) -> dict[str, float]:
    """Each key's value at its last line in the run's file tracker (verl's JSON lines; orjson's null read as NaN)."""
    latest: dict[str, float] = {}
    for _step, key, value in file_points(path):
        latest[key] = float(value)
    return latest


def test_names_are_sanitised_and_keep_the_key_in_a_label():
    """Every character outside [a-zA-Z0-9_] becomes '_', a leading digit gets a '_' before it."""
    assert prometheus_name("actor/pg_loss") == "actor_pg_loss"
    assert prometheus_name("val-core/gsm8k/acc/mean@4") == "val_core_gsm8k_acc_mean_4"
    assert prometheus_name("0start") == "_0start"
    assert prometheus_name("tracklane/lane/mlflow/lag_s") == "tracklane_lane_mlflow_lag_s"


def test_a_bad_port_is_a_config_error():
    """trainer.prometheus.port outside 0-65535 (or not a number) stops Tracking with an error naming the setting."""
    for bad in (70000, "http"):
        with pytest.raises(ConfigError, match=r"trainer.prometheus.port must be a port number"):
            Tracking("p", "e", ["prometheus"], config={"trainer": {"prometheus": {"port": bad}}})


def test_the_endpoint_serves_each_keys_latest_value_and_the_step(offline_trackers):
    """In-process: keys that sanitise alike stay two series, NaN and ints arrive, a step logged late does not hide
    the newer value, and the endpoint closes at finish() once a second scrape has read the last values."""
    port = free_port()
    tracking = Tracking("proj", "exp", ["prometheus"],
                        config={"trainer": {"log_async": False, "prometheus": {"port": port}}})
    tracking.log({"actor/pg_loss": 0.5, "actor_pg_loss": 7, "0start": 1.0}, step=1)
    tracking.log({"actor/pg_loss": -0.25, "x/nan": float("nan")}, step=2)
    tracking.log({"actor/pg_loss": 99.0}, step=1)  # late: step 2's value stays
    got = scrape(port)
    assert got[("actor_pg_loss", "actor/pg_loss")] == -0.25
    assert got[("actor_pg_loss", "actor_pg_loss")] == 7
    assert got[("_0start", "0start")] == 1.0
    assert math.isnan(got[("x_nan", "x/nan")])
    assert got[("tracklane_step", "step")] == 2
    finished = _FinishingThread(tracking)
    finished.join(1.0)
    assert finished.is_alive(), "closed after one scrape of the last values: Prometheus may not have evaluated them"
    again = scrape(port)  # the second scrape of the last values
    assert again.keys() == got.keys() and all(same_value(again[name], got[name]) for name in got)
    finished.join(30)
    assert not finished.is_alive() and finished.report.complete
    with pytest.raises(urllib.error.URLError):
        scrape(port)


class _FinishingThread(threading.Thread):
    """``tracking.finish()`` on a thread of its own, its report kept."""

    def __init__(self, tracking: Tracking) -> None:
        super().__init__(daemon=True)
        self.tracking, self.report = tracking, None
        self.start()

    def run(self) -> None:
        self.report = self.tracking.finish()


@pytest.mark.parametrize("scraped, final_scrape_s", [(False, 60), (True, 0)])
def test_the_close_waits_for_no_scrape_nobody_is_making(offline_trackers, scraped, final_scrape_s):
    """A run nobody scraped closes at once, whatever final_scrape_s says; final_scrape_s 0 never waits."""
    port = free_port()
    tracking = Tracking("proj", "exp", ["prometheus"], config={"trainer": {
        "log_async": False, "prometheus": {"port": port, "final_scrape_s": final_scrape_s}}})
    tracking.log({"actor/pg_loss": 0.5}, step=1)
    if scraped:
        assert scrape(port)[("actor_pg_loss", "actor/pg_loss")] == 0.5
    finished = _FinishingThread(tracking)
    finished.join(30)
    assert not finished.is_alive() and finished.report.complete
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_rl_insight_is_served_by_the_prometheus_backend_where_its_package_is_absent(offline_trackers, caplog):
    """verl's rl_insight names (no rl_insight package here) run the prometheus backend, said once, and in the report."""
    port = free_port()
    tracking = Tracking("p", "e", ["file", "rl_insight"],  # final_scrape_s 0: this test scrapes once, no more
                        config={"trainer": {"log_async": False, "prometheus": {"port": port, "final_scrape_s": 0}}})
    assert tracking.backends == ["file", "prometheus"]
    tracking.log({"critic/score/mean": 0.75}, step=3)
    assert scrape(port)[("critic_score_mean", "critic/score/mean")] == 0.75
    report = tracking.finish()
    warned = [r.getMessage() for r in caplog.records if "backend rl_insight" in r.getMessage()]
    assert len(warned) == 1 and "served by tracklane's `prometheus` backend instead" in warned[0]
    assert report.complete and list(report.lanes) == ["file", "prometheus"]
    assert "rl_insight: served by tracklane's `prometheus` backend instead" in report.summary()
    from tracklane.trainer.config import load_config

    assert load_config(["trainer.logger=[console,rl_insight]"]).trainer.logger == ["console", "rl_insight"]


def test_the_wait_for_the_last_scrapes_fits_in_finishs_close():
    """final_scrape_s as set, or env, held to 4/5 of the close's share of finish_timeout_s (a quarter, <= 15 s)."""
    run = RunSpec(project="p", experiment="e")

    def wait(trainer, env=None):
        return PrometheusSink.resolve(run, env or {}, trainer)["final_scrape_s"]

    assert wait({}) == 10.0  # finish_timeout_s 60: 15 s to close
    assert wait({}, {"TRACKLANE_PROMETHEUS_FINAL_SCRAPE_S": "4"}) == 4.0
    assert wait({"async_log": {"finish_timeout_s": 10}}) == pytest.approx(2.0)
    assert wait({"async_log": {"finish_timeout_s": 600}, "prometheus": {"final_scrape_s": 30}}) == pytest.approx(12.0)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping one loopback port every second: (its url, the port it scrapes)."""
    if prometheus_server.binary() is None:
        if REQUIRE_SERVER:
            pytest.fail("TRACKLANE_REQUIRE_SYSTEM_SERVERS=1 but no prometheus binary (apt-get install -y prometheus)")
        pytest.skip("no prometheus binary here (apt-get install -y prometheus); .ci/run installs it")
    target = free_port()
    proc, url = prometheus_server.start_server(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{target}"])
    try:
        yield url, target
    finally:
        prometheus_server.stop_server(proc)


def test_a_real_prometheus_scrapes_every_scalar_key_of_an_async_run(prometheus, offline_trackers, ray_session):
    """A lane actor serves the run (~100 verl keys a step, tracklane/* included); Prometheus' query API returns each
    key's last logged value, as the run's file tracker holds it, under the sanitised name with the key label."""
    url, port = prometheus
    config = {"trainer": {"log_async": True, "prometheus": {"port": port}, "async_log": {"flush_interval_s": 0.2}}}
    tracking = Tracking("proj", "scraped", ["prometheus", "file"], config=config)
    logged = log_verl_steps(tracking, 30)
    assert tracking.flush(timeout=60)
    expected = latest_in_file(offline_trackers["file"])
    assert {key: expected[key] for key in logged[29]} == pytest.approx(logged[29], nan_ok=True)
    assert any(key.startswith("tracklane/") for key in expected)
    deadline, got = time.monotonic() + 30, {}
    while time.monotonic() < deadline:  # Prometheus scrapes each second: wait for the scrape after the last batch
        got = {sample["metric"]["key"]: (sample["metric"]["__name__"], float(sample["value"][1]))
               for sample in prometheus_server.query(url, '{experiment="scraped", project="proj"}')}
        if all(key in got and same_value(got[key][1], value) for key, value in expected.items()):
            break
        time.sleep(0.5)
    tracking.finish()
    missing = sorted(set(expected) - set(got))
    assert not missing, f"keys Prometheus never scraped: {missing[:10]}"
    wrong = {key: (got[key][1], value) for key, value in expected.items() if not same_value(got[key][1], value)}
    assert not wrong, f"Prometheus holds other values than the run logged last: {dict(list(wrong.items())[:10])}"
    assert {key: name for key, (name, _) in got.items() if key != "step"} == {key: prometheus_name(key) for key in expected}
    assert got["step"] == ("tracklane_step", 29.0)
