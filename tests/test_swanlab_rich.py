"""SwanlabSink's rich records against the real swanlab SDK, offline, read back from what swanlab stored."""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("swanlab")
from PIL import Image as PILImage

from pipeline.core.records import (
    Artifact,
    Generations,
    Histogram,
    Image,
    Metrics,
    RunSpec,
    Text,
    Trajectories,
    Trajectory,
)
from tests.conftest import same_value
from workers.sinks.swanlab import GENERATION_COLUMNS, TRAJECTORY_COLUMNS, SwanlabSink
from workers.testing.readers.swanlab_reader import read_swanlab_media, read_swanlab_run

LONG = "é🚀x" * 333_334  # ~1 MB of characters, as if the converter had kept it whole


@pytest.fixture
def logdir(offline_trackers, tmp_path, monkeypatch):
    """Offline swanlab writing only under tmp_path (its log folder, home and the cwd it reads .env from)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SWANLAB_ROOT", str(offline_trackers["swanlab-home"]))
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return offline_trackers["swanlog"]


@pytest.fixture
def sink(logdir):
    """An opened sink on run "rich1"; closed at the end if the test did not (one live run per process)."""
    run = RunSpec(project="p", experiment="e", params={"lr": 0.1}, run_id="rich1")
    opened = SwanlabSink(run, SwanlabSink.resolve(run, os.environ, {}))
    opened.open(None)
    yield opened
    opened.close(1)


def number(cell) -> float:
    """A score cell as a float: the sink writes non-finite ones as "NaN", "Infinity", "-Infinity"."""
    return float(cell)


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def test_generations_are_one_table_per_step_holding_that_steps_rows(sink, logdir):
    """Each step's table holds exactly that step's rows (unicode, "", NaN, 1 MB kept); no samples, no table."""
    steps = {
        0: [["héllo 中文 🚀", "", math.nan], ["", "out", 1.0]],
        1: [[LONG, "ok", -0.5]],
        2: [],
        3: [["q3", "a3", 0.25]],
    }
    records = []
    for step, samples in steps.items():
        records += [Metrics(step=step, values={"val/score": float(step)}, time=0.0),
                    Generations(step=step, samples=samples, time=0.0)]
    records.append(Generations(step=3, samples=[["q3b", "a3b", math.inf]], time=0.0))  # same step, same key
    records.append(Generations(step=3, samples=[["other", "key", 2.0]], time=0.0, key="val/other"))
    sink.write(records[:3])
    sink.write(records[3:])
    sink.close(0)

    media = read_swanlab_media(logdir, run_id="rich1")
    want = {step: [[step, *row] for row in rows] for step, rows in steps.items() if rows}
    want[3].append([3, "q3b", "a3b", math.inf])
    tables = media.tables("val/generations")
    assert sorted(tables) == [0, 1, 3]
    for step, rows in want.items():
        headers, got = tables[step]
        assert headers == GENERATION_COLUMNS
        assert [row[:3] for row in got] == [row[:3] for row in rows]
        assert all(same_value(number(g[3]), w[3]) for g, w in zip(got, rows, strict=True))
    assert media.tables("val/other") == {3: (GENERATION_COLUMNS, [[3, "other", "key", 2.0]])}
    # Tables add no scalar: the metrics read back exactly as written.
    assert read_swanlab_run(logdir, run_id="rich1").points == [(s, "val/score", float(s)) for s in steps]


def test_trajectories_keep_messages_tool_calls_rewards_and_token_counts(sink, logdir):
    """Each trajectory is one row of its step's table whose JSON cells parse back to what was written."""
    def trajectory(i: int, step: int) -> Trajectory:
        return Trajectory(
            messages=[{"role": "user", "content": f"question {i} ü"}, {"role": "assistant", "content": ""}],
            tool_calls=[{"name": "search", "arguments": '{"q": "中文"}', "result": "r" * 100, "latency_s": 0.25}],
            rewards={"score": float(i), "format": math.nan},
            meta={"sample_index": i, "rollout_index": step, "validation": i % 2 == 0, "uid": f"u{i}"},
            token_ids=np.arange(10 * i, dtype="<i4").tobytes(),
        )
    written = {step: [trajectory(i, step) for i in range(3)] for step in (5, 6)}
    sink.write([Trajectories(step=step, trajectories=items, time=0.0) for step, items in written.items()])
    sink.write([Trajectories(step=7, trajectories=[], time=0.0)])
    sink.close(0)

    tables = read_swanlab_media(logdir, run_id="rich1").tables("rollout/trajectories")
    assert sorted(tables) == [5, 6]
    for step, items in written.items():
        headers, got = tables[step]
        assert headers == TRAJECTORY_COLUMNS and len(got) == len(items)
        for row, item in zip((dict(zip(headers, row, strict=True)) for row in got), items, strict=True):
            assert row["step"] == step and number(row["score"]) == item.score()
            assert (row["sample_index"], row["rollout_index"], row["validation"]) == (
                item.meta["sample_index"], item.meta["rollout_index"], item.meta["validation"])
            assert json.loads(row["messages"]) == item.messages
            assert json.loads(row["tool_calls"]) == item.tool_calls
            rewards = json.loads(row["rewards"])
            assert rewards["score"] == item.rewards["score"] and math.isnan(rewards["format"])
            assert json.loads(row["meta"]) == {"uid": item.meta["uid"]}
            assert row["num_tokens"] == item.token_array().size


def test_histogram_text_and_image_come_back_as_written(sink, logdir):
    """Bars equal np.histogram of the finite values, with summary scalars; text is equal; image pixels are equal."""
    rng = np.random.default_rng(0)
    values = {step: rng.normal(step, 1.0, 1000) for step in (1, 2)}
    values[2][:4] = [math.nan, math.inf, -math.inf, math.nan]
    images = {1: rng.integers(0, 256, (12, 20, 3), dtype=np.uint8), 2: rng.integers(0, 256, (9, 7, 4), dtype=np.uint8)}
    grey = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    texts = {1: "première ligne\n第二行 🚀", 2: "", 3: LONG}
    records = []
    for step in (1, 2, 3):
        if step in values:
            records += [Histogram(step=step, name="rollout/kl", values=values[step].tobytes(), time=0.0),
                        Image(step=step, name="samples/picture", png=png(images[step]), time=0.0)]
        records.append(Text(step=step, name="notes/prompt", text=texts[step], time=0.0))
    records += [Histogram(step=3, name="rollout/empty", values=np.array([math.nan]).tobytes(), time=0.0),
                Image(step=3, name="samples/grey", png=png(grey), time=0.0)]
    sink.write(records)
    sink.close(0)

    media = read_swanlab_media(logdir, run_id="rich1")
    bars = media.bars("rollout/kl")
    scalars = read_swanlab_run(logdir, run_id="rich1").scalars()
    assert sorted(bars) == [1, 2]
    for step, array in values.items():
        finite = array[np.isfinite(array)]
        counts, edges = np.histogram(finite, bins=30)
        assert bars[step] == ([f"{edge:.6g}" for edge in edges[:-1]], counts.tolist())
        assert scalars[step] == {"rollout/kl/mean": finite.mean(), "rollout/kl/std": finite.std(),
                                 "rollout/kl/min": finite.min(), "rollout/kl/max": finite.max(),
                                 "rollout/kl/count": finite.size}
    assert media.of("rollout/empty") == {} and scalars[3] == {"rollout/empty/count": 0.0}

    assert media.texts("notes/prompt") == texts

    stored = media.images("samples/picture")
    assert sorted(stored) == [1, 2]
    for step, array in images.items():
        assert np.array_equal(np.asarray(PILImage.open(stored[step])), array)
    assert np.array_equal(np.asarray(PILImage.open(media.images("samples/grey")[3])), grey)


def test_artifacts_are_copied_into_the_run_and_saved(sink, logdir, tmp_path):
    """A file and a directory are copied under the run's files/ and registered with save; a missing path is counted."""
    checkpoint = tmp_path / "model[1].bin"
    checkpoint.write_bytes(os.urandom(100_000))
    folder = tmp_path / "tokenizer"
    (folder / "sub").mkdir(parents=True)
    (folder / "vocab.json").write_text('{"a": 1}', encoding="utf-8")
    (folder / "sub" / "merges.txt").write_text("a b\n", encoding="utf-8")
    sink.write([
        Artifact(step=10, path=str(checkpoint), name="actor ckpt/step:10", type="model", time=0.0),
        Artifact(step=10, path=str(folder), name="tokenizer", type="dataset", time=0.0),
        Artifact(step=11, path=str(tmp_path / "gone.bin"), name="gone", type="model", time=0.0),
    ])
    content = checkpoint.read_bytes()
    checkpoint.unlink()  # the trainer may rotate its checkpoints away: the run kept a copy
    sink.close(0)

    saved = {f.name: f for f in read_swanlab_media(logdir, run_id="rich1").saved}
    assert sorted(saved) == ["artifacts/dataset/tokenizer/step_10/tokenizer/sub/merges.txt",
                             "artifacts/dataset/tokenizer/step_10/tokenizer/vocab.json",
                             "artifacts/model/actor_ckpt_step_10/step_10/model[1].bin"]
    for entry in saved.values():
        assert entry.target.is_file() and not entry.target.is_symlink() and entry.target == entry.source
    assert saved["artifacts/model/actor_ckpt_step_10/step_10/model[1].bin"].target.read_bytes() == content
    assert saved["artifacts/dataset/tokenizer/step_10/tokenizer/vocab.json"].target.read_bytes() == b'{"a": 1}'
    assert sink.counts.artifacts_missing == 1
