"""A producer SIGKILLed right after shipping loses nothing it shipped: rank 0 delivers its spool.

The fault that needs it: MLflow is unreachable (a cut loopback proxy in front of a real ``mlflow server``)
while a producer in a Ray actor logs, so its MLflow lane still holds every batch when the actor's process
is SIGKILLed 1 s after its last log() call. The Ray objects it owned die with it; its spool folder stays.
Once MLflow is back, every point is in MLflow and in the file tracker exactly once, and the report
names the producer as dead with its batches delivered by rank 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
import ray

from tracklane import Tracking
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, producer) -> None:
        self.producer = producer

    def pid(self) -> int:
        return os.getpid()

    def run(self, steps: int) -> None:
        for step in range(steps):
            self.producer.log({"reward": 1000.0 + step}, step=step)
            time.sleep(0.002)



@pytest.mark.slow
def test_a_producer_killed_after_shipping_loses_nothing(mlflow_proxy, mlflow_server_uri, offline_trackers):
    config = {"trainer": {"log_async": True, "async_log": {
        "flush_interval_s": 0.05, "sink_retries": 0, "retry_backoff_s": 0.05, "max_retry_backoff_s": 0.5}}}
    tracking = Tracking("durable-producer", "exp", ["file", "mlflow"], config=config)
    assert tracking.flush(60.0).complete  # both trackers open before MLflow goes away
    worker = Worker.remote(tracking.producer("roll", key_prefix=""))
    pid = ray.get(worker.pid.remote())
    mlflow_proxy.cut()
    ray.get(worker.run.remote(200))
    time.sleep(1.0)  # shipped (flush_interval 0.05 s) and spooled; MLflow has none of it
    os.kill(pid, signal.SIGKILL)
    time.sleep(2.0)  # rank 0 finds the folder unlocked and re-sends; MLflow still down
    mlflow_proxy.restore()
    report = tracking.finish()

    (producer,) = report.producers.values()
    assert producer.died and producer.redelivered_batches > 0, report.summary()
    assert (producer.logged, producer.unshipped, producer.lanes_behind) == (200, 0, []), report.summary()
    assert report.complete, report.summary()
    assert "delivered by rank 0" in report.summary()

    want = Counter((step, 1000.0 + step) for step in range(200))
    [run_id] = find_mlflow_run_ids(mlflow_server_uri, "durable-producer", "exp")
    stored = Counter((s, v) for s, k, v in read_mlflow_run(mlflow_server_uri, run_id).points if k == "reward")
    assert stored == want
    lines = [json.loads(line) for line in open(offline_trackers["file"], encoding="utf-8")]
    in_file = [(line["step"], line["data"]["reward"]) for line in lines if "reward" in line["data"]]
    assert Counter(in_file) == want
    assert [s for s, _ in in_file] == sorted(s for s, _ in in_file)  # its order kept
    assert not os.listdir(os.path.join(report.spool.directory, "producers"))  # delivered: its folder is gone
