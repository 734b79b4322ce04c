"""MlflowSink against a real MLflow store (a sqlite file, and a real ``mlflow server``), read back."""

from __future__ import annotations

import logging
import math
import os
import time

import msgpack
import numpy as np
import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from tracklane.core.params import REDACTED, flatten_params, plain_config
from tracklane.core.records import Histogram, Metrics, RunSpec
from tracklane.workers.sinks.mlflow import MAX_PARAM_VALUE_LENGTH, MlflowSink, absolute_tracking_uri, mlflow_key
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

STEPS = 300
MAX_FLOAT64 = 1.7976931348623157e308  # what MLflow stores for +Inf
CONFIG = {
    "trainer": {"project_name": "p", "logger": ["console", "mlflow"], "wandb_api_key": "sk-secret"},
    "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "ppo_mini_batch_size": 64}},
    "data": {"max_prompt_length": 512, "hf_token": "sk-secret", "tokenizer": None, "system_prompt": "x" * 7000},
    "extra": {f"knob_{i}": i * 0.5 for i in range(120)},  # > 100 params: several requests
}
TRAIN_KEYS = (
    ["perf/mfu(%)", "rollout//clip_ratio"]  # renamed: "(%)" -> "___", "//" -> "/"
    + [f"actor/{k}" for k in ("pg_loss", "entropy", "grad_norm", "lr", "pg_clipfrac", "ppo_kl")]
    + [f"critic/{g}/{s}" for g in ("score", "rewards", "advantages", "returns") for s in ("mean", "max", "min")]
    + [f"response_length/{s}" for s in ("mean", "max", "min", "clip_ratio")]
    + [f"timing_s/{k}" for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step")]
    + [f"rollout/extra_{i}" for i in range(53)]
)
INT_KEYS = ["training/global_step", "training/epoch", "perf/total_num_tokens"]
VAL_KEYS = [f"val-core/{d}/acc/mean@4" for d in ("gsm8k", "math", "aime")]
RENAMED = ["perf/mfu(%)", "rollout//clip_ratio", *VAL_KEYS]


def verl_records(steps: range, keys: int = len(TRAIN_KEYS)) -> list[Metrics]:
    """~100 keys a step like verl's trainer; validation logged as a second record every 10 steps."""
    records = []
    for step in steps:
        values: dict[str, float | int] = {k: math.sin(step * 0.1 + i) * 10 ** (i % 4) for i, k in enumerate(TRAIN_KEYS[:keys])}
        values.update({"training/global_step": step, "training/epoch": step // 100, "perf/total_num_tokens": 2**40 + step})
        if step % 7 == 3:
            values["actor/grad_norm"] = math.nan
        if step % 50 == 5:
            values["actor/ppo_kl"] = math.inf if step % 100 == 5 else -math.inf
        records.append(Metrics(step=step, values=values, time=1.7e9 + step * 2.5))
        if step % 10 == 0:
            records.append(Metrics(step=step, values={k: step / 300 for k in VAL_KEYS}, time=1.7e9 + step * 2.5 + 1))
    return records


def stored(value: float) -> float:
    """What MLflow gives back for a value it was sent."""
    return math.copysign(MAX_FLOAT64, value) if math.isinf(value) else float(value)


def assert_same_points(back, records) -> None:
    expected = {}
    for record in records:
        for key, value in record.values.items():
            expected.setdefault(record.step, {})[mlflow_key(key)] = stored(value)
    assert back.duplicates() == []
    assert len(back.points) == sum(map(len, expected.values()))
    got = back.scalars()
    assert got.keys() == expected.keys()
    for step, values in expected.items():
        assert got[step].keys() == values.keys(), step
        for key, value in values.items():
            assert got[step][key] == value or (math.isnan(value) and math.isnan(got[step][key])), (step, key)


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlruns.db"  # created once: ~5 s of migrations


@pytest.fixture(params=["sqlite", "server"])
def tracking_uri(request) -> str:
    return request.getfixturevalue("sqlite_uri" if request.param == "sqlite" else "mlflow_server_uri")


def make_sink(uri: str, project: str, env: dict | None = None) -> MlflowSink:
    run = RunSpec(project=project, experiment="e", params=plain_config(CONFIG), run_id="abc123")
    return MlflowSink(run, MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": uri, **(env or {})}, {}))


@pytest.mark.slow
def test_round_trip_points_params_and_status(tracking_uri, request, caplog):
    """Every point arrives once with its step (NaN kept, Inf as max float), params once, run FINISHED."""
    sink = make_sink(tracking_uri, f"round_trip_{request.node.callspec.id}")
    state = sink.open(None)
    # The server stores ~2k points/s on one worker: 30 train keys there (still > 1000 metrics a call).
    records = verl_records(range(STEPS), keys=len(TRAIN_KEYS) if request.node.callspec.id == "sqlite" else 30)
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        for start in range(0, len(records), 40):  # ~3,800 metrics a call: several requests each
            sink.write(records[start:start + 40])
    sink.close(0)

    back = read_mlflow_run(tracking_uri, state["run_id"])
    assert_same_points(back, records)
    assert back.status == "FINISHED"
    assert back.scalars()[0]["val-core/gsm8k/acc/mean_at_4"] == 0.0
    renames = [r.getMessage() for r in caplog.records if "sanitized" in r.getMessage()]
    assert len(renames) == len(RENAMED)  # once per key, not per call
    assert find_mlflow_run_ids(tracking_uri, f"round_trip_{request.node.callspec.id}", "e") == [state["run_id"]]

    assert len(back.params) == len(flatten_params(plain_config(CONFIG))) > 100
    assert back.params["trainer/logger/list_len"] == "2" and back.params["trainer/logger/1"] == "mlflow"
    assert back.params["actor_rollout_ref/actor/optim/lr"] == "1e-06"
    assert back.params["trainer/wandb_api_key"] == REDACTED == back.params["data/hf_token"]
    assert back.params["data/system_prompt"] == "x" * MAX_PARAM_VALUE_LENGTH
    assert sink.counts.cuts == {"params_truncated": 1}
    assert not any("sk-secret" in k or "sk-secret" in v for k, v in back.params.items())


def test_close_sets_failed_and_is_idempotent(sqlite_uri):
    """close(1) ends the run FAILED, and a second close changes nothing."""
    sink = make_sink(sqlite_uri, "failed")
    state = sink.open(None)
    sink.write(verl_records(range(3), keys=5))
    sink.close(1)
    sink.close(0)
    assert read_mlflow_run(sqlite_uri, state["run_id"]).status == "FAILED"


def test_resume_appends_to_the_same_run(tracking_uri, request):
    """open(resume) after a restart re-attaches: one run, every step once, params logged once."""
    project = f"resume_{request.node.callspec.id}"
    records = verl_records(range(60), keys=10)
    first = make_sink(tracking_uri, project)
    state = first.open(None)
    first.write(records[:40])  # then the actor dies without closing

    second = make_sink(tracking_uri, project)
    assert second.open(msgpack.unpackb(msgpack.packb(state))) == state
    second.write(records[40:])
    second.close(0)

    assert find_mlflow_run_ids(tracking_uri, project, "e") == [state["run_id"]]
    back = read_mlflow_run(tracking_uri, state["run_id"])
    assert_same_points(back, records)
    assert back.status == "FINISHED"
    assert len(back.params) == len(flatten_params(plain_config(CONFIG)))
    assert "params_truncated" not in second.counts.cuts  # it never logged params


def test_replayed_batch_is_not_stored_twice(sqlite_uri):
    """A batch written again after a restart (same record times) adds no duplicate points."""
    sink = make_sink(sqlite_uri, "replay")
    state = sink.open(None)
    records = verl_records(range(5), keys=5)
    sink.write(records)
    sink.write(records[2:])
    sink.close(0)
    assert_same_points(read_mlflow_run(sqlite_uri, state["run_id"]), records)


def test_a_batch_s_metrics_and_histogram_summaries_go_in_one_request(mlflow_server_uri):
    """Steps of metrics with a histogram after each (runs of one kind, as the trainer logs them) reach the server
    as one log_batch, not one per run: a request costs the server ~14 ms of CPU before its first metric."""
    sink = make_sink(mlflow_server_uri, "one_request")
    state = sink.open(None)
    requests = []
    send = sink._client.log_batch
    sink._client.log_batch = lambda *a, **kw: (requests.append(len(kw.get("metrics") or [])), send(*a, **kw))[1]
    records: list = []
    for step in range(4):
        records.append(verl_records(range(step, step + 1), keys=20)[0])
        records.append(Histogram(step=step, name="critic/score_dist", values=np.arange(10.0 + step).tobytes(),
                                 time=1.7e9 + step))
    sink.write(records)
    assert requests == [4 * (20 + len(INT_KEYS)) + 4 * 5]  # 5 summary figures a histogram
    sink.close(0)
    back = read_mlflow_run(mlflow_server_uri, state["run_id"])
    assert_same_points(back, [r for r in records if isinstance(r, Metrics)] + [
        Metrics(step=r.step, time=r.time, values={f"critic/score_dist/{k}": v for k, v in _summary(r).items()})
        for r in records if isinstance(r, Histogram)])


def _summary(record: Histogram) -> dict[str, float]:
    values = np.frombuffer(record.values)
    return {"mean": values.mean(), "std": values.std(), "min": values.min(), "max": values.max(),
            "count": float(len(values))}


def test_mlflow_run_id_attaches_to_an_existing_run(sqlite_uri):
    """With MLFLOW_RUN_ID set the sink logs into that run and creates none."""
    client = MlflowClient(sqlite_uri)
    existing = client.create_run(client.create_experiment("attach_elsewhere"), run_name="platform")
    run_id = existing.info.run_id
    sink = make_sink(sqlite_uri, "attach", env={"MLFLOW_RUN_ID": run_id})
    assert sink.open(None) == {"run_id": run_id}
    records = verl_records(range(4), keys=5)
    sink.write(records)
    sink.close(0)

    back = read_mlflow_run(sqlite_uri, run_id)
    assert_same_points(back, records)
    assert back.status == "FINISHED" and back.params["trainer/wandb_api_key"] == REDACTED
    assert client.get_experiment_by_name("attach") is None


def test_resolve_reads_env_once_into_plain_settings(tmp_path, monkeypatch):
    """resolve() defaults to verl's sqlite URI, makes relative sqlite paths absolute, stays msgpack-able."""
    run = RunSpec(project="p", experiment="e")
    assert MlflowSink.resolve(run, {}, {}) == {"tracking_uri": "sqlite:////tmp/mlruns.db", "run_id": "",
                                               "artifact_root": "file:///tmp/mlartifacts"}
    monkeypatch.chdir(tmp_path)
    settings = MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": "sqlite:///runs/m.db", "MLFLOW_RUN_ID": "r1"}, {})
    assert settings == {"tracking_uri": f"sqlite:///{tmp_path}/runs/m.db", "run_id": "r1",
                        "artifact_root": f"file://{tmp_path}/runs/mlartifacts"}
    assert MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}, {})["artifact_root"] == ""
    assert msgpack.unpackb(msgpack.packb(settings)) == settings
    assert absolute_tracking_uri("http://h:5000") == "http://h:5000"
    assert absolute_tracking_uri("mlruns") == os.path.join(str(tmp_path), "mlruns")
    assert "mlflow ui --backend-store-uri sqlite:///" in MlflowSink(run, settings).where()


def test_sqlite_artifacts_land_beside_the_database_not_in_the_cwd(tmp_path, monkeypatch):
    """With a sqlite store, a new experiment's artifacts go to <db folder>/mlartifacts/<experiment>, not ./mlruns."""
    from mlflow.tracking import MlflowClient

    from tracklane.core.records import Text

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/runs/mlruns.db"
    os.makedirs(tmp_path / "runs")
    run = RunSpec(project="art proj", experiment="e", run_id="artloc1")
    sink = MlflowSink(run, MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": uri}, {}))
    sink.open(None)
    sink.write([Text(step=3, name="notes", text="hello", time=time.time())])
    sink.close(0)
    experiment = MlflowClient(uri).get_experiment_by_name("art proj")
    assert experiment.artifact_location == f"file://{tmp_path}/runs/mlartifacts/art_proj"
    assert (tmp_path / "runs" / "mlartifacts" / "art_proj" / sink.run_id / "artifacts" / "text" / "notes" /
            "step_00000003.txt").read_text() == "hello"
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("key, name", [
    ("val-core/gsm8k/acc/mean@4", "val-core/gsm8k/acc/mean_at_4"),
    ("a//b///c", "a/b/c"),
    ("perf/mfu(%)", "perf/mfu___"),
    ("timing_s/gen step:1", "timing_s/gen step:1"),
    ("/lead/trail/", "lead/trail"),
    ("x/../y", "x/__/y"),
])
def test_metric_names_are_sanitised_like_verl(key, name):
    """Names follow verl's rules ("@" -> "_at_", "//" -> "/", bad chars -> "_"), then MLflow's path rule."""
    assert mlflow_key(key) == name
