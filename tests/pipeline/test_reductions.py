"""Metrics reduced across producers (``log(..., reduce=...)``), read back from every tracker's own store (prometheus
keeps only each key's latest value, not a history to compare: tests/trackers/test_prometheus_sink.py).

Four Ray actors log the same keys at every step with each op; the values are chosen so every op's result is
known (worker i logs ``s + i`` at step s). Every tracker must hold exactly one point per key and step, equal to
the op over the workers that logged it, with the reduce lane's actor killed mid-run and one worker killed after
step ``KILL_AFTER`` (left out from the next step on, and the report says so).
"""

from __future__ import annotations

import time

import pytest
import ray

from tests.verl_stores import TRACKERS, RunStores, Stored, file_points
from tracklane import Tracking

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(600)]

STEPS, WORKERS, KILL_AFTER, KILLED = 200, 4, 119, 2
OPS = {"r/mean": "mean", "r/sum": "sum", "r/min": "min", "r/max": "max", "r/count": "count", "t/sum": "sum"}
"""Each worker logs ``step + i`` under the r/ keys and 1 under t/sum, which rank 0 logs too."""


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, producer, index: int) -> None:
        self.producer, self.index = producer, index

    def run(self, first: int, last: int) -> str:
        for step in range(first, last + 1):
            value = float(step + self.index)
            self.producer.log({**dict.fromkeys(OPS, value), "t/sum": 1.0}, step=step, reduce=OPS,
                              keep_per_producer=step % 2 == 0)
            self.producer.log({"own": value}, step=step)
            time.sleep(0.002)
        self.producer.flush(60.0)
        return self.producer.sender


def expected(step: int, workers: list[int]) -> dict[str, float]:
    values = [float(step + i) for i in workers]
    return {"r/mean": sum(values) / len(values), "r/sum": sum(values), "r/min": min(values), "r/max": max(values),
            "r/count": float(len(values)), "t/sum": float(len(values) + 1)}


def reduced(stored: Stored) -> dict[tuple[int, str], float]:
    return {(step, key): value for (step, key), value in stored.points.items() if key in OPS}


@pytest.mark.slow
def test_four_producers_reduce_each_op_once_into_every_tracker(tmp_path, offline_trackers, capfd, monkeypatch):
    stores = RunStores(tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "trackio")
    for key, value in stores.env().items():
        monkeypatch.setenv(key, value)
    stores.prepare()
    config = {"trainer": {"log_async": True, "async_log": {
        "flush_interval_s": 0.05, "reductions": True, "spool_dir": str(tmp_path / "spool")}}}
    tracking = Tracking("reduce", "four", [*TRACKERS, "clearml"], config=config)
    assert tracking.wait_ready(120)
    workers = [Worker.remote(tracking.producer(f"w{i}"), i) for i in range(WORKERS)]
    first = [w.run.remote(0, KILL_AFTER) for w in workers]
    for step in range(KILL_AFTER + 1):
        tracking.log({"trainer/loss": float(step)}, step=step)
        tracking.log({"t/sum": 1.0}, step=step, reduce="sum")
        time.sleep(0.002)
        if step == 60:  # the reduce lane's actor dies mid-run; Ray starts another, which goes on from its state
            ray.kill(tracking._pipe._lanes["reduce"][0].actor, no_restart=False)
    senders = ray.get(first)
    ray.kill(workers[KILLED])  # after its step KILL_AFTER: the others go on without it
    rest = [w.run.remote(KILL_AFTER + 1, STEPS - 1) for i, w in enumerate(workers) if i != KILLED]
    for step in range(KILL_AFTER + 1, STEPS):
        tracking.log({"trainer/loss": float(step)}, step=step)
        tracking.log({"t/sum": 1.0}, step=step, reduce="sum")
        time.sleep(0.002)
    ray.get(rest)
    report = tracking.finish(timeout=120)
    output = capfd.readouterr().out
    print(report.summary())

    assert report.lanes["reduce"].restarts >= 1, report.summary()
    assert report.reductions is not None and report.reductions.steps == STEPS, report.summary()
    assert report.reductions.late == report.reductions.conflicts == report.reductions.open_steps == 0
    assert report.reductions.left_out == {senders[KILLED]: KILL_AFTER + 1}, report.summary()
    assert f"{senders[KILLED]} left out from step {KILL_AFTER + 1}" in report.summary()
    live = [i for i in range(WORKERS) if i != KILLED]
    want = {(step, key): value for step in range(STEPS)
            for key, value in expected(step, list(range(WORKERS)) if step <= KILL_AFTER else live).items()}
    for tracker in [*TRACKERS, "clearml"]:
        stored = stores.read(tracker, "reduce", "four", output) if tracker != "clearml" else \
            _clearml(offline_trackers["clearml-cache"], tracking.run_id)
        assert not [twice for twice in stored.twice if twice[1] in OPS], (tracker, stored.twice[:5])
        got = reduced(stored)
        assert got.keys() == want.keys(), (tracker, sorted(set(want) ^ set(got))[:5])
        wrong = [(point, got[point], value) for point, value in want.items() if got[point] != pytest.approx(value)]
        assert not wrong, (tracker, wrong[:5])
        assert stored.points[(5, "w0/own")] == 5.0  # the producers' own keys still arrive, under their names
        kept = {(s, k): v for (s, k), v in stored.points.items() if k == "w1/r/max"}  # keep_per_producer
        assert kept == {(s, "w1/r/max"): float(s + 1) for s in range(0, STEPS, 2)}, tracker


def _clearml(cache, run_id: str) -> Stored:
    from tracklane.workers.testing.readers.clearml_reader import read_clearml_run

    stored = Stored()
    for step, key, value in read_clearml_run(cache, run_id=run_id).points:
        stored.add(int(step), key, float(value))
    return stored


def test_the_synchronous_path_reduces_rank0s_own_values_and_a_run_without_the_lane_counts_them(offline_trackers):
    """log_async false: the same reducer in-process (two values of rank 0 at a step: their sum, once the step is
    past; the last step at finish). Without ``reductions`` a reduce= call is skipped and counted, never raised."""
    config = {"trainer": {"log_async": False, "async_log": {"reductions": True}}}
    tracking = Tracking("reduce", "sync", ["file"], config=config)
    for step in range(3):
        tracking.log({"x": 1.0, "y": float(step)}, step=step, reduce={"x": "sum", "y": "max"})
        tracking.log({"x": 2.0, "y": -1.0}, step=step, reduce={"x": "sum", "y": "max"})
        tracking.log({"loss": 0.5}, step=step)
    report = tracking.finish()
    assert report.complete and report.reductions is not None and report.reductions.steps == 3, report.summary()
    stored = file_points(offline_trackers["file"])
    assert {k: v for k, v in stored.points.items() if k[1] in "xy"} == {
        **{(s, "x"): 3.0 for s in range(3)}, **{(s, "y"): float(max(s, -1)) for s in range(3)}}
    assert not stored.twice

    plain = Tracking("reduce", "off", ["file"], config={"trainer": {"log_async": False}})
    plain.log({"x": 1.0}, step=0, reduce="sum")
    plain.log({"x": 1.0}, step=1, reduce="median")
    assert plain.finish().rejected_records == 2
