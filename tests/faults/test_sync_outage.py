"""The synchronous path through an MLflow outage: a cuttable TCP proxy in front of a real ``mlflow server``."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections import Counter
from urllib.parse import urlsplit

import pytest

from tracklane import Tracking
from tracklane.testing.tcp_proxy import TcpProxy
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

STEP_PAUSE_S = 0.05



def _sync_tracking(project: str, retries: int, backoff_s: float) -> Tracking:
    config = {"trainer": {"log_async": False, "async_log": {"sink_retries": retries, "retry_backoff_s": backoff_s}}}
    return Tracking(project, "exp", "mlflow", config=config)


def _scalars(step: int) -> dict[str, float]:
    return {"train/loss": 1.0 / (step + 1), "train/acc": step * 0.01, "train/lr": 1e-3 * (1 + step % 3)}


def _stored(uri: str, project: str) -> tuple[list[tuple[int, str, float]], str | None]:
    """The user's (step, key, value) points of the run's one MLflow run, read from the real server, and its status."""
    [run_id] = find_mlflow_run_ids(uri, project, "exp")
    back = read_mlflow_run(uri, run_id)
    return [p for p in back.points if not p[1].startswith(("tracklane/", "tracklane_"))], back.status


def test_proxy_cuts_and_restores(mlflow_server_uri):
    """Through the proxy, GET /health answers, is refused while cut, and answers again once restored."""
    server = urlsplit(mlflow_server_uri)
    with TcpProxy(server.hostname, server.port) as proxy:
        health = f"http://{proxy.address}/health"
        with urllib.request.urlopen(health, timeout=5) as response:
            assert response.status == 200
        proxy.cut()
        with pytest.raises(OSError):  # reset at once: URLError, ConnectionResetError, RemoteDisconnected
            urllib.request.urlopen(health, timeout=5)
        assert proxy.refused == 1
        proxy.restore()
        with urllib.request.urlopen(health, timeout=5) as response:
            assert response.status == 200 and response.read() == b"OK"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_short_outage_loses_nothing(mlflow_proxy, mlflow_server_uri):
    """A 2 s outage after step 20 of 60 costs no record: the sync path's bounded retries deliver every point exactly once."""
    project = f"outage-{uuid.uuid4().hex[:8]}"
    tracking = _sync_tracking(project, retries=3, backoff_s=0.5)  # retries span 0.5 + 1 + 2 s > the outage
    restorer = threading.Timer(2.0, mlflow_proxy.restore)
    logged: dict[int, dict[str, float]] = {}
    try:
        for step in range(60):
            logged[step] = _scalars(step)
            tracking.log(logged[step], step=step)
            if step == 20:
                mlflow_proxy.cut()
                restorer.start()
            time.sleep(STEP_PAUSE_S)
        restorer.join()  # finish() (closing the run) always talks to a reachable server
        report = tracking.finish()
    finally:
        restorer.cancel()
        mlflow_proxy.restore()
    assert mlflow_proxy.refused > 0, "the outage never reached the client: the test did not test anything"

    points, status = _stored(mlflow_server_uri, project)
    counts = Counter((step, key) for step, key, _ in points)
    expected = {(step, key): value for step, values in logged.items() for key, value in values.items()}
    missing = sorted({step for step, key in expected if (step, key) not in counts})
    lane = report.lanes["mlflow"]
    assert lane.failed_records == 0 and not missing, (
        f"records lost in the outage: {lane.failed_records} failed ({lane.error}); steps missing in MLflow: {missing}")
    assert [pair for pair, n in counts.items() if n > 1] == [], "points stored more than once"
    assert lane.error is None and lane.last_error, (lane.error, lane.last_error)  # recovered: the error is history
    assert set(counts) == set(expected), f"unexpected points: {sorted(set(counts) - set(expected))[:5]}"
    assert all(value == expected[(step, key)] for step, key, value in points)
    assert status == "FINISHED"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_permanent_outage_does_not_hang(mlflow_proxy, mlflow_server_uri):
    """With MLflow cut for good mid-run, log() and finish() still return: failures are counted, earlier steps kept."""
    project = f"outage-{uuid.uuid4().hex[:8]}"
    tracking = _sync_tracking(project, retries=2, backoff_s=0.1)
    started = time.monotonic()
    for step in range(10):
        tracking.log(_scalars(step), step=step)
        if step == 4:
            mlflow_proxy.cut()  # never restored
        time.sleep(STEP_PAUSE_S)
    report = tracking.finish()
    elapsed = time.monotonic() - started
    # 5 failing writes and a failing close, each bounded by 2 retries (0.1 + 0.2 s) of requests reset
    # at once: a few seconds. Minutes would mean MLflow's own retries or timeouts are in the way.
    assert elapsed < 60, f"the sync path took {elapsed:.0f} s through a dead tracker"
    assert mlflow_proxy.refused > 0
    lane = report.lanes["mlflow"]
    assert 0 < lane.failed_records <= 5, report.summary()

    points, _ = _stored(mlflow_server_uri, project)
    assert {(step, key) for step, key, _ in points} == {(s, k) for s in range(5) for k in _scalars(s)}
