"""Logging into one run from Ray actors: ``Tracking.producer()``; every point read back from TensorBoard
and the file logger, each producer's order kept, what a dead producer lost counted."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import ray

from tracklane import ConfigError, Tracking, ValidationGenerationsLogger
from tracklane.workers.testing.memory import memory_records
from tracklane.workers.testing.readers.file_reader import file_lines
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir
from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(600)]


def _config(**async_log) -> dict:
    return {"trainer": {"log_async": True, "async_log": {"flush_interval_s": 0.05, **async_log}}}


@ray.remote(num_cpus=0)
class Worker:
    """A rollout worker of the job: logs its own keys through the producer it was given."""

    def __init__(self, producer) -> None:
        self.producer = producer

    def run(self, steps: int, index: int, flush: bool = True) -> dict:
        costs = []
        for step in range(steps):
            started = time.perf_counter()
            self.producer.log({"reward": index * 1000.0 + step, "length": float(step % 7)}, step=step)
            costs.append(time.perf_counter() - started)
        cost_us = sorted(costs)[len(costs) // 2] * 1e6  # the median: the first call starts the shipper
        flushed = self.producer.flush(60.0) if flush else None
        return {"cost_us": cost_us, "flushed": flushed, "sender": self.producer.sender}

    def generations(self, step: int) -> None:
        ValidationGenerationsLogger(producer=self.producer).log(["memory", "wandb"],
                                                                 [("1+1=", "2", 1.0), ("2+2=", "5", 0.0)], step)
        self.producer.flush(60.0)


@ray.remote(num_cpus=0)
class LateWorker:
    """Logs the given steps in the given order (a rollout worker behind the trainer, out of order)."""

    def __init__(self, producer) -> None:
        self.producer = producer

    def run(self, steps: list[int]) -> None:
        for step in steps:
            self.producer.log({"loss": step / 8}, step=step)
        self.producer.flush(60.0)


def _file_points(path) -> list[tuple[int, str, float]]:
    lines = file_lines(path)  # verl's lines and tracklane's beside them (a producer's own axis is there)
    return [(line["step"], key, value) for line in lines if line["step"] is not None
            for key, value in line["data"].items() if not key.startswith("tracklane/")]


@pytest.mark.slow
def test_four_producers_and_the_trainer_land_every_point_once(offline_trackers):
    """4 Ray actors log 300 steps each through their producers while rank 0 logs its own; TensorBoard and the
    file hold every point exactly once, each producer's steps in order, and the report counts each producer."""
    tracking = Tracking("p", "producers", ["tensorboard", "file"], config=_config())
    workers = [Worker.remote(tracking.producer(f"worker{i}")) for i in range(4)]
    runs = [worker.run.remote(300, i) for i, worker in enumerate(workers)]
    for step in range(300):
        tracking.log({"trainer/loss": float(step)}, step=step)
    results = ray.get(runs)
    report = tracking.finish()
    assert report.complete, report.summary()
    assert all(r["flushed"] for r in results)
    assert {p.name for p in report.producers.values()} == {f"worker{i}" for i in range(4)}
    assert all(p.logged == p.shipped == 300 for p in report.producers.values()), report.summary()

    want = {(s, "trainer/loss", float(s)) for s in range(300)}
    want |= {(s, f"worker{i}/reward", i * 1000.0 + s) for i in range(4) for s in range(300)}
    want |= {(s, f"worker{i}/length", float(s % 7)) for i in range(4) for s in range(300)}
    board = [(s, k, v) for s, k, v in read_tensorboard_dir(offline_trackers["tensorboard"]).points
             if not k.startswith("tracklane/")]
    for points in (board, _file_points(offline_trackers["file"])):
        assert len(points) == len(set(points)) == len(want)
        assert set(points) == want
    for i in range(4):  # each producer's order, as the file logger appended its lines
        steps = [s for s, k, _ in _file_points(offline_trackers["file"]) if k == f"worker{i}/reward"]
        assert steps == sorted(steps)
    print("producer log() cost, us per call:", [round(r["cost_us"], 1) for r in results])
    for worker in workers:
        ray.kill(worker)


@pytest.mark.slow
def test_finish_waits_for_what_producers_shipped(offline_trackers):
    """Producers that never flush: finish() still finds their shipped batches in every lane before closing."""
    tracking = Tracking("p", "no-flush", ["file"], config=_config())
    workers = [Worker.remote(tracking.producer(f"w{i}", key_prefix="")) for i in range(2)]
    ray.get([worker.run.remote(200, i, False) for i, worker in enumerate(workers)])
    time.sleep(1.0)  # shipped (flush_interval 0.05 s) and reported (every 0.25 s)
    report = tracking.finish()
    assert report.complete, report.summary()
    points = _file_points(offline_trackers["file"])
    assert sorted((s, v) for s, k, v in points if k == "reward") == sorted(
        (s, i * 1000.0 + s) for i in range(2) for s in range(200))
    for worker in workers:
        ray.kill(worker)


@pytest.mark.slow
def test_a_killed_producer_loses_only_its_unshipped_tail_and_it_is_counted(offline_trackers):
    """A producer ships 100 steps, then logs 50 more that its (slow) shipper has not sent when its actor is
    killed: the 100 arrive once, the 50 are counted as not shipped, and the run is reported incomplete."""
    tracking = Tracking("p", "killed", ["file"], config=_config(flush_interval_s=60.0))
    worker = Worker.remote(tracking.producer("doomed", key_prefix=""))
    assert ray.get(worker.run.remote(100, 1))["flushed"]
    ray.get(worker.run.remote(50, 2, False))
    time.sleep(1.0)  # reported to the hub
    ray.kill(worker)
    report = tracking.finish()
    (producer,) = report.producers.values()
    assert (producer.logged, producer.shipped, producer.unshipped) == (150, 100, 50), report.summary()
    assert not report.complete and "50 not shipped" in report.summary()
    assert sorted(s for s, k, _ in _file_points(offline_trackers["file"]) if k == "reward") == list(range(100))


def test_validation_generations_from_a_producer(offline_trackers):
    """ValidationGenerationsLogger inside a Ray actor, given a producer, lands its samples in the run."""
    tracking = Tracking("p", "val", ["memory"], config=_config())
    worker = Worker.remote(tracking.producer("rollouter"))
    ray.get(worker.generations.remote(7))
    report = tracking.finish()
    assert report.complete, report.summary()
    (record,) = [r for r in memory_records(tracking.run_id) if r.kind == "generations"]
    assert (record.key, record.step) == ("rollouter/val/generations", 7)
    assert [tuple(sample) for sample in record.samples] == [("1+1=", "2", 1.0), ("2+2=", "5", 0.0)]
    ray.kill(worker)


@pytest.mark.slow
def test_a_producer_pickles_without_records_and_needs_the_async_path(offline_trackers):
    """Only the spec travels (no buffer, no records); the synchronous path refuses producers clearly."""
    tracking = Tracking("p", "spec", ["file"], config=_config())
    producer = tracking.producer("x")
    producer.log({"a": np.float64(1.0)}, step=0)
    state = producer.__getstate__()
    assert set(state) == {"name", "key_prefix", "axis", "spec"}
    copy = pickle.loads(pickle.dumps(producer))  # as Ray would pass it (cloudpickle builds on this)
    assert copy.sender == "" and copy.key_prefix == "x/"
    assert producer.flush(30.0) and producer.close(30.0)
    tracking.finish()
    for tracking, name, error in ((Tracking("p", "sync", ["file"]), "x", "log_async: true"),
                                  (Tracking("p", "bad", ["file"], config=_config()), "a b", "producer name")):
        with pytest.raises(ConfigError, match=error):
            tracking.producer(name)
        if name == "a b":
            with pytest.raises(ConfigError, match="producer axis"):
                tracking.producer("x", axis="bad axis")
        tracking.finish()


@pytest.mark.slow
def test_steps_out_of_order_from_two_producers_all_reach_wandb_and_tensorboard(offline_trackers):
    """The trainer logs 200 steps first; then two producers log the same steps shuffled, one on the trainer's
    axis (all behind it), one on its own axis ``rollout/step``: wandb (which drops any step below its newest)
    keeps every point at its step, as do TensorBoard and the file."""
    import random

    tracking = Tracking("p", "late", ["wandb", "tensorboard", "file"], config=_config())
    for step in range(200):
        tracking.log({"trainer/loss": float(step)}, step=step)
    tracking.flush(60.0)  # handed to every tracker (wandb's own store may still hold them in memory)
    orders = [random.Random(seed).sample(range(200), 200) for seed in (1, 2)]
    workers = [LateWorker.remote(tracking.producer("behind")),
               LateWorker.remote(tracking.producer("rollout", axis="rollout/step"))]
    ray.get([worker.run.remote(order) for worker, order in zip(workers, orders, strict=True)])  # flushed (handed on)
    report = tracking.finish()
    assert report.complete, report.summary()
    assert report.lanes["wandb"].cuts == {}

    want = {(s, "trainer/loss", float(s)) for s in range(200)}
    want |= {(s, f"{name}/loss", s / 8) for name in ("behind", "rollout") for s in range(200)}
    wandb_points = [(s, k, v) for s, k, v in read_wandb_run(offline_trackers["wandb"]).points
                    if not k.startswith("tracklane/")]
    board = [(s, k, v) for s, k, v in read_tensorboard_dir(offline_trackers["tensorboard"]).points
             if not k.startswith("tracklane/")]
    for points in (wandb_points, board, _file_points(offline_trackers["file"])):
        assert len(points) == len(set(points)) == len(want)
        assert set(points) == want
    lines = file_lines(offline_trackers["file"])
    assert {line.get("axis") for line in lines if "rollout/loss" in line["data"]} == {"rollout/step"}
    for worker in workers:
        ray.kill(worker)


@pytest.mark.slow
def test_system_metrics_of_each_node_reach_every_tracker_on_their_own_axis(offline_trackers):
    """With system_metrics_s=1 the trainer's node is sampled once a second from when the trackers are open (one
    sampler per node: a producer on the same node does not sample it again), on the axis ``system/elapsed_s``,
    apart from the training steps."""
    from tracklane.node.system_metrics import node_label

    tracking = Tracking("p", "system", ["wandb", "tensorboard", "file"], config=_config(system_metrics_s=1))
    assert tracking.wait_ready(120.0)
    worker = LateWorker.remote(tracking.producer("worker"))
    for step in range(30):
        tracking.log({"trainer/loss": float(step)}, step=step)
        time.sleep(0.1)
    ray.get(worker.run.remote([0, 1]))
    report = tracking.finish()
    assert report.complete, report.summary()

    node = node_label(ray.get_runtime_context().get_node_id())
    lines = file_lines(offline_trackers["file"])
    system = [line for line in lines if line.get("axis") == "system/elapsed_s"]
    assert len(system) >= 3  # ~3 s of samples, the first at 0 s
    assert {key.split("/")[1] for line in system for key in line["data"]} == {node}
    assert {f"system/{node}/cpu/percent", f"system/{node}/memory/used_gb"} <= set(system[0]["data"])
    seconds = [line["step"] for line in system]
    assert seconds == sorted(set(seconds))  # one sample a second, seconds since the pipeline started
    cpu = f"system/{node}/cpu/percent"
    want = {(line["step"], line["data"][cpu]) for line in system}
    board = {(s, v) for s, k, v in read_tensorboard_dir(offline_trackers["tensorboard"]).points if k == cpu}
    assert {s for s, _ in board} == {s for s, _ in want}  # TensorBoard keeps float32
    assert {(s, v) for s, k, v in read_wandb_run(offline_trackers["wandb"]).points if k == cpu} == want
    trainer = [(s, k) for s, k, _ in read_wandb_run(offline_trackers["wandb"]).points if k == "trainer/loss"]
    assert sorted(trainer) == [(s, "trainer/loss") for s in range(30)]
    ray.kill(worker)
