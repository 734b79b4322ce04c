"""MlflowSink's rich records (generations ... artifacts) in a real MLflow store, read back as artifacts."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

pytest.importorskip("mlflow")
pytest.importorskip("PIL.Image")
from mlflow.tracking import MlflowClient
from PIL import Image as PIL_Image

from tests.conftest import write_two_artifact_versions
from tracklane.core.png import encode_png
from tracklane.core.records import Artifact, Generations, Histogram, Image, Metrics, RunSpec, Text, Trajectories, Trajectory
from tracklane.workers.sinks.mlflow import MlflowSink
from tracklane.workers.sources.mlflow import MlflowSource
from tracklane.workers.testing.readers.mlflow_reader import (
    list_mlflow_artifacts,
    read_mlflow_artifact,
    read_mlflow_images,
    read_mlflow_run,
    read_mlflow_steps,
)

LONG = "长" * 16_384  # as long as record_limits.max_chars lets a string be
SAMPLES = [["q: 2+2?", "4", 1.0], ["", "", 0.0], ["naïve 🤖 \"quoted\" | pipe\nnew line", "ответ", math.nan],
           [LONG, "x" * 1000, -0.5]]


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    """A sqlite tracking URI and a local artifact root, both under tmp."""
    root = tmp_path_factory.mktemp("mlflow_rich")
    return f"sqlite:///{root}/mlruns.db", root / "artifacts"


@pytest.fixture(params=["sqlite", "server"])
def store(request):
    """(tracking URI, artifact root or None for the server's own store)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_store")
    return request.getfixturevalue("mlflow_server_uri"), None


def open_sink(store, project: str) -> MlflowSink:
    uri, artifact_root = store
    if artifact_root is not None:  # sqlite: keep artifacts in tmp, not in ./mlruns
        MlflowClient(uri).create_experiment(project, artifact_location=str(artifact_root / project))
    run = RunSpec(project=project, experiment="e", params={"lr": 1e-6})
    sink = MlflowSink(run, MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": uri}, {}))
    sink.open(None)
    return sink


def as_stored(value):
    """What the strict JSON file holds for a value: NaN and +-Inf as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


@pytest.mark.slow
def test_generations_round_trip_per_step(store, request):
    """Each step is one verl-shaped JSON list; unicode, empty and long strings kept, NaN score as null, [] kept."""
    sink = open_sink(store, f"gen_{request.node.callspec.id}")
    records = [Generations(step=step, samples=SAMPLES[step:] if step < 4 else [], time=1.7e9 + step)
               for step in range(5)]
    records.append(Generations(step=2, samples=[["in", "out", 0.25]], time=1.7e9, key="val/générations"))
    sink.write(records)
    sink.close(0)

    uri = store[0]
    back = read_mlflow_steps(uri, sink.run_id, "generations/val~generations")
    assert back == {step: [{"input": i, "output": o, "score": as_stored(s)} for i, o, s in record.samples]
                    for step, record in enumerate(records[:5])}
    assert back[4] == [] and back[0][2]["score"] is None and back[0][3]["input"] == LONG
    assert read_mlflow_steps(uri, sink.run_id, "generations/val~générations") == {2: [{"input": "in", "output": "out",
                                                                                       "score": 0.25}]}
    assert list_mlflow_artifacts(uri, sink.run_id, "generations")[0] == "generations/val~generations/step_00000000.json"
    assert sink.counts.unsupported == {}


@pytest.mark.slow
def test_many_steps_of_generations_keep_the_run_usable(store, request):
    """200 steps of generations (log_table would break past ~170) all land, and metrics still log after them."""
    sink = open_sink(store, f"gen_many_{request.node.callspec.id}")
    steps = range(200)
    for start in range(0, 200, 20):
        sink.write([Generations(step=s, samples=[[f"prompt {s}", f"answer {s}", s / 200]], time=1.7e9 + s)
                    for s in steps[start:start + 20]])
    sink.write([Metrics(step=200, values={"val/score": 1.0}, time=1.7e9 + 200)])
    sink.close(0)

    back = read_mlflow_steps(store[0], sink.run_id, "generations/val~generations")
    assert back == {s: [{"input": f"prompt {s}", "output": f"answer {s}", "score": s / 200}] for s in steps}
    run = read_mlflow_run(store[0], sink.run_id)
    assert run.points == [(200, "val/score", 1.0)] and run.status == "FINISHED"


def trajectory(index: int) -> Trajectory:
    tokens = np.array([0, 1, -1, 2**31 - 1, -(2**31), 151_643 + index], dtype="<i4")
    return Trajectory(
        messages=[{"role": "system", "content": ""}, {"role": "user", "content": f"solve #{index} ∑"},
                  {"role": "assistant", "content": "<tool_call>calc</tool_call>"}],
        tool_calls=[{"name": "calc", "arguments": '{"x": 1}', "result": "2\n", "latency_s": 0.125},
                    {"name": "search", "arguments": "", "result": "", "latency_s": None}],
        rewards={"score": math.nan if index == 1 else index / 2, "format": 1.0},
        meta={"sample_index": index, "rollout_index": 0, "validation": index == 2, "source": "gsm8k"},
        token_ids=tokens.tobytes(),
    )


def test_trajectories_round_trip_with_tool_calls_and_token_ids(store, request):
    """Trajectories come back as their as_dict(): tool calls, meta and int32 token ids exact, NaN reward as null."""
    sink = open_sink(store, f"traj_{request.node.callspec.id}")
    records = [Trajectories(step=3, trajectories=[trajectory(i) for i in range(3)], time=1.7e9),
               Trajectories(step=4, trajectories=[], time=1.7e9 + 1)]
    sink.write(records)
    sink.close(0)

    back = read_mlflow_steps(store[0], sink.run_id, "trajectories/rollout~trajectories")
    assert back[4] == {"step": 4, "key": "rollout/trajectories", "trajectories": []}
    assert back[3]["step"] == 3
    got = back[3]["trajectories"]
    for item, original in zip(got, records[0].trajectories, strict=True):
        expected = original.as_dict()
        expected["rewards"] = {k: as_stored(v) for k, v in expected["rewards"].items()}
        assert item == expected
        assert np.array_equal(np.array(item["token_ids"], dtype="<i4"), original.token_array())
    assert got[1]["rewards"]["score"] is None and got[2]["meta"]["validation"] is True


def test_histogram_bins_and_summary_metrics(store, request):
    """Stored counts equal np.histogram of the finite values (30 bins), non-finite counted, summary metrics exact."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0.5, 2.0, 5000), [math.nan, math.nan, math.inf, -math.inf]])
    sink = open_sink(store, f"hist_{request.node.callspec.id}")
    sink.write([Histogram(step=7, name="critic/rewards@1", values=values.tobytes(), time=1.7e9),
                Histogram(step=8, name="critic/rewards@1", values=np.array([math.nan]).tobytes(), time=1.7e9)])
    sink.close(0)

    back = read_mlflow_steps(store[0], sink.run_id, "histograms/critic~rewards_at_1")
    finite = values[np.isfinite(values)]
    counts, edges = np.histogram(finite, bins=30)
    assert back[7]["counts"] == counts.tolist() and back[7]["bin_edges"] == edges.tolist()
    assert back[7]["count"] == 5000 and back[7]["nonfinite"] == {"nan": 2, "+inf": 1, "-inf": 1}
    assert back[8]["counts"] == [] and back[8]["count"] == 0 and back[8]["nonfinite"]["nan"] == 1
    metrics = read_mlflow_run(store[0], sink.run_id).scalars()
    prefix = "critic/rewards_at_1/"
    assert metrics[7] == {prefix + "mean": finite.mean(), prefix + "std": finite.std(), prefix + "min": finite.min(),
                          prefix + "max": finite.max(), prefix + "count": 5000.0}
    assert metrics[8] == {prefix + "count": 0.0}


def test_text_image_and_artifact(store, request, tmp_path):
    """Text equal, image pixels equal to the input, artifact files equal; a missing file is skipped and counted."""
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
    rgba = rng.integers(0, 256, (5, 7, 4), dtype=np.uint8)
    gray = rng.integers(0, 256, (9, 4), dtype=np.uint8)
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(bytes(range(256)) * 40)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"a": 1}')
    sink = open_sink(store, f"media_{request.node.callspec.id}")
    sink.write([
        Text(step=1, name="notes/summary", text="héllo\n| not a table |\n\tend ", time=1.7e9),
        Text(step=2, name="notes/summary", text="", time=1.7e9),
        Image(step=1, name="val/rgb", png=encode_png(rgb), time=1.7e9),
        Image(step=2, name="val/rgb", png=encode_png(rgba), time=1.7e9),
        Image(step=2, name="gray map", png=encode_png(gray), time=1.7e9),
        Artifact(step=3, path=str(checkpoint), name="best", type="model", time=1.7e9),
        Artifact(step=3, path=str(tmp_path / "ckpt"), name="step_3", type="checkpoint", time=1.7e9),
        Artifact(step=4, path=str(tmp_path / "gone.bin"), name="gone", type="model", time=1.7e9),
        Text(step=5, name="after", text="still written", time=1.7e9),
    ])
    sink.close(0)

    uri, run_id = store[0], sink.run_id
    assert read_mlflow_steps(uri, run_id, "text/notes~summary") == {1: "héllo\n| not a table |\n\tend ", 2: ""}
    assert read_mlflow_steps(uri, run_id, "text/after") == {5: "still written"}
    images = read_mlflow_images(uri, run_id)
    assert {key: sorted(steps) for key, steps in images.items()} == {"val~rgb": [1, 2], "gray map": [2]}
    for stored, expected in [(images["val~rgb"][1], rgb), (images["val~rgb"][2], rgba), (images["gray map"][2], gray)]:
        assert len(stored) == 1 and np.array_equal(np.asarray(PIL_Image.open(io.BytesIO(stored[0]))), expected)
    assert read_mlflow_artifact(uri, run_id, "model/best/step_3/model.safetensors") == checkpoint.read_bytes()
    assert json.loads(read_mlflow_artifact(uri, run_id, "checkpoint/step_3/step_3/config.json")) == {"a": 1}
    assert list_mlflow_artifacts(uri, run_id, "model") == ["model/best/step_3/model.safetensors"]
    assert sink.counts.artifacts_missing == 1 and sink.counts.unsupported == {}


def test_one_artifact_name_at_two_steps_keeps_both_versions(store, request, tmp_path):
    """A file and a folder logged under one name at steps 50 and 100 are kept apart under step_<step>/, each with
    its own bytes, and the MLflow source reads each file back at its step."""
    sink = open_sink(store, f"versions_{request.node.callspec.id}")
    write_two_artifact_versions(sink, tmp_path, time=1.7e9)

    uri, run_id = store[0], sink.run_id
    assert list_mlflow_artifacts(uri, run_id) == [
        "checkpoint/checkpoint/step_100/actor/model.pt", "checkpoint/checkpoint/step_50/actor/model.pt",
        "config/config/step_100/config.yaml", "config/config/step_50/config.yaml"]
    for step in (50, 100):
        assert read_mlflow_artifact(uri, run_id, f"config/config/step_{step}/config.yaml") == f"step: {step}".encode()
        assert read_mlflow_artifact(uri, run_id, f"checkpoint/checkpoint/step_{step}/actor/model.pt") == \
            bytes([step]) * 8

    with MlflowSource(uri, run_id) as source:
        back = [(r.type, r.name, r.step, open(r.path, "rb").read()) for r in source.records() if r.kind == "artifact"]
    assert sorted(back) == [("checkpoint", "checkpoint", 50, bytes([50]) * 8),
                            ("checkpoint", "checkpoint", 100, bytes([100]) * 8),
                            ("config", "config", 50, b"step: 50"), ("config", "config", 100, b"step: 100")]


def test_the_mlflow_source_still_reads_artifacts_written_before_versions(store, request, tmp_path):
    """<type>/<name>/<file> and <type>/<name>/<folder>/<file> (the layout without step folders) and a file outside
    tracklane's layout read back at step 0."""
    sink = open_sink(store, f"old_layout_{request.node.callspec.id}")
    sink.close(0)
    (tmp_path / "ckpt_dir").mkdir()
    (tmp_path / "ckpt.bin").write_bytes(b"file")
    (tmp_path / "ckpt_dir" / "model.bin").write_bytes(b"folder")
    client = MlflowClient(store[0])
    client.log_artifact(sink.run_id, str(tmp_path / "ckpt.bin"), artifact_path="checkpoint/policy")
    client.log_artifacts(sink.run_id, str(tmp_path / "ckpt_dir"), artifact_path="checkpoint/policy/ckpt_dir")
    client.log_artifact(sink.run_id, str(tmp_path / "ckpt.bin"), artifact_path="checkpoints")

    with MlflowSource(store[0], sink.run_id) as source:
        back = [(r.type, r.name, r.step, open(r.path, "rb").read()) for r in source.records() if r.kind == "artifact"]
    assert sorted(back) == [("artifact", "checkpoints", 0, b"file"), ("checkpoint", "policy", 0, b"file"),
                            ("checkpoint", "policy", 0, b"folder")]
