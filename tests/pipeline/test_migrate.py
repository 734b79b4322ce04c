"""``tracklane migrate``: runs written by the trackers' own SDKs, migrated through the lanes, read back by the test
readers (pipeline/testing/readers, independent of the migration's source readers) and compared point by point."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import same_value
from tracklane.cli.main import main
from tracklane.workers.testing.readers.file_reader import file_lines

ROOT = Path(__file__).resolve().parents[2]
T0_MS = 1_700_000_000_123  # explicit MLflow timestamps, far from now: a target that kept them shows these
KEYS = ["actor/loss", "actor/entropy", "critic/score/mean", "perf/throughput", "val-core/acc"]
STEPS = 8


def mlflow_value(key: str, step: int) -> float:
    if key == "actor/entropy" and step % 4 == 1:
        return math.nan
    return (step + 1) * 0.125 * (KEYS.index(key) + 1) + (1e-9 if key == "perf/throughput" else 0.0)


@contextlib.contextmanager
def fluent_mlflow(uri: str) -> Iterator[Any]:
    """mlflow's fluent API pointed at ``uri`` for a while. (``mlflow.set_tracking_uri`` also sets the environment's
    MLFLOW_TRACKING_URI, mlflow/tracking/_tracking_service/utils.py: put back what was there.)"""
    import mlflow

    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield mlflow
    finally:
        mlflow.set_tracking_uri(previous)


def log_mlflow_run(tmp_path: Path, *, repeat_step: int | None = None) -> tuple[str, str]:
    """A run logged with plain ``mlflow`` (fluent API) into sqlite under ``tmp_path``; returns (uri, run id).
    ``repeat_step``: log ``actor/loss`` a second time at that step (MLflow keeps both points)."""
    uri = f"sqlite:///{tmp_path / 'source.db'}"
    with fluent_mlflow(uri) as mlflow:
        experiment = mlflow.create_experiment("src-project", artifact_location=(tmp_path / "src-artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment, run_name="src-run") as run:
            mlflow.log_params({"lr": 1e-6, "optimizer": "adamw", "batch_size": 256})
            for step in range(STEPS):
                for index, key in enumerate(KEYS):
                    mlflow.log_metric(key, mlflow_value(key, step), step=step, timestamp=T0_MS + 1000 * step + index)
            if repeat_step is not None:
                mlflow.log_metric("actor/loss", -1.0, step=repeat_step, timestamp=T0_MS + 999)
            (tmp_path / "ckpt.txt").write_text("weights")
            mlflow.log_artifact(str(tmp_path / "ckpt.txt"), artifact_path="checkpoints")
            mlflow.log_text("hello from mlflow", "notes/readme.txt")
            mlflow.log_image(np.full((4, 6, 3), 200, dtype=np.uint8), key="samples/grid", step=3)
            return uri, run.info.run_id


def file_points(path: Path) -> list[tuple[int, str, float]]:
    """(step, key, value) of every metric line of a file-logger file (the header left out; null read as NaN)."""
    return [(line["step"], key, value) for line in file_lines(path) if line["step"] is not None
            for key, value in line["data"].items()]


def assert_points(got: list[tuple[int, str, float]], expected: dict[tuple[int, str], float], float32: bool = False):
    """Exactly the expected points, once each (NaN equal to NaN; float32 storage when asked)."""
    keyed = {}
    for step, key, value in got:
        assert (step, key) not in keyed, f"({step}, {key}) stored twice"
        keyed[(step, key)] = value
    assert set(keyed) == set(expected)
    for point, value in expected.items():
        want = float(np.float32(value)) if float32 else value
        assert same_value(keyed[point], want), (point, keyed[point], want)


def migrate(capsys, *argv: str) -> tuple[int, str]:
    """``tracklane migrate ARGV`` in this process (Ray is up): its exit code and the comparison table it printed."""
    code = main(["migrate", *argv, "--no-progress"])
    return code, capsys.readouterr().out


def table_rows(table: str) -> dict[str, list[str]]:
    """The comparison table's rows by their first cell (key or kind), split on blanks."""
    return {line.split()[0]: line.split() for line in table.splitlines() if line.startswith("  ") and line.split()}


@pytest.mark.slow
def test_mlflow_run_migrates_into_wandb_tensorboard_file_and_trackio(offline_trackers, ray_session, tmp_path, capsys):
    """Every MLflow point arrives once with its value in wandb, TensorBoard (float32, with MLflow's timestamps),
    the file and trackio (timestamps too), the params, image and artifacts with them, and the command says so."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir, read_tensorboard_rich
    from tracklane.workers.testing.readers.trackio_reader import read_trackio_run
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_media, read_wandb_run

    uri, run_id = log_mlflow_run(tmp_path)
    code, table = migrate(capsys, "--from", "mlflow", "--run-id", run_id, "--tracking-uri", uri,
                          "--to", "wandb,tensorboard,file,trackio")
    assert code == 0, table
    expected = {(step, key): mlflow_value(key, step) for step in range(STEPS) for key in KEYS}

    wandb_back = read_wandb_run(offline_trackers["wandb"])
    assert_points(wandb_back.points, expected)
    assert wandb_back.params == {"lr": "1e-06", "optimizer": "adamw", "batch_size": "256"}
    media = read_wandb_media(offline_trackers["wandb"])
    assert set(media.images("samples/grid")) == {3}
    assert {(a.name, a.type) for a in media.user_artifacts()} == {("checkpoints", "artifact"), ("notes", "artifact")}

    assert_points(read_tensorboard_dir(offline_trackers["tensorboard"]).points, expected, float32=True)
    (event_file,) = Path(offline_trackers["tensorboard"]).glob("events.out.tfevents.*")
    acc = EventAccumulator(str(event_file), size_guidance={"scalars": 0})
    acc.Reload()
    times = {(e.step, key): e.wall_time for key in KEYS for e in acc.Scalars(key)}
    # each point its own MLflow timestamp (an event a record, as the source logged them one call a key)
    assert times == {(step, key): (T0_MS + 1000 * step + KEYS.index(key)) / 1000
                     for step in range(STEPS) for key in KEYS}
    assert set(read_tensorboard_rich(offline_trackers["tensorboard"]).images["samples/grid"]) == {3}

    assert_points(file_points(offline_trackers["file"]), expected)
    media_dir = Path(str(offline_trackers["file"])[: -len(".jsonl")] + "_media")
    assert (media_dir / "artifacts/artifact/checkpoints/step_0/ckpt.txt").read_text() == "weights"
    assert (media_dir / "artifacts/artifact/notes/step_0/readme.txt").read_text() == "hello from mlflow"
    assert (media_dir / "images/samples_grid/3.png").exists()

    trackio_back = read_trackio_run(offline_trackers["trackio"], "src-project", name="src-run")
    assert_points(trackio_back.points, expected)
    # One trackio row per step, stamped with its last record's time: the key logged last at that step.
    for (step, _key), when in trackio_back.point_times().items():
        assert abs(when - (T0_MS + 1000 * step + len(KEYS) - 1) / 1000) < 1e-6
    assert set(trackio_back.images("samples/grid")) == {3}

    rows = table_rows(table)
    for key in KEYS:
        assert rows[key][-4:] == ["ok"] * 4, table
    assert "result: every verified target holds what the source held" in table


def write_tensorboard_run(logdir: Path, points: int = 6) -> dict[tuple[int, str], tuple[float, float]]:
    """Scalars (explicit wall times), a text, a histogram and an image written with torch's SummaryWriter;
    returns (step, key) -> (value, wall time)."""
    from torch.utils.tensorboard import SummaryWriter

    written = {}
    writer = SummaryWriter(str(logdir))
    for step in range(points):
        for key, value in (("loss", 1.0 / (step + 1)), ("reward/mean", 0.1 * step - 0.05)):
            when = 1_700_000_000.25 + step
            writer.add_scalar(key, value, step, walltime=when)
            written[(step, key)] = (value, when)
    writer.add_text("notes", "step two | notes", 2)
    writer.add_histogram("rewards", np.linspace(-1.0, 2.0, 50), 3)
    writer.add_image("frame", np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5), 4)
    writer.close()
    return written


def make_mlflow_experiment(uri: str, name: str, root: Path) -> None:
    """The target experiment made first, so its artifacts go under ``root`` (not the lane actor's ./mlruns)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).create_experiment(name, artifact_location=(root / name).as_uri())


@pytest.mark.slow
def test_two_versions_of_one_mlflow_artifact_name_migrate_with_both(offline_trackers, ray_session, tmp_path, capsys):
    """A checkpoint folder logged by the MLflow sink under one name at steps 50 and 100 reaches the MLflow and
    file targets as two versions, each with its own bytes, and the comparison finds both steps."""
    from mlflow.tracking import MlflowClient

    from tracklane.core.records import Artifact, Metrics, RunSpec
    from tracklane.workers.sinks.mlflow import MlflowSink
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_artifact_dir

    uri = f"sqlite:///{tmp_path / 'source.db'}"
    MlflowClient(uri).create_experiment("ckpt-project", artifact_location=(tmp_path / "src-artifacts").as_uri())
    run = RunSpec(project="ckpt-project", experiment="ckpt-run")
    sink = MlflowSink(run, MlflowSink.resolve(run, {"MLFLOW_TRACKING_URI": uri}, {}))
    sink.open(None)
    for step in (50, 100):
        folder = tmp_path / f"global_step_{step}"
        folder.mkdir()
        (folder / "model.pt").write_bytes(bytes([step]) * 8)
        (folder / "optim.pt").write_bytes(bytes([step + 1]) * 4)
        sink.write([Metrics(step=step, values={"loss": 1.0 / step}, time=1.7e9),
                    Artifact(step=step, path=str(folder), name="checkpoint", type="checkpoint", time=1.7e9)])
    sink.close(0)

    make_mlflow_experiment(offline_trackers["mlflow_uri"], "ckpt-project", tmp_path / "mlartifacts")
    code, table = migrate(capsys, "--from", "mlflow", "--run-id", sink.run_id, "--tracking-uri", uri,
                          "--to", "mlflow,file")
    assert code == 0, table
    assert table_rows(table)["artifact"][1:] == ["checkpoint", "2", "50", "100", "ok", "ok"], table
    expected = {f"step_{step}/{name}": data for step in (50, 100)
                for name, data in (("model.pt", bytes([step]) * 8), ("optim.pt", bytes([step + 1]) * 4))}
    (run_id,) = find_mlflow_run_ids(offline_trackers["mlflow_uri"], "ckpt-project", "ckpt-run")
    stored = read_mlflow_artifact_dir(offline_trackers["mlflow_uri"], run_id, "checkpoint/checkpoint")
    assert stored == {f"checkpoint/{path}": data for path, data in expected.items()}
    media_dir = Path(str(offline_trackers["file"])[: -len(".jsonl")] + "_media")
    folder = media_dir / "artifacts/checkpoint/checkpoint"
    assert {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()} == expected


@pytest.mark.slow
def test_tensorboard_logdir_migrates_into_mlflow(offline_trackers, ray_session, tmp_path, capsys):
    """Every TensorBoard scalar arrives in MLflow with its step, its (float32) value and its wall time as the
    timestamp; the text, the histogram's bins and the image arrive as MLflow artifacts."""
    from mlflow.tracking import MlflowClient

    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_images, read_mlflow_steps
    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_rich

    logdir = tmp_path / "tensorboard_log" / "tb-project" / "tb-run"
    written = write_tensorboard_run(logdir)
    uri = offline_trackers["mlflow_uri"]
    make_mlflow_experiment(uri, "tb-project", tmp_path / "mlartifacts")
    code, table = migrate(capsys, "--from", "tensorboard", "--logdir", str(logdir), "--to", "mlflow")
    assert code == 0, table

    (run_id,) = find_mlflow_run_ids(uri, "tb-project", "tb-run")
    client = MlflowClient(uri)
    for key in ("loss", "reward/mean"):
        history = client.get_metric_history(run_id, key)
        got = sorted((m.step, m.value, m.timestamp) for m in history)
        want = sorted((step, float(np.float32(value)), int(when * 1000))
                      for (step, k), (value, when) in written.items() if k == key)
        assert got == want
    assert read_mlflow_steps(uri, run_id, "text/notes") == {2: "step two | notes"}
    (histogram,) = read_mlflow_steps(uri, run_id, "histograms/rewards").values()
    tb_histogram = read_tensorboard_rich(logdir).histograms["rewards"][3][0]
    assert histogram["counts"] == [int(c) for c in tb_histogram.bucket[1:]] and histogram["count"] == 50
    assert histogram["bin_edges"] == list(tb_histogram.bucket_limit)
    assert set(read_mlflow_images(uri, run_id)["frame"]) == {4}
    rows = table_rows(table)
    assert [rows[kind][-1] for kind in ("histogram", "image", "text", "loss")] == ["ok"] * 4, table
    assert "mlflow: +-Inf as +-1.797e308" in table and "result: every verified target" in table


@pytest.mark.slow
def test_a_target_that_already_holds_other_values_fails_the_comparison(offline_trackers, ray_session, tmp_path,
                                                                       capsys, monkeypatch):
    """Migrating into an MLflow run that already holds points of the same key (MLFLOW_RUN_ID, verl's way to attach)
    delivers everything, but the read-back differs: exit code 1 and the key marked in the table."""
    logdir = tmp_path / "tb" / "p" / "r"
    write_tensorboard_run(logdir, points=3)
    uri = offline_trackers["mlflow_uri"]
    make_mlflow_experiment(uri, "elsewhere", tmp_path / "mlartifacts")
    with fluent_mlflow(uri) as mlflow:
        with mlflow.start_run(experiment_id=mlflow.get_experiment_by_name("elsewhere").experiment_id) as run:
            mlflow.log_metric("loss", 42.0, step=1)
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    code, table = migrate(capsys, "--from", "tensorboard", "--logdir", str(logdir), "--to", "mlflow")
    assert code == 1, table
    rows = table_rows(table)
    assert rows["loss"][-2:] == ["4", "points"] and rows["reward/mean"][-1] == "ok", table
    assert "result: MISMATCH in mlflow (1 difference(s))" in table


@pytest.mark.slow
def test_two_values_at_one_step_in_the_source_both_reach_the_file(offline_trackers, ray_session, tmp_path, capsys):
    """MLflow keeps two points of one key at one step; the file logger, like verl's, keeps a line per record, so both
    arrive and the comparison finds nothing missing."""
    uri, run_id = log_mlflow_run(tmp_path, repeat_step=2)
    code, table = migrate(capsys, "--from", "mlflow", "--run-id", run_id, "--tracking-uri", uri, "--to", "file")
    assert code == 0, table
    rows = table_rows(table)
    assert rows["actor/loss"][1] == str(STEPS + 1) and all(rows[key][-1] == "ok" for key in KEYS), table
    stored = [value for step, key, value in file_points(offline_trackers["file"]) if key == "actor/loss" and step == 2]
    assert len(stored) == 2, stored


def write_verl_file(path: Path, steps: int = 12) -> dict[tuple[int, str], float]:
    """Lines as verl's FileLogger writes them (orjson with OPT_SERIALIZE_NUMPY: NaN becomes null)."""
    import orjson

    written = {}
    with open(path, "wb") as handle:
        for step in range(steps):
            data = {"actor/pg_loss": np.float32(0.5 / (step + 1)), "critic/score/mean": step * 0.25,
                    "training/global_step": step, "actor/clipfrac": math.nan if step % 5 == 0 else 0.1}
            line = orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY)
            handle.write(line + b"\n")
            # what the line says: a float32 as its shortest decimal, NaN as null
            written.update({(step, key): math.nan if value is None else float(value)
                            for key, value in orjson.loads(line)["data"].items()})
    return written


def test_verl_file_log_migrates_into_tensorboard(offline_trackers, ray_session, tmp_path, capsys):
    """Every point of a verl FileLogger file arrives in TensorBoard (its nulls as NaN), project and experiment
    taken from verl's <project>/<experiment>.jsonl path."""
    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

    (tmp_path / "verl-project").mkdir()
    written = write_verl_file(tmp_path / "verl-project" / "exp-7.jsonl")
    code, table = migrate(capsys, "--from", "file", "--path", str(tmp_path / "verl-project" / "exp-7.jsonl"),
                          "--to", "tensorboard")
    assert code == 0, table
    assert_points(read_tensorboard_dir(offline_trackers["tensorboard"]).points, written, float32=True)
    assert "(project 'verl-project', experiment 'exp-7')" in table


@pytest.mark.slow
def test_a_spool_migrates_into_the_file_logger(offline_trackers, ray_session, tmp_path, capsys):
    """A tracklane run's spool (kept by spool_retention_s) migrates whole: every point and the text reach the file."""
    from tracklane.tracking import Tracking

    spool_dir = tmp_path / "run-spool"
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": str(spool_dir), "spool_retention_s": 3600,
                                                           "log_vitals": False}}}
    tracking = Tracking("spool-project", "spool-run", default_backend="tensorboard", config=config)
    logged = {}
    for step in range(10):
        values = {"loss": 1.0 / (step + 1), "lr": 1e-6}
        tracking.log(values, step=step)
        logged.update({(step, key): value for key, value in values.items()})
    tracking.log_text("notes", "from the trainer", step=4)
    assert tracking.finish(0).complete
    code, table = migrate(capsys, "--from", "spool", "--spool", str(spool_dir), "--to", "file")
    assert code == 0, table
    assert_points(file_points(offline_trackers["file"]), logged)
    media = Path(str(offline_trackers["file"])[: -len(".jsonl")] + "_media")
    assert (media / "text/notes/4.txt").read_text() == "from the trainer"


def log_rich_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tracklane run (its own tensorboard lane, in a folder of its own) that keeps its whole spool: scalars and
    every rich kind."""
    from tracklane.tracking import Tracking

    spool_dir = tmp_path / "rich-spool"
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": str(spool_dir), "spool_retention_s": 3600,
                                                           "log_vitals": False}}}
    with monkeypatch.context() as patch:
        patch.setenv("TENSORBOARD_DIR", str(tmp_path / "run-tensorboard"))
        tracking = Tracking("rich-project", "rich-run", default_backend="tensorboard", config=config)
    (tmp_path / "model.bin").write_bytes(b"\x00weights")
    for step in range(3):
        tracking.log({"loss": 1.0 / (step + 1)}, step=step)
    tracking.log_generations([["2+2?", "4", 1.0], ["3+3?", "7", math.nan]], step=1)
    tracking.log_trajectories([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                "tool_calls": [{"name": "calc", "arguments": "1+1", "result": "2", "latency_s": 0.5}],
                                "rewards": {"score": 0.75}, "meta": {"sample_index": 0}, "token_ids": [5, 6, 7]}],
                              step=2)
    tracking.log_histogram("rewards", np.array([0.0, 0.5, 0.5, 1.0, math.nan]), step=2)
    tracking.log_text("notes/summary", "all good", step=2)
    tracking.log_image("frames/first", np.full((2, 3, 3), 9, dtype=np.uint8), step=0)
    tracking.log_artifact(str(tmp_path / "model.bin"), name="model", type="checkpoint", step=2)
    assert tracking.finish(0).complete
    return spool_dir


def log_wandb_run(wandb: Any, tmp_path: Path, logged: dict[tuple[int, str], float]) -> Path:
    """An offline run logged with plain wandb (scalars, a histogram, an image, a table, an artifact); fills
    ``logged`` with its scalar points and returns its run folder."""
    run = wandb.init(project="wb-project", name="wb-run", config={"lr": 3e-4, "model": {"layers": 2}})
    for step in range(6):
        values = {"loss": 2.0 / (step + 1), "acc/top1": 0.125 * step, "count": step}
        run.log(values, step=step)
        logged.update({(step, key): float(value) for key, value in values.items()})
    run.log({"hist": wandb.Histogram(np_histogram=([1, 3, 2], [0.0, 1.0, 2.0, 3.0])),
             "frame": wandb.Image(np.zeros((4, 5, 3), dtype=np.uint8)),
             "table": wandb.Table(columns=["a", "b"], data=[[1, "x"], [2, "y"]])}, step=6)
    (tmp_path / "data.txt").write_text("dataset")
    artifact = wandb.Artifact("dataset", type="data")
    artifact.add_file(str(tmp_path / "data.txt"))
    run.log_artifact(artifact)
    run_dir = Path(run.dir).parent  # run.dir is the run folder's files/
    run.finish()
    return run_dir


@pytest.mark.slow
def test_every_rich_kind_is_read_back_from_every_target(offline_trackers, ray_session, tmp_path, capsys, monkeypatch):
    """Generations, trajectories, a histogram, a text, an image and an artifact (from a spool) reach MLflow, wandb,
    the file, trackio and TensorBoard, and each target's reader finds them at their steps (TensorBoard keeps no
    artifact: "not stored")."""
    spool_dir = log_rich_spool(tmp_path, monkeypatch)
    make_mlflow_experiment(offline_trackers["mlflow_uri"], "rich-project", tmp_path / "mlartifacts")
    code, table = migrate(capsys, "--from", "spool", "--spool", str(spool_dir),
                          "--to", "mlflow,wandb,file,trackio,tensorboard")
    assert code == 0, table
    rich = {tuple(line.split()[:2]): " ".join(line.split()[5:]) for line in table.splitlines()
            if line.split()[:1] in (["generations"], ["trajectories"], ["histogram"], ["text"], ["image"], ["artifact"])}
    assert set(rich) == {("generations", "val/generations"), ("trajectories", "rollout/trajectories"),
                         ("histogram", "rewards"), ("text", "notes/summary"), ("image", "frames/first"),
                         ("artifact", "model")}, table
    for (kind, _name), verdicts in rich.items():
        assert verdicts == ("ok ok ok ok not stored" if kind == "artifact" else "ok ok ok ok ok"), table


@pytest.mark.slow
def test_wandb_offline_run_migrates_into_the_file_logger(offline_trackers, ray_session, tmp_path, capsys):
    """An offline run logged with plain wandb: every scalar (its own step), the histogram's bins, the image, the
    table and the artifact arrive in the file logger's files."""
    import wandb

    logged: dict[tuple[int, str], float] = {}
    try:
        run_dir = log_wandb_run(wandb, tmp_path, logged)
    finally:
        wandb.teardown()  # this process's wandb-core service: stopped here, not at exit
    code, table = migrate(capsys, "--from", "wandb", "--run-dir", str(run_dir), "--to", "file")
    assert code == 0, table
    assert_points(file_points(offline_trackers["file"]), logged)
    header = json.loads(Path(str(offline_trackers["file"])[: -len(".jsonl")] + "_tracklane", "run.json").read_text())
    assert (header["project"], header["experiment"]) == ("wb-project", "wb-run")
    assert header["config"] == {"lr": 3e-4, "model": {"layers": 2}}
    media = Path(str(offline_trackers["file"])[: -len(".jsonl")] + "_media")
    (histogram,) = [json.loads(line) for line in (media / "histograms.jsonl").read_text().splitlines()]
    assert (histogram["step"], histogram["counts"], histogram["bin_edges"]) == (6, [1, 3, 2], [0.0, 1.0, 2.0, 3.0])
    assert (media / "images/frame/6.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (table_file,) = (media / "artifacts/wandb-table/table/step_6").iterdir()
    assert json.loads(table_file.read_text())["data"] == [[1, "x"], [2, "y"]]
    assert (media / "artifacts/data/dataset/step_0").is_dir() and \
        [p.read_text() for p in (media / "artifacts/data/dataset/step_0").iterdir()] == ["dataset"]


@pytest.mark.slow
def test_the_entry_point_migrates_in_its_own_process(tmp_path):
    """``python -m tracklane migrate`` (its own Ray) migrates a verl file into the file logger and exits 0."""
    written = write_verl_file(tmp_path / "src.jsonl", steps=5)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(tmp_path / "out.jsonl"),
           "TRACKLANE_SPOOL_ROOT": str(tmp_path / "spools"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run([sys.executable, "-m", "tracklane", "migrate", "--from", "file", "--path",
                           str(tmp_path / "src.jsonl"), "--to", "file", "--no-progress"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_points(file_points(tmp_path / "out.jsonl"), written)
    assert "result: every verified target holds what the source held" in proc.stdout


def test_unknown_source_options_and_missing_ones_are_clear_errors(capsys):
    """A source without its required option, or a missing run file, exits 2 naming what is missing."""
    assert main(["migrate", "--from", "mlflow", "--to", "file"]) == 2
    assert "--from mlflow needs --run-id" in capsys.readouterr().err
    assert main(["migrate", "--from", "file", "--path", "/nonexistent.jsonl", "--to", "file"]) == 2
    assert "no file at /nonexistent.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["migrate", "--from", "nosuch", "--to", "file"])
