"""The Prometheus alerting rules shipped with the package (pipeline/alerting/prometheus_rules.yml): promtool checks
them and runs their unit tests, and a real Prometheus loaded with them fires while a run with health rules goes
wrong, read back through its ``/api/v1/alerts``."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tracklane import Tracking
from tracklane.alerting import RULES_FILE
from tracklane.testing import prometheus_server
from tracklane.testing.server_process import free_port

RULE_TESTS = Path(__file__).with_name("prometheus_rules_test.yml")
REQUIRE_SERVER = os.environ.get("TRACKLANE_REQUIRE_SYSTEM_SERVERS") == "1"  # .ci/run: a missing binary fails


def _need(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        if REQUIRE_SERVER:
            pytest.fail(f"TRACKLANE_REQUIRE_SYSTEM_SERVERS=1 but no {program} (apt-get install -y prometheus)")
        pytest.skip(f"no {program} here (apt-get install -y prometheus); .ci/run installs it")
    return found


def test_promtool_checks_the_shipped_rules_and_runs_their_tests():
    """``promtool check rules`` on the shipped file, then ``promtool test rules``: each rule fires on its pathology,
    at the time its ``for:`` says, with its labels and summary, and not before."""
    promtool = _need("promtool")
    assert RULES_FILE.is_file()
    for command in (["check", "rules", str(RULES_FILE)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run([promtool, *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"promtool {' '.join(command)}:\n{done.stdout}\n{done.stderr}"
        assert "SUCCESS" in done.stdout


def test_a_real_prometheus_fires_the_shipped_rules_during_a_run(tmp_path, offline_trackers, ray_session):
    """A run serving its gauges to a real Prometheus loaded with the shipped rules: a NaN pg_loss and a KL above 1
    fire the run's health rules, and Prometheus' /api/v1/alerts shows TracklaneHealthAlert firing for each rule (and
    TracklaneNonFinite while the NaN is the latest loss) while the run lives; before them, nothing fires."""
    _need("prometheus")
    port = free_port()
    proc, url = prometheus_server.start_server(tmp_path / "prometheus", [f"127.0.0.1:{port}"], [RULES_FILE])
    config = {"trainer": {"log_async": True, "prometheus": {"port": port}, "async_log": {"flush_interval_s": 0.1},
                          "health": {"enabled": True}}}
    tracking = Tracking("proj", "alerting", ["prometheus"], config=config)
    try:
        healthy = {"actor/entropy": 1.0, "actor/kl_loss": 0.01, "actor/pg_loss": -0.1, "actor/grad_norm": 0.5}
        for step in range(1, 6):
            tracking.log(healthy, step=step)
        tracking.flush(timeout=60)
        time.sleep(3)  # three scrapes and evaluations of the healthy run
        assert prometheus_server.alerts(url) == []
        tracking.log({**healthy, "actor/pg_loss": math.nan}, step=6)
        for step in range(7, 10):
            tracking.log({**healthy, "actor/pg_loss": math.nan if step == 9 else -0.1, "actor/kl_loss": 5.0}, step=step)
        tracking.flush(timeout=60)
        wanted = {("TracklaneHealthAlert", "non_finite"), ("TracklaneHealthAlert", "kl_blowup"),
                  ("TracklaneNonFinite", None)}
        firing: set[tuple[str, str | None]] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not wanted <= firing:
            firing = {(a["labels"]["alertname"], a["labels"].get("rule")) for a in prometheus_server.alerts(url)
                      if a["state"] == "firing" and a["labels"].get("experiment") == "alerting"}
            time.sleep(0.5)
        assert wanted <= firing, firing
        by_name = {a["labels"]["alertname"]: a for a in prometheus_server.alerts(url)}
        assert by_name["TracklaneNonFinite"]["labels"]["key"] == "actor/pg_loss"
        assert "TracklaneKLBlowup" not in {name for name, _ in firing}  # its for: 2m has not passed
    finally:
        report = tracking.finish()
        prometheus_server.stop_server(proc)
    assert {line.split(" at step ")[0] for line in report.alerts} == {"non_finite", "kl_blowup"}


def test_the_cli_prints_where_the_rules_are():
    """``tracklane alert-rules``: the installed file's path, for a prometheus.yml's rule_files."""
    import sys

    done = subprocess.run([sys.executable, "-m", "tracklane", "alert-rules"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == RULES_FILE and RULES_FILE.read_text().startswith("# tracklane's health rules")
