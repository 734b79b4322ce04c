"""MlflowSink's rollout traces in a real MLflow store (sqlite; a server when TRACKLANE_TEST_MLFLOW_URI is set),
read back with MLflow's own client."""

from __future__ import annotations

import json
import os
import uuid

import msgpack
import pytest

pytest.importorskip("mlflow")

from mlflow.entities import SpanStatusCode, TraceState
from mlflow.exceptions import MlflowException
from mlflow.tracing.client import TracingClient
from mlflow.tracking import MlflowClient

from tracklane.core.acks import SinkCounts
from tracklane.core.errors import SinkError
from tracklane.core.records import RunSpec, Trace
from tracklane.testing.mlflow_server import URI_ENV
from tracklane.workers.sinks.mlflow import TRACE_ID_TAG, MlflowSink, trace_record_id

T0 = 1_796_000_000_123_456_789  # wall-clock ns, not a whole millisecond
UNICODE = [{"role": "system", "content": "verl rollout trace operation: ToolAgentLoop.run"},
           {"role": "user", "content": "naïve 🤖 \"quoted\"\n∑ ответ 长"},
           {"role": "assistant", "content": "<tool_call>calc</tool_call>"}]


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow_traces')}/mlruns.db"


@pytest.fixture(params=["sqlite", "server"])
def tracking_uri(request) -> str:
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_uri")
    if not os.environ.get(URI_ENV):
        pytest.skip(f"{URI_ENV} is not set")
    return request.getfixturevalue("mlflow_server_uri")  # conftest: the server that variable names


def make_sink(uri: str, project: str) -> MlflowSink:
    run = RunSpec(project=project, experiment="e", params={"lr": 1e-6})
    return MlflowSink(run, MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": uri}, {}))


def verl_trace(step: int, sample: int, *, error: bool = False, messages: list | None = None) -> Trace:
    """A trace as pipeline/verl/rollout_traces.py makes it of verl's rollout_trace_op (trackio-style metadata)."""
    op = "ToolAgentLoop.run" if sample % 2 else "AsyncLLMServerManager.generate"
    attributes = {"sample_index": sample, "step": step, "rollout_n": sample % 2, "validate": step == 2,
                  "experiment_name": "e", "worker": "agent_loop_worker_0"}
    inputs = {"sampling_params": {"temperature": 1.0, "top_p": None}, "prompt_ids": [151_644, 872, sample]}
    metadata = {"op": op, "backend": "trackio", "experiment_name": "e", "inputs": inputs, **attributes}
    if error:
        metadata.update(status="error", exception_type="TimeoutError")
    else:
        metadata.update(status="success", output={"response_text": f"answer {sample}", "num_turns": 2, "reward": 0.5})
    start = T0 + step * 10**10 + sample * 10**9
    return Trace(step=step, time=(start + 2_345_678) / 1e9, name=op, start_ns=start, end_ns=start + 2_345_678,
                 status="error" if error else "success", attributes=attributes, messages=messages or [],
                 metadata=json.dumps(metadata), key=f"rollout_trace/{op}")


def batch() -> list[Trace]:
    """Two steps of three samples: one ends in an error, one has unicode messages."""
    return [verl_trace(1, 0), verl_trace(1, 1, messages=UNICODE), verl_trace(1, 2, error=True),
            verl_trace(2, 0), verl_trace(2, 1), verl_trace(2, 2)]


def run_traces(uri: str, run_id: str) -> list:
    client = MlflowClient(uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    return list(client.search_traces(locations=[experiment_id], run_id=run_id, max_results=500))


def test_each_trace_record_becomes_one_mlflow_trace_of_the_run(tracking_uri, request):
    """Each record is one trace linked to the run: its span's name, ns times, status, inputs/outputs and messages,
    and verl's tags plus tracklane's, as written."""
    sink = make_sink(tracking_uri, f"traces_{request.node.callspec.id}")
    state = sink.open(None)
    records = batch()
    sink.write(records)
    sink.close(0)

    traces = {trace.info.tags[TRACE_ID_TAG]: trace for trace in run_traces(tracking_uri, state["run_id"])}
    assert sorted(traces) == sorted(trace_record_id(record) for record in records)
    for record in records:
        trace = traces[trace_record_id(record)]
        metadata = json.loads(record.metadata)
        assert trace.info.trace_metadata["mlflow.sourceRun"] == state["run_id"]
        assert trace.info.request_time == record.start_ns // 10**6
        assert trace.info.execution_duration == (record.end_ns - record.start_ns) // 10**6
        assert trace.info.state == (TraceState.ERROR if record.status == "error" else TraceState.OK)
        assert {k: v for k, v in trace.info.tags.items() if not k.startswith("mlflow.")} == {
            **{str(k): str(v) for k, v in record.attributes.items()},  # verl: set_trace_tag(id, str(k), str(v))
            "tracklane.key": record.key, TRACE_ID_TAG: trace_record_id(record)}
        assert trace.info.tags["mlflow.traceName"] == record.name

        [span] = trace.data.spans
        assert (span.name, span.parent_id) == (record.name, None)
        assert (span.start_time_ns, span.end_time_ns) == (record.start_ns, record.end_ns)  # kept to the ns
        assert span.inputs == metadata["inputs"]
        assert span.outputs == metadata.get("output")
        assert span.get_attribute("mlflow.chat.messages") == record.messages
        if record.status == "error":
            assert span.status.status_code == SpanStatusCode.ERROR
            assert span.status.description == span.get_attribute("exception_type") == "TimeoutError"
        else:
            assert span.status.status_code == SpanStatusCode.OK
            assert span.get_attribute("exception_type") is None
    assert traces[trace_record_id(records[1])].data.spans[0].get_attribute("mlflow.chat.messages") == UNICODE
    assert sink.counts.unsupported == {}


def test_a_batch_handed_again_after_a_restart_is_stored_once(tracking_uri, request, monkeypatch):
    """A second actor on the same run, handed the batch again plus one new trace, adds only the new one."""
    project = f"traces_again_{request.node.callspec.id}"
    records = batch()
    first = make_sink(tracking_uri, project)
    state = first.open(None)
    first.write(records)  # then the actor dies without closing

    second = make_sink(tracking_uri, project)
    assert second.open(msgpack.unpackb(msgpack.packb(state))) == state
    started = []
    start_trace = TracingClient.start_trace
    monkeypatch.setattr(TracingClient, "start_trace",
                        lambda self, info: (started.append(info.trace_id), start_trace(self, info))[1])
    new = verl_trace(3, 0, messages=UNICODE)
    second.write([*records, new, records[0]])
    second.close(0)

    ids = [trace.info.tags[TRACE_ID_TAG] for trace in run_traces(tracking_uri, state["run_id"])]
    assert sorted(ids) == sorted(trace_record_id(record) for record in [*records, new])
    assert len(started) == 1  # the repeats were skipped, not merged by the store
    assert second.counts.to_plain() == SinkCounts().to_plain()  # the skipped repeats are no loss: counted nowhere


def test_the_same_records_in_two_runs_are_two_traces_each_with_its_run(tracking_uri, request):
    """A trace is skipped only where its own run holds it: the same batch in a second run of the experiment is
    stored there too, as traces of their own."""
    project = f"traces_two_runs_{request.node.callspec.id}"
    records = batch()[:2]
    run_ids = []
    for _ in range(2):
        sink = make_sink(tracking_uri, project)
        run_ids.append(sink.open(None)["run_id"])
        sink.write(records)
        sink.close(0)

    first, second = (run_traces(tracking_uri, run_id) for run_id in run_ids)
    assert len(first) == len(second) == 2
    assert not {trace.info.trace_id for trace in first} & {trace.info.trace_id for trace in second}
    assert {trace.info.trace_metadata["mlflow.sourceRun"] for trace in second} == {run_ids[1]}


def test_a_write_cut_off_after_the_spans_is_completed_by_the_next_actor(tracking_uri, request, monkeypatch):
    """Spans stored but the trace's info not (the actor died in between): the next actor's write of the batch
    leaves each trace once, whole and linked to the run."""
    project = f"traces_cut_{request.node.callspec.id}_{uuid.uuid4().hex[:8]}"  # a server may be reused: a fresh experiment
    records = batch()
    first = make_sink(tracking_uri, project)
    state = first.open(None)

    def die(self, info):
        raise MlflowException("the actor is killed here")

    with monkeypatch.context() as patched:
        patched.setattr(TracingClient, "start_trace", die)
        with pytest.raises(SinkError):
            first.write(records)

    second = make_sink(tracking_uri, project)
    second.open(state)
    second.write(records)
    second.close(0)
    traces = run_traces(tracking_uri, state["run_id"])
    assert sorted(trace.info.tags[TRACE_ID_TAG] for trace in traces) == sorted(map(trace_record_id, records))
    assert [len(trace.data.spans) for trace in traces] == [1] * len(records)
    client = MlflowClient(tracking_uri)
    everything = client.search_traces(locations=[client.get_run(state["run_id"]).info.experiment_id], max_results=500)
    assert len(everything) == len(records)  # no half-written trace left beside them
