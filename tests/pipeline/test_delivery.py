"""Every scalar reaches every real tracker, equal, in sync and async mode: read back record by record.

Every backend at once: console, wandb (offline run file), MLflow (a real server), SwanLab (offline
store), TensorBoard (event files), the file logger, trackio (its local store) and ClearML (an offline
session); 300 steps x ~100 verl-shaped keys.
"""

from __future__ import annotations

import math
import sys
import uuid

import numpy as np
import pytest

from tests.conftest import log_verl_steps, same_value
from tracklane import Tracking
from tracklane.workers.sinks.mlflow import mlflow_key
from tracklane.workers.testing.readers.clearml_reader import read_clearml_run
from tracklane.workers.testing.readers.file_reader import verl_lines
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run
from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir
from tracklane.workers.testing.readers.trackio_reader import read_trackio_run
from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

BACKENDS = ["console", "wandb", "mlflow", "swanlab", "tensorboard", "file", "trackio", "clearml"]
STEPS = 300
SECRET = "sk-secret-value-123"


def _run(mode_async: bool, exit_code: int) -> tuple[Tracking, dict[int, dict[str, float]], object]:
    config = {"trainer": {"log_async": mode_async, "wandb_api_key": SECRET, "lr": 1e-6,
                          "async_log": {"flush_interval_s": 0.2}},
              "data": {"train_files": ["a.parquet", "b.parquet"]}}
    project = f"delivery-{uuid.uuid4().hex[:8]}"
    tracking = Tracking(project, "exp", BACKENDS, config=config)
    logged = log_verl_steps(tracking, STEPS)
    report = tracking.finish(exit_code=exit_code, timeout=120)
    return tracking, logged, report


def _user_points(points):
    return [(s, k, v) for s, k, v in points if not k.startswith(("tracklane/", "tracklane_"))]


def _assert_equal(name, points, logged, rename=lambda k: k, cast=float):
    """Each logged (step, key) is stored exactly once, with the logged value."""
    points = _user_points(points)
    seen = {}
    for step, key, value in points:
        assert (step, key) not in seen, f"{name}: {key} at step {step} stored twice"
        seen[(step, key)] = value
    expected = {(step, rename(key)): cast(value) for step, values in logged.items() for key, value in values.items()}
    assert set(seen) == set(expected), f"{name}: {len(set(expected) - set(seen))} missing, {len(set(seen) - set(expected))} extra"
    wrong = [(k, seen[k], v) for k, v in expected.items() if not same_value(seen[k], v)]
    assert not wrong, f"{name}: {len(wrong)} values differ, e.g. {wrong[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("mode_async, exit_code", [(False, 0), (True, 1)], ids=["sync", "async"])
def test_every_scalar_arrives_in_every_tracker(mode_async, exit_code, offline_trackers, mlflow_server_uri,
                                               monkeypatch, capfd, request):
    """Every tracker holds every logged scalar exactly once, equal to what was logged, and close with the exit code."""
    if mode_async:
        request.getfixturevalue("ray_session")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server_uri)
    tracking, logged, report = _run(mode_async, exit_code)
    assert report.complete, report.summary()
    run = tracking.run

    wandb = read_wandb_run(offline_trackers["wandb"], run_id=run.run_id)
    _assert_equal("wandb", wandb.points, logged)
    assert wandb.status == f"exit_code={exit_code}"

    [mlflow_run_id] = find_mlflow_run_ids(mlflow_server_uri, run.project, "exp")
    mlflow = read_mlflow_run(mlflow_server_uri, mlflow_run_id)
    _assert_equal("mlflow", mlflow.points, logged, rename=mlflow_key, cast=_mlflow_stored)
    assert mlflow.status == ("FINISHED" if exit_code == 0 else "FAILED")
    assert mlflow.params["trainer/lr"] == "1e-06" and mlflow.params["trainer/wandb_api_key"] == "***REDACTED***"

    swanlab = read_swanlab_run(offline_trackers["swanlog"], run_id=run.run_id)
    _assert_equal("swanlab", swanlab.points, logged)
    assert swanlab.status == ("FINISHED" if exit_code == 0 else "CRASHED")

    tensorboard = read_tensorboard_dir(offline_trackers["tensorboard"])
    _assert_equal("tensorboard", tensorboard.points, logged, cast=lambda v: float(np.float32(v)))

    trackio = read_trackio_run(offline_trackers["trackio"], run.project, run_id=run.run_id)
    _assert_equal("trackio", trackio.points, logged)
    assert trackio.status == f"exit_code={exit_code}"
    assert trackio.config["trainer"]["wandb_api_key"] == "***REDACTED***"

    # ClearML would chart NaN/Inf as 0.0 (its server keeps no non-finite number): the sink skips and counts them.
    clearml = read_clearml_run(offline_trackers["clearml-cache"], run_id=run.run_id)
    finite = {step: {k: v for k, v in values.items() if math.isfinite(v)} for step, values in logged.items()}
    _assert_equal("clearml", clearml.points, finite)
    assert report.lanes["clearml"].cuts == {"scalar_nonfinite": sum(map(len, logged.values())) - sum(map(len, finite.values()))}
    assert clearml.exit_code == exit_code

    lines = verl_lines(offline_trackers["file"])  # verl's lines (tracklane's own are beside the file)
    file_points = [(line["step"], k, v) for line in lines for k, v in line["data"].items()]
    _assert_equal("file", file_points, logged)

    out = _console_output(capfd, last_step=STEPS - 1)
    for step in (0, 150, STEPS - 1):
        assert f"step:{step} - actor/pg_loss:{logged[step]['actor/pg_loss']!r}" in out

    leaked = [p for p in offline_trackers["wandb"].parent.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"secret written to {leaked}"
    assert SECRET not in out


def _mlflow_stored(value: float) -> float:
    """MLflow stores +-Inf as +-the largest float (NaN as NaN)."""
    return math.copysign(sys.float_info.max, value) if math.isinf(value) else value


def _console_output(capfd, last_step: int) -> str:
    """Console lines: on both paths printed by the trainer's own process before finish() returned (the
    actor's lines come back in its answers, not through Ray's log forwarding)."""
    out = capfd.readouterr().out
    assert f"step:{last_step} " in out
    assert "pid=" not in out  # no Ray (LaneActor pid=...) prefix
    return out
