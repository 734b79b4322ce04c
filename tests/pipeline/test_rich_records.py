"""Rich records through Tracking, sync and async: file dumps, console summaries and the memory sink agree."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
from PIL import Image as PILImage

from tests.conftest import write_two_artifact_versions
from tracklane import Tracking, ValidationGenerationsLogger
from tracklane.workers.testing.memory import memory_records

SAMPLES = [("2+2=", "4", 1.0), ("héllo ✓ 世界", "", 0.0), ("long", "y" * 1_000_000, float("nan"))]


def _trajectories(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a" * 2000}],
             "tool_calls": [{"name": "python", "arguments": "print(1)", "result": "1", "latency_s": 0.01}],
             "rewards": {"score": i / n}, "meta": {"sample_index": i, "rollout_index": i % 8, "validation": False},
             "token_ids": np.arange(512, dtype=np.int32) + i} for i in range(n)]


def _log_everything(tracking: Tracking, tmp_path) -> dict:
    pixels = np.random.default_rng(0).integers(0, 255, (8, 6, 3), dtype=np.uint8)
    artifact = tmp_path / "ckpt.bin"
    artifact.write_bytes(b"weights" * 100)
    rewards = np.random.default_rng(1).normal(size=1000)
    ValidationGenerationsLogger("proj", "exp").log(["file", "memory", "console"], SAMPLES, step=10)
    tracking.log_generations([], step=11)
    tracking.log_trajectories(_trajectories(200), step=10)
    tracking.log_histogram("critic/rewards", rewards, step=10)
    tracking.log_text("notes", "unicode ✓ text", step=10)
    tracking.log_image("samples/grid", pixels, step=10)
    tracking.log_artifact(str(artifact), name="policy", type="checkpoint", step=10)
    tracking.log({"x": 1.0}, step=10)
    return {"pixels": pixels, "rewards": rewards, "artifact": artifact}


@pytest.mark.slow
@pytest.mark.parametrize("log_async", [False, True], ids=["sync", "async"])
def test_rich_records_reach_file_console_and_memory(log_async, offline_trackers, tmp_path, capfd, request):
    """Every kind arrives in the file dumps and the memory sink, truncation and sampling counted per tracker (the
    file keeps every trajectory, as verl's rollout dumps do; the others 64); console stays short."""
    if log_async:
        request.getfixturevalue("ray_session")
    config = {"trainer": {"log_async": log_async, "async_log": {"flush_interval_s": 0.1},
                          "record_limits": {"max_chars": 4000, "max_trajectories": 64}}}
    tracking = Tracking("proj", "exp", ["file", "memory", "console"], config=config)
    logged = _log_everything(tracking, tmp_path)
    report = tracking.finish(timeout=60)
    assert report.complete, report.summary()
    assert report.truncated_strings == 1 and report.sampled_out == 0  # the file got every trajectory
    assert {name: lane.sampled_out for name, lane in report.lanes.items()} == {"file": 0, "memory": 136, "console": 136}

    base = str(offline_trackers["file"])[: -len(".jsonl")]
    rows = [json.loads(line) for line in open(f"{base}_generations/10.jsonl", encoding="utf-8")]
    assert [(r["input"], r["output"], r["step"]) for r in rows] == [
        ("2+2=", "4", 10), ("héllo ✓ 世界", "", 10), ("long", "y" * 4000, 10)]
    assert rows[0]["score"] == 1.0 and rows[2]["score"] is None  # strict JSON: NaN as null, as verl's orjson writes it
    trajectories = [json.loads(line) for line in open(f"{base}_rollouts/10.jsonl", encoding="utf-8")]
    assert len(trajectories) == 200 and trajectories[0]["token_ids"] == list(range(512))
    assert trajectories[-1]["meta"]["sample_index"] == 199 and trajectories[0]["tool_calls"][0]["name"] == "python"
    [histogram] = [json.loads(line) for line in open(f"{base}_media/histograms.jsonl", encoding="utf-8")]
    assert histogram["counts"] == np.histogram(logged["rewards"], bins=30)[0].tolist()
    assert open(f"{base}_media/text/notes/10.txt", encoding="utf-8").read() == "unicode ✓ text"
    png = open(f"{base}_media/images/samples_grid/10.png", "rb").read()
    assert (np.asarray(PILImage.open(io.BytesIO(png))) == logged["pixels"]).all()
    assert open(f"{base}_media/artifacts/checkpoint/policy/step_10/ckpt.bin", "rb").read() == \
        logged["artifact"].read_bytes()

    kinds = [r.kind for r in memory_records(tracking.run_id) if r.kind != "metrics"]
    assert kinds == ["generations", "generations", "trajectories", "histogram", "text", "image", "artifact"]
    [kept] = [r for r in memory_records(tracking.run_id) if r.kind == "trajectories"]
    assert len(kept.trajectories) == 64 and kept.trajectories[-1].meta["sample_index"] == 199  # evenly spaced

    out = _wait_for(capfd, "artifact policy", 20 if log_async else 0)
    assert "step:10 - val/generations: 3 samples, mean score 0.5" in out
    assert "step:11 - val/generations: 0 samples" in out
    assert "step:10 - rollout/trajectories: 64 trajectories" in out
    assert "y" * 100 not in out  # the console never prints the full text


def test_generations_logger_without_tracking_warns(caplog):
    """The drop-in ValidationGenerationsLogger with no live Tracking warns and does not raise."""
    ValidationGenerationsLogger("nobody", "nothing").log(["wandb"], SAMPLES, step=1)
    assert "no unfinished Tracking" in caplog.text


def test_big_trajectory_batches_arrive_whole_on_the_async_path(offline_trackers, ray_session):
    """50 async log_trajectories calls of 256 x (2 KB + 512 token ids) arrive as 50 records (the caller's
    cost is printed for information; tracklane.benchmarks.overhead measures it)."""
    tracking = Tracking("proj", "exp", ["memory"], config={"trainer": {"log_async": True}})
    batch = _trajectories(256)
    costs = []
    for step in range(50):
        started = time.perf_counter()
        tracking.log_trajectories(batch, step=step)
        costs.append(time.perf_counter() - started)
    report = tracking.finish(timeout=120)
    assert report.complete and len([r for r in memory_records(tracking.run_id) if r.kind == "trajectories"]) == 50
    print(f"log_trajectories p50 {sorted(costs)[25] * 1e6:.0f} us")


def _wait_for(capfd, text: str, seconds: float) -> str:
    out = ""
    deadline = time.monotonic() + seconds
    while True:
        out += capfd.readouterr().out
        if text in out or time.monotonic() >= deadline:
            return out
        time.sleep(0.5)


def _file_sink(tmp_path):
    from tracklane.core.records import RunSpec
    from tracklane.workers.sinks.file import FileSink

    run = RunSpec(project="p", experiment="e")
    sink = FileSink(run, FileSink.resolve(run, {"VERL_FILE_LOGGER_PATH": str(tmp_path / "out" / "m.jsonl")}, {}))
    sink.open(None)
    return sink


def test_the_file_sink_copies_a_folder_artifact_whole(tmp_path):
    """A folder artifact (a checkpoint directory) lands under _media/artifacts/<type>/<name>/step_<step>/<folder>/
    file by file."""
    from tracklane.core.records import Artifact

    folder = tmp_path / "ckpt_step_5"
    (folder / "shards").mkdir(parents=True)
    (folder / "model.bin").write_bytes(b"weights")
    (folder / "shards" / "0.bin").write_bytes(b"shard")
    sink = _file_sink(tmp_path)
    sink.write([Artifact(step=5, path=str(folder), name="policy", type="checkpoint", time=0.0)])
    sink.close(0)
    copy = tmp_path / "out" / "m_media" / "artifacts" / "checkpoint" / "policy" / "step_5" / "ckpt_step_5"
    assert (copy / "model.bin").read_bytes() == b"weights" and (copy / "shards" / "0.bin").read_bytes() == b"shard"


def test_the_file_sink_keeps_each_step_of_one_artifact_name(tmp_path):
    """One name logged at two steps, a file and a folder of the same names each time, keeps both versions, each
    with its own bytes, and the file source reads each back at its step."""
    from tracklane.workers.sources.file import FileSource

    sink = _file_sink(tmp_path)
    write_two_artifact_versions(sink, tmp_path, time=0.0)
    artifacts = tmp_path / "out" / "m_media" / "artifacts"
    for step in (50, 100):
        assert (artifacts / f"config/config/step_{step}/config.yaml").read_text() == f"step: {step}"
        assert (artifacts / f"checkpoint/checkpoint/step_{step}/global_step/actor/model.pt").read_bytes() == \
            bytes([step]) * 8

    with FileSource(str(tmp_path / "out" / "m.jsonl")) as source:
        back = [(r.type, r.name, r.step, open(r.path, "rb").read()) for r in source.records() if r.kind == "artifact"]
    assert sorted(back) == [("checkpoint", "checkpoint", 50, bytes([50]) * 8),
                            ("checkpoint", "checkpoint", 100, bytes([100]) * 8),
                            ("config", "config", 50, b"step: 50"), ("config", "config", 100, b"step: 100")]


def test_the_file_source_still_reads_artifacts_written_before_versions(tmp_path):
    """<type>/<name>/<file> and <type>/<name>/<folder>/<file> (the layout without step folders) read back at
    step 0."""
    from tracklane.workers.sources.file import FileSource

    (tmp_path / "m.jsonl").write_text('{"step": 1, "data": {"x": 1.0}}\n')
    old = tmp_path / "m_media" / "artifacts" / "checkpoint" / "policy"
    (old / "ckpt_dir").mkdir(parents=True)
    (old / "ckpt.bin").write_bytes(b"file")
    (old / "ckpt_dir" / "model.bin").write_bytes(b"folder")
    with FileSource(str(tmp_path / "m.jsonl")) as source:
        back = [(r.type, r.name, r.step, open(r.path, "rb").read()) for r in source.records() if r.kind == "artifact"]
    assert sorted(back) == [("checkpoint", "policy", 0, b"file"), ("checkpoint", "policy", 0, b"folder")]
