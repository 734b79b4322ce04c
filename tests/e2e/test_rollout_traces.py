"""verl's rollout traces through tracklane: verl 0.9.1's own ``rollout_trace_op`` / ``rollout_trace_attr`` in a Ray
rollout worker (set up as verl's ``AgentLoopWorker`` does: ``RolloutTraceConfig.init`` from the trace config, each
sample's agent loop under ``rollout_trace_attr``), with the drop-in installed first (as Ray's
``worker_process_setup_hook`` would) and the trainer's async ``Tracking`` naming a trace backend in its config.

- trackio: what verl's own trackio path stores for the same calls (run beside it, without the drop-in) is what
  tracklane stores, trace by trace (key, step, messages, metadata), plus each call's start and end; the file
  tracker and ``tracklane view`` hold every trace too.
- MLflow down (a cut loopback proxy) and the rollout worker SIGKILLed after its producer spooled: once MLflow is
  back, every trace is in MLflow (linked to the run) and in the file exactly once, and the viewer shows each.
- ``RLInsightLogger.trace_state`` spans (``VERL_RL_INSIGHT_ENABLE=1``) become traces of the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter

import pytest
import ray
from verl.utils.rollout_trace import rollout_trace_attr, rollout_trace_op

from tests.trace_stores import file_traces, mlflow_calls
from tracklane import Tracking
from tracklane.view.run_data import RunData
from tracklane.workers.testing.readers.trackio_reader import read_trackio_run

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

STEPS = (1, 2)
SAMPLES, ROLLOUTS = 2, 2
OPS_PER_ROLLOUT = 4  # the agent loop, two generate calls, one tool call
TRACES = len(STEPS) * SAMPLES * ROLLOUTS * OPS_PER_ROLLOUT
ADDED = ("tracklane",)  # what tracklane adds to verl's trace metadata (the call's start, end and worker)


# -- the rollout side: verl's tracing decorators on a toy agent loop, as verl's agent loops use them ----------------
class ToyServerManager:
    @rollout_trace_op
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> dict:
        await asyncio.sleep(0.001)
        return {"token_ids": [t + 1 for t in prompt_ids], "response_text": f"reply to {request_id}",
                "log_probs": [-0.5] * len(prompt_ids)}


class ToyTool:
    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict) -> tuple[str, float]:
        if parameters.get("fail"):
            raise ValueError(f"tool failed for {instance_id}")
        return f"result {parameters['x'] * 2} ✓", 0.5


class ToyToolAgentLoop:
    def __init__(self) -> None:
        self.server, self.tool = ToyServerManager(), ToyTool()

    @rollout_trace_op
    async def run(self, sampling_params: dict, messages: list[dict], fail_tool: bool) -> dict:
        first = await self.server.generate("a", prompt_ids=[1, 2, 3], sampling_params=sampling_params)
        try:
            result = await self.tool.execute("t0", {"x": 21, "fail": fail_tool})
        except ValueError as exc:
            result = (str(exc), 0.0)
        second = await self.server.generate("b", prompt_ids=[4, 5], sampling_params=sampling_params)
        return {"num_turns": 3, "response_text": first["response_text"] + second["response_text"],
                "tool_result": result[0]}


def failing(step: int, sample: int, rollout: int) -> bool:
    return (step, sample, rollout) == (2, 1, 0)


async def rollout_step(step: int) -> None:
    """One step's rollouts: each sample's agent loop under ``rollout_trace_attr``, as verl's ``_run_agent_loop``."""
    async def one(sample: int, rollout: int) -> None:
        with rollout_trace_attr(step=step, sample_index=sample, rollout_n=rollout, validate=False, name="agent_loop"):
            messages = [{"role": "user", "content": f"step {step}: double 21 for sample {sample}"}]
            await ToyToolAgentLoop().run({"temperature": 1.0}, messages, failing(step, sample, rollout))

    await asyncio.gather(*(one(s, r) for s in range(SAMPLES) for r in range(ROLLOUTS)))


@ray.remote(num_cpus=0)
class VerlRolloutWorker:
    """verl's own path (no drop-in), for reference. A synchronous actor: in an async one, verl 0.9.1's trackio
    traces raise "Call trackio.init() before trackio.log()" (trackio's current run is a ContextVar, set by
    ``RolloutTraceConfig.init`` in ``__init__``, which the actor's event loop does not see)."""

    def __init__(self, project: str, experiment: str, backend: str, trackio_dir: str = "",
                 mlflow_uri: str = "") -> None:
        if trackio_dir:
            from tracklane.workers.sinks.trackio import point_trackio_at

            point_trackio_at(trackio_dir)
        if mlflow_uri:  # verl's mlflow path reads it from the environment
            os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri
        from verl.utils.rollout_trace import RolloutTraceConfig

        RolloutTraceConfig.init(project, experiment, backend, False, None)

    def rollout(self, step: int) -> None:
        asyncio.run(rollout_step(step))

    def finish(self) -> None:
        from verl.utils.rollout_trace import RolloutTraceConfig

        if RolloutTraceConfig.get_backend() == "trackio":
            import trackio

            trackio.finish()
        else:
            import mlflow

            mlflow.flush_trace_async_logging()


@ray.remote(num_cpus=0)
class RolloutWorker:
    """A rollout worker process with the drop-in (as Ray's worker_process_setup_hook installs it), then verl's trace
    setup as ``AgentLoopWorker.__init__`` does it."""

    def __init__(self, project: str, experiment: str, backend: str, env: dict | None = None) -> None:
        os.environ.update(env or {})
        from tracklane.verl import dropin as tracklane_dropin

        tracklane_dropin.install()
        from verl.utils.rollout_trace import RolloutTraceConfig

        RolloutTraceConfig.init(project, experiment, backend, False, None)

    def pid(self) -> int:
        return os.getpid()

    async def rollout(self, step: int) -> None:  # an async actor, as verl's AgentLoopWorker
        await rollout_step(step)

    def states(self, names: list[str]) -> None:
        from verl.utils.tracking import RLInsightLogger

        for name in names:
            with RLInsightLogger.trace_state(name, state_lane_id="replica_0", phase="rollout"):
                time.sleep(0.002)

    def lost(self) -> int:
        from tracklane.verl import rollout_traces

        forwarder = rollout_traces.forwarder()
        return -1 if forwarder is None else forwarder.lost


def run_worker(worker, steps=STEPS) -> None:
    for step in steps:
        ray.get(worker.rollout.remote(step))


def trace_config(backend: str) -> dict:
    return {"trainer": {"log_async": True, "async_log": {"flush_interval_s": 0.05}},
            "actor_rollout_ref": {"rollout": {"trace": {"backend": backend}}}}


def stored_traces(run) -> list[tuple[str, int, str, str]]:
    """(key, step, messages, metadata) of every trace of a trackio run, metadata without tracklane's additions."""
    out = []
    for key, by_step in run.traces.items():
        for step, traces in by_step.items():
            for trace in traces:
                metadata = {k: v for k, v in trace["metadata"].items() if k not in ADDED}
                out.append((key, step, json.dumps(trace["messages"], sort_keys=True),
                            json.dumps(metadata, sort_keys=True)))
    return sorted(out)


def test_verls_trackio_traces_arrive_as_verl_stores_them(offline_trackers, tmp_path):
    trackio_dir = str(offline_trackers["trackio"])
    verl_worker = VerlRolloutWorker.remote("traces-verl", "exp", "trackio", trackio_dir=trackio_dir)
    run_worker(verl_worker)
    ray.get(verl_worker.finish.remote())
    ray.kill(verl_worker)

    tracking = Tracking("traces-ours", "exp", ["file", "trackio"], config=trace_config("trackio"))
    worker = RolloutWorker.remote("traces-ours", "exp", "trackio")
    run_worker(worker)
    tracking.log({"actor/entropy": 0.5}, step=STEPS[-1])
    assert ray.get(worker.lost.remote()) == 0
    report = tracking.finish()
    assert report.complete, report.summary()
    ray.kill(worker)

    theirs = read_trackio_run(trackio_dir, "traces-verl")
    ours = read_trackio_run(trackio_dir, "traces-ours")
    assert len(stored_traces(theirs)) == TRACES  # the comparison is not vacuous
    assert stored_traces(ours) == stored_traces(theirs)
    errors = [t for by_step in ours.traces.values() for ts in by_step.values() for t in ts
              if t["metadata"]["status"] == "error"]
    assert [e["metadata"]["exception_type"] for e in errors] == ["ValueError"]
    for by_step in ours.traces.values():
        for traces in by_step.values():
            for trace in traces:
                added = trace["metadata"]["tracklane"]
                assert 0 < added["start_ns"] <= added["end_ns"] and added["worker"]

    in_file = file_traces(offline_trackers["file"])
    assert len(in_file) == TRACES
    assert Counter(t["name"] for t in in_file) == Counter(
        {"ToyToolAgentLoop.run": TRACES // 4, "ToyServerManager.generate": TRACES // 2, "ToyTool.execute": TRACES // 4})
    # nested within its agent loop: a generate call starts after the loop did and ends before it
    loops = {(t["step"], t["attributes"]["sample_index"], t["attributes"]["rollout_n"]): t
             for t in in_file if t["name"] == "ToyToolAgentLoop.run"}
    for trace in in_file:
        loop = loops[trace["step"], trace["attributes"]["sample_index"], trace["attributes"]["rollout_n"]]
        assert loop["start_ns"] <= trace["start_ns"] <= trace["end_ns"] <= loop["end_ns"]

    snapshot = RunData(str(offline_trackers["file"])).snapshot()
    assert sum(len(rows) for rows in snapshot.traces.values()) == TRACES
    assert sorted(snapshot.traces) == list(STEPS)


def test_verls_mlflow_traces_arrive_with_verls_spans_and_tags(offline_trackers, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/traces.db"
    verl_worker = VerlRolloutWorker.remote("traces-verl-mlflow", "exp", "mlflow", mlflow_uri=uri)
    run_worker(verl_worker)
    ray.get(verl_worker.finish.remote())
    ray.kill(verl_worker)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking = Tracking("traces-ours-mlflow", "exp", ["file", "mlflow"], config=trace_config("mlflow"))
    worker = RolloutWorker.remote("traces-ours-mlflow", "exp", "mlflow")
    run_worker(worker)
    report = tracking.finish()
    assert report.complete, report.summary()
    ray.kill(worker)

    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids

    theirs = mlflow_calls(uri, "traces-verl-mlflow", None)
    [run_id] = find_mlflow_run_ids(uri, "traces-ours-mlflow", "exp")
    ours = mlflow_calls(uri, "traces-ours-mlflow", run_id)
    assert sum(len(calls) for by_op in theirs.values() for calls in by_op.values()) == TRACES  # not vacuous
    assert sorted(ours) == sorted(theirs)
    for rollout, by_op in theirs.items():
        names = {op: len(calls) for op, calls in by_op.items()}
        assert {op: len(calls) for op, calls in ours[rollout].items()} == names, rollout
        for op, calls in by_op.items():  # status, verl's tags, inputs and outputs, call by call
            assert sorted(ours[rollout][op]) == sorted(calls), (rollout, op)
    errors = [op for by_op in ours.values() for op, calls in by_op.items() for call in calls if call[0] == "ERROR"]
    assert errors == ["ToyTool.execute"]


@pytest.mark.slow
def test_traces_of_a_killed_worker_land_once_when_mlflow_comes_back(mlflow_proxy, mlflow_server_uri,
                                                                     offline_trackers):
    project = f"traces-killed-{uuid.uuid4().hex[:8]}"  # the session's server may hold an earlier run's
    config = trace_config("mlflow")
    config["trainer"]["async_log"].update(sink_retries=0, retry_backoff_s=0.05, max_retry_backoff_s=0.5)
    tracking = Tracking(project, "exp", ["file", "mlflow"], config=config)
    assert tracking.flush(60.0).complete  # both trackers open before MLflow goes away
    worker = RolloutWorker.remote(project, "exp", "mlflow")
    pid = ray.get(worker.pid.remote())
    mlflow_proxy.cut()
    run_worker(worker)
    time.sleep(1.0)  # shipped and spooled (flush_interval 0.05 s); MLflow has none of it
    os.kill(pid, signal.SIGKILL)
    time.sleep(2.0)
    mlflow_proxy.restore()
    report = tracking.finish()
    assert report.complete, report.summary()
    (producer,) = report.producers.values()
    assert producer.died and producer.unshipped == 0, report.summary()

    in_file = file_traces(offline_trackers["file"])
    assert len(in_file) == TRACES
    assert len({(t["step"], t["name"], t["start_ns"], t["end_ns"]) for t in in_file}) == TRACES
    snapshot = RunData(str(offline_trackers["file"])).snapshot()
    assert sum(len(rows) for rows in snapshot.traces.values()) == TRACES

    from mlflow import MlflowClient

    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids

    [run_id] = find_mlflow_run_ids(mlflow_server_uri, project, "exp")
    client = MlflowClient(mlflow_server_uri)
    experiment = client.get_experiment_by_name(project)
    stored = client.search_traces(locations=[experiment.experiment_id], run_id=run_id, max_results=500)
    ids = Counter(trace.info.tags.get("tracklane.trace_id") for trace in stored)
    assert len(ids) == TRACES and set(ids.values()) == {1}, ids
    names = Counter(trace.data.spans[0].name for trace in stored)
    assert names == Counter(t["name"] for t in in_file)


def test_rl_insight_states_become_spans_of_the_run(offline_trackers, monkeypatch):
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")  # rl-insight on: the run posts itself for the workers' spans
    tracking = Tracking("traces-insight", "exp", ["file"], config={"trainer": {"log_async": True}})
    worker = RolloutWorker.remote("traces-insight", "exp", "trackio", env={"VERL_RL_INSIGHT_ENABLE": "1"})
    ray.get(worker.states.remote(["vllm_generate", "update_weights"]))
    report = tracking.finish()
    assert report.complete, report.summary()
    ray.kill(worker)
    spans = file_traces(offline_trackers["file"])
    assert [s["name"] for s in spans] == ["vllm_generate", "update_weights"]
    assert all(s["key"] == f"span/{s['name']}" and s["attributes"]["state_lane_id"] == "replica_0"
               and s["attributes"]["phase"] == "rollout" and s["status"] == "success" and s["end_ns"] >= s["start_ns"]
               for s in spans)

