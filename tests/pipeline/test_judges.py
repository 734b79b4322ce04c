"""A judge (the health rules, the reducer) emits as a sender of its own, exactly once across its actor's deaths.

The window that matters: the actor died after what it emitted was on its spool, before its own state (and the
lane's) said so. Its successor is sent the batch again, judges it again and emits the same alert (or reduced point)
again; its emitter must leave that out (it takes its predecessor's spool back: spool/logged_steps.py). Driven by hand here, so the
death lands in that window every time: the judge's states are put back to before the batch, then the actor killed.
"""

from __future__ import annotations

import math
import os
import time

import pytest
import ray

from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.records import Batch, Metrics, Reduction, RunSpec
from tracklane.core.reduction import PART
from tracklane.shipping.hub import ProducerHub, ProducerSpec
from tracklane.shipping.lane_actor import LaneActor
from tracklane.wire.ack import unpack_ack
from tracklane.wire.batch import encode_batch
from tracklane.wire.opening import LaneOpening
from tracklane.workers.testing.memory import memory_records

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

RUN = RunSpec(project="p", experiment="e", run_id="judge-test")


def _opening(backend: str, settings: dict, state_dir: str) -> bytes:
    return LaneOpening(backend=backend, run=RUN, settings=settings, state_dir=state_dir, sink_retries=1,
                       retry_backoff_s=0.0).pack()


def _nan_at(step: int) -> bytes:
    values = {"actor/pg_loss": math.nan, "actor/entropy": 1.0}
    return encode_batch(Batch(seq=1, created=time.time(), records=[Metrics(step=step, time=time.time(), values=values)]))


def _step_one_reduced() -> bytes:
    """Rank 0's contribution to step 1 and a metric at step 2: step 1 is complete."""
    now = time.time()
    records = [Reduction(step=1, time=now, role=PART, values={"r/sum": 2.0}, op="sum", only=["reduce"]),
               Metrics(step=2, time=now, values={"loss": 1.0})]
    return encode_batch(Batch(seq=1, created=now, records=records))


@pytest.mark.parametrize(("judge", "settings", "batch", "key"), [
    ("health", {"rules": {}}, _nan_at(4), (4, "tracklane/alert/non_finite")),
    ("reduce", {"timeout_s": 60.0}, _step_one_reduced(), (1, "r/sum")),
], ids=["health", "reduce"])
def test_a_judge_killed_between_its_spool_and_its_state_emits_once(tmp_path, judge, settings, batch, key):
    lanes = str(tmp_path / "lanes")
    from tracklane.workers.sinks.memory import MemorySink

    settings = MemorySink.resolve(RUN, {}, {"memory_sink": {"dir": str(tmp_path / "memory")}})
    memory = ray.remote(max_restarts=0)(LaneActor).remote("memory", _opening("memory", settings, lanes))
    hub_name = f"judge-test-hub-{judge}"
    hub = ray.remote(num_cpus=0)(ProducerHub).options(name=hub_name).remote()
    cfg = AsyncLogConfig(spool_dir=str(tmp_path / "spool"), flush_interval_s=0.05)
    spec = ProducerSpec(lanes={"memory": memory}, hub=hub, cfg=cfg, limits=RecordLimits(), run=("", 0.0))
    state = os.path.join(lanes, f"{judge}.judge")
    ray.get(hub.hold_spec.remote(judge, spec))
    actor = ray.remote(max_restarts=3, max_task_retries=0)(LaneActor).remote(
        judge, _opening(judge, {**settings, "state_path": state}, lanes), hub_name)

    first = unpack_ack(ray.get(actor.apply.remote(1, 0, batch)))  # it emits the alert, or the point
    assert first.handed == 1
    _wait_for(tmp_path, key)
    # the death in the window: the judge's own state and its lane's state as they were before the batch
    os.remove(state)
    os.remove(os.path.join(lanes, f"{judge}.state"))
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 60
    while True:  # Ray starts another (a new pid): it is sent the batch again, judges it again
        assert time.monotonic() < deadline, "the judge's actor was not restarted"
        try:
            ack = unpack_ack(ray.get(actor.apply.remote(1, 0, batch), timeout=10))
            if ack.pid != first.pid:
                break
        except ray.exceptions.RayError:  # restarting (unavailable, dead for now) or slow to answer
            pass
        time.sleep(0.2)
    assert ack.handed == 1
    ray.get(actor.close.remote(0))
    time.sleep(1.0)  # anything it emitted twice would have reached the memory tracker by now
    ray.get(memory.close.remote(0))
    assert _points(tmp_path).count(key) == 1, _points(tmp_path)


def _points(tmp_path) -> list[tuple[int, str]]:
    return [(r.step, k) for r in memory_records(RUN.run_id, str(tmp_path / "memory")) if isinstance(r, Metrics)
            for k in r.values]


def _wait_for(tmp_path, key: tuple[int, str]) -> None:
    deadline = time.monotonic() + 30
    while key not in _points(tmp_path):
        assert time.monotonic() < deadline, f"the judge's {key} never reached the memory tracker"
        time.sleep(0.1)


def test_what_a_judge_could_not_deliver_is_replayed_with_the_spool(tmp_path):
    """The memory tracker is down for the whole run: the reduce judge's points wait in its own spool folder. A
    ``tracklane replay --to memory`` (no judge in that delivery) delivers them with rank 0's batches, each once."""
    from tracklane import Tracking
    from tracklane.cli.replay import replay_spool

    down = tmp_path / "down"
    down.touch()
    config = {"trainer": {"log_async": True, "memory_sink": {"dir": str(tmp_path / "memory"), "down_while": str(down)},
                          "async_log": {"flush_interval_s": 0.05, "reductions": True, "sink_retries": 0,
                                        "retry_backoff_s": 0.01, "spool_dir": str(tmp_path / "spool")}}}
    tracking = Tracking("judges", "replay", ["memory"], config=config)
    for step in range(5):
        tracking.log({"r/sum": float(step)}, step=step, reduce="sum")
    report = tracking.finish(timeout=8)
    assert not report.complete and report.spool is not None
    assert not [key for key in _points(tmp_path) if key[1] == "r/sum"]  # nothing arrived: the tracker is down
    down.unlink()
    assert replay_spool(report.spool.directory, to=["memory"], exit_code=0, timeout=60, progress=False) == 0
    assert sorted(key for key in _points(tmp_path) if key[1] == "r/sum") == [(step, "r/sum") for step in range(5)]
