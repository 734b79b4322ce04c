"""WandbSink's rich records against the real wandb SDK in offline mode, read back from the run's files."""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("wandb")
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
from workers.sinks.wandb import GENERATION_COLUMNS, TRAJECTORY_COLUMNS, WandbSink
from workers.testing.readers.wandb_reader import read_wandb_media, read_wandb_run

LONG = "é🚀x" * 333_334  # ~1 MB of characters, as if the converter had kept it whole


@pytest.fixture
def wandb_dir(offline_trackers, monkeypatch):
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    return offline_trackers["wandb"]


@pytest.fixture
def sink(wandb_dir):
    """An opened sink on run "rich1"; closed at the end if the test did not close it."""
    run = RunSpec(project="p", experiment="e", params={"lr": 0.1}, run_id="rich1")
    opened = WandbSink(run, WandbSink.resolve(run, os.environ, {}))
    opened.open(None)
    yield opened
    opened.close(1)


def same_rows(got: list[list], want: list[list]) -> bool:
    """Row lists equal cell by cell, NaN equal to NaN."""
    return len(got) == len(want) and all(
        len(a) == len(b) and all(same_value(x, y) if isinstance(y, float) else x == y for x, y in zip(a, b, strict=True))
        for a, b in zip(got, want, strict=True))


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def test_generations_are_one_incremental_table_with_each_steps_rows_once(sink, wandb_dir):
    """Each step's table file holds exactly that step's new rows (unicode, "", NaN, 1 MB kept); no samples, no row."""
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
    sink.write(records[:3])  # batches cut inside a step
    sink.write(records[3:])
    released = sink._tables["val/generations"].data
    sink.close(0)

    media = read_wandb_media(wandb_dir, "rich1")
    want = {step: [[step, *row] for row in rows] for step, rows in steps.items() if rows}
    want[3].append([3, "q3b", "a3b", math.inf])
    got = media.table_rows("val/generations")
    assert sorted(got) == [0, 1, 3]
    assert all(same_rows(got[step], want[step]) for step in want), got
    assert media.table_columns("val/generations") == GENERATION_COLUMNS
    assert media.table_rows("val/other") == {3: [[3, "other", "key", 2.0]]}
    values = media.of("val/generations")
    assert [values[s].fields["increment_num"] for s in (0, 1, 3)] == [0, 1, 2]
    assert [len(values[s].fields["previous_increments_paths"]) for s in (0, 1, 3)] == [0, 1, 2]
    assert released == [None] * 5  # logged rows are not kept in the lane's memory
    # The table's fields are not scalars: the metrics read back exactly as written.
    assert read_wandb_run(wandb_dir, "rich1").points == [(s, "val/score", float(s)) for s in steps]


def test_trajectories_keep_messages_tool_calls_rewards_and_token_counts(sink, wandb_dir):
    """Each trajectory is one row of its step whose JSON cells parse back to what was written."""
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

    media = read_wandb_media(wandb_dir, "rich1")
    assert media.table_columns("rollout/trajectories") == TRAJECTORY_COLUMNS
    got = media.table_rows("rollout/trajectories")
    assert sorted(got) == [5, 6]
    for step, items in written.items():
        rows = [dict(zip(TRAJECTORY_COLUMNS, row, strict=True)) for row in got[step]]
        assert len(rows) == len(items)
        for row, item in zip(rows, items, strict=True):
            assert row["step"] == step and row["score"] == item.score()
            assert (row["sample_index"], row["rollout_index"], row["validation"]) == (
                item.meta["sample_index"], item.meta["rollout_index"], item.meta["validation"])
            assert json.loads(row["messages"]) == item.messages
            assert json.loads(row["tool_calls"]) == item.tool_calls
            rewards = json.loads(row["rewards"])
            assert rewards["score"] == item.rewards["score"] and math.isnan(rewards["format"])
            assert json.loads(row["meta"]) == {"uid": item.meta["uid"]}
            assert row["num_tokens"] == item.token_array().size


def test_histogram_text_and_image_come_back_as_written(sink, wandb_dir):
    """Histograms equal np.histogram of the finite values (NaN/Inf counted), text is equal, image pixels are equal."""
    rng = np.random.default_rng(0)
    values = {step: rng.normal(step, 1.0, 1000) for step in (1, 2)}
    values[2][:7] = [math.nan, math.inf, -math.inf, math.nan, math.nan, math.nan, math.nan]
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

    media = read_wandb_media(wandb_dir, "rich1")
    histograms = media.histograms("rollout/kl")
    assert sorted(histograms) == [1, 2]
    for step, array in values.items():
        counts, edges = np.histogram(array[np.isfinite(array)], bins=30)
        assert histograms[step] == (edges.tolist(), counts.tolist())
    assert sink.counts.cuts == {"histogram_nonfinite": 7 + 1} and media.histograms("rollout/empty") == {}

    assert {step: [row[1] for row in rows] for step, rows in media.table_rows("notes/prompt").items()} == {
        step: [text] for step, text in texts.items()}

    stored = media.images("samples/picture")
    assert sorted(stored) == [1, 2]
    for step, array in images.items():
        assert np.array_equal(np.asarray(PILImage.open(stored[step])), array)
        assert stored[step].read_bytes() == png(array)  # the PNG as given, not re-encoded
    assert np.array_equal(np.asarray(PILImage.open(media.images("samples/grey")[3])), grey)


def test_artifacts_are_recorded_with_their_content(sink, wandb_dir, tmp_path):
    """A file and a directory become wandb artifacts whose stored copies equal them; a missing path is counted."""
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
    checkpoint.unlink()  # the trainer may rotate its checkpoints away: wandb kept a copy
    sink.close(0)

    model, tokenizer = read_wandb_media(wandb_dir, "rich1").user_artifacts()
    assert (model.name, model.type, model.metadata["step"]) == ("actor-ckpt-step-10", "model", 10)
    assert model.files["model[1].bin"].read_bytes() == content and model.content_ok()
    assert (tokenizer.name, tokenizer.type) == ("tokenizer", "dataset")
    assert {name: path.read_bytes() for name, path in tokenizer.files.items()} == {
        "vocab.json": b'{"a": 1}', "sub/merges.txt": b"a b\n"}
    assert sink.counts.artifacts_missing == 1


def test_a_histogram_of_more_bins_than_wandb_takes_is_merged_and_counted(sink, wandb_dir):
    """A 604-bin histogram (a migrated torch one) is stored as 302 bins of the same total, counted; not refused."""
    from pipeline.core.histogram import HistogramFigures

    edges = np.linspace(-1.0, 1.0, 605).tolist()
    counts = list(range(604))
    figures = HistogramFigures(count=sum(counts), min=-1.0, max=1.0, bin_edges=edges, counts=counts)
    sink.write([Histogram(step=1, name="migrated/weights", values=b"", time=0.0, figures=figures)])
    sink.close(0)
    [(got_edges, got_counts)] = read_wandb_media(wandb_dir, "rich1").histograms("migrated/weights").values()
    assert len(got_counts) == 302 and sum(got_counts) == sum(counts) and got_counts[0] == 0 + 1
    assert math.isclose(got_edges[0], -1.0) and math.isclose(got_edges[-1], 1.0) and len(got_edges) == 303
    assert sink.counts.cuts == {"histogram_bins_merged": 1}
