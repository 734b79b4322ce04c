"""``trainer.async_log.max_outage_s``: a tracker down longer than that has its records counted failed instead of
held (and not kept for replay: the setting says they may go), so ``finish()`` does not wait on it; the other
trackers get everything.

MLflow goes down (a cut loopback proxy in front of the session's real ``mlflow server``) after the run opened it,
for longer than ``max_outage_s``, while the trainer logs."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tracklane import Tracking
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

STEPS = 40
MAX_OUTAGE_S = 1.5
FINISH_TIMEOUT_S = 120.0  # 3/4 of it for draining: what finish() would wait without max_outage_s


def config(max_outage_s: float) -> dict:
    return {"trainer": {"log_async": True, "async_log": {
        "flush_interval_s": 0.05, "sink_retries": 0, "retry_backoff_s": 0.05, "max_retry_backoff_s": 0.2,
        "max_outage_s": max_outage_s, "finish_timeout_s": FINISH_TIMEOUT_S}}}


def test_a_tracker_down_past_max_outage_s_is_counted_failed_not_waited_for(mlflow_proxy, mlflow_server_uri,
                                                                         offline_trackers):
    project = f"max-outage-{uuid.uuid4().hex[:8]}"  # the session's server may hold an earlier run's
    tracking = Tracking(project, "exp", ["file", "mlflow"], config=config(MAX_OUTAGE_S))
    assert tracking.flush(60.0).complete  # MLflow opened before it goes away
    mlflow_proxy.cut()
    for step in range(STEPS):
        tracking.log({"reward": float(step)}, step=step)
        time.sleep(3 * MAX_OUTAGE_S / STEPS)  # the outage outlasts max_outage_s while the trainer logs
    started = time.monotonic()
    report = tracking.finish()
    took = time.monotonic() - started
    mlflow_proxy.restore()

    mlflow, file = report.lanes["mlflow"], report.lanes["file"]
    assert not report.complete and mlflow.failed_records > 0, report.summary()
    assert file.failed_records == 0 and file.dropped_records == 0, report.summary()
    # each batch is tried once more and counted, not held until the drain's deadline
    assert took < 0.75 * FINISH_TIMEOUT_S, f"finish() waited {took:.1f} s on a tracker past max_outage_s"
    lines = [json.loads(line) for line in open(offline_trackers["file"], encoding="utf-8")]
    assert sorted(line["step"] for line in lines if "reward" in line["data"]) == list(range(STEPS))
    [run_id] = find_mlflow_run_ids(mlflow_server_uri, project, "exp")
    stored = [s for s, k, _ in read_mlflow_run(mlflow_server_uri, run_id).points if k == "reward"]
    assert len(stored) < STEPS and len(set(stored)) == len(stored)  # what MLflow lacks was counted, none twice
    print(f"finish() took {took:.1f} s; MLflow holds {len(stored)} of {STEPS} steps; {mlflow.failed_records} failed")
