"""WandbSink's rich records against the real wandb SDK in offline mode, read back from the run's files."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("wandb")
from PIL import Image as PILImage

from tests.conftest import same_value
from tests.rich_setup import (
    GENERATION_STEPS,
    RUN_ID,
    assert_trajectory_tables,
    media,
    opened_sink,
    png,
    write_artifacts,
    write_generations,
    write_trajectories,
)
from tracklane.core.records import Histogram
from tracklane.workers.sinks.wandb import GENERATION_COLUMNS, WandbSink
from tracklane.workers.testing.readers.wandb_reader import read_wandb_media, read_wandb_run


@pytest.fixture
def wandb_dir(offline_trackers, monkeypatch):
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    return offline_trackers["wandb"]


@pytest.fixture
def sink(wandb_dir):
    """An opened sink on run "rich1"; closed at the end if the test did not close it."""
    yield from opened_sink(WandbSink)


def same_rows(got: list[list], want: list[list]) -> bool:
    """Row lists equal cell by cell, NaN equal to NaN."""
    return len(got) == len(want) and all(
        len(a) == len(b) and all(same_value(x, y) if isinstance(y, float) else x == y for x, y in zip(a, b, strict=True))
        for a, b in zip(got, want, strict=True))


def test_generations_are_one_incremental_table_with_each_steps_rows_once(sink, wandb_dir):
    """Each step's table file holds exactly that step's new rows (unicode, "", NaN, 1 MB kept); no samples, no row."""
    want = write_generations(sink)
    released = sink._tables["val/generations"].data
    sink.close(0)

    stored = read_wandb_media(wandb_dir, RUN_ID)
    got = stored.table_rows("val/generations")
    assert sorted(got) == [0, 1, 3]
    assert all(same_rows(got[step], want[step]) for step in want), got
    assert stored.table_columns("val/generations") == GENERATION_COLUMNS
    assert stored.table_rows("val/other") == {3: [[3, "other", "key", 2.0]]}
    values = stored.of("val/generations")
    assert [values[s].fields["increment_num"] for s in (0, 1, 3)] == [0, 1, 2]
    assert [len(values[s].fields["previous_increments_paths"]) for s in (0, 1, 3)] == [0, 1, 2]
    assert released == [None] * 5  # logged rows are not kept in the lane's memory
    # The table's fields are not scalars: the metrics read back exactly as written.
    assert read_wandb_run(wandb_dir, RUN_ID).points == [(s, "val/score", float(s)) for s in GENERATION_STEPS]


def test_trajectories_keep_messages_tool_calls_rewards_and_token_counts(sink, wandb_dir):
    """Each trajectory is one row of its step whose JSON cells parse back to what was written."""
    written = write_trajectories(sink)
    sink.close(0)

    stored = read_wandb_media(wandb_dir, RUN_ID)
    columns = stored.table_columns("rollout/trajectories")
    assert_trajectory_tables({step: (columns, rows) for step, rows in stored.table_rows("rollout/trajectories").items()},
                             written)


def test_histogram_text_and_image_come_back_as_written(sink, wandb_dir):
    """Histograms equal np.histogram of the finite values (NaN/Inf counted), text is equal, image pixels are equal."""
    written = media([math.nan, math.inf, -math.inf, math.nan, math.nan, math.nan, math.nan])
    sink.write(written.records())
    sink.close(0)

    back = read_wandb_media(wandb_dir, RUN_ID)
    histograms = back.histograms("rollout/kl")
    assert sorted(histograms) == [1, 2]
    for step, array in written.values.items():
        counts, edges = np.histogram(array[np.isfinite(array)], bins=30)
        assert histograms[step] == (edges.tolist(), counts.tolist())
    assert sink.counts.cuts == {"histogram_nonfinite": 7 + 1} and back.histograms("rollout/empty") == {}

    assert {step: [row[1] for row in rows] for step, rows in back.table_rows("notes/prompt").items()} == {
        step: [text] for step, text in written.texts.items()}

    stored = back.images("samples/picture")
    assert sorted(stored) == [1, 2]
    for step, array in written.images.items():
        assert np.array_equal(np.asarray(PILImage.open(stored[step])), array)
        assert stored[step].read_bytes() == png(array)  # the PNG as given, not re-encoded
    assert np.array_equal(np.asarray(PILImage.open(back.images("samples/grey")[3])), written.grey)


def test_artifacts_are_recorded_with_their_content(sink, wandb_dir, tmp_path):
    """A file and a directory become wandb artifacts whose stored copies equal them; a missing path is counted."""
    content = write_artifacts(sink, tmp_path)
    sink.close(0)

    model, tokenizer = read_wandb_media(wandb_dir, RUN_ID).user_artifacts()
    assert (model.name, model.type, model.metadata["step"]) == ("actor-ckpt-step-10", "model", 10)
    assert model.files["model[1].bin"].read_bytes() == content and model.content_ok()
    assert (tokenizer.name, tokenizer.type) == ("tokenizer", "dataset")
    assert {name: path.read_bytes() for name, path in tokenizer.files.items()} == {
        "vocab.json": b'{"a": 1}', "sub/merges.txt": b"a b\n"}
    assert sink.counts.artifacts_missing == 1


def test_a_histogram_of_more_bins_than_wandb_takes_is_merged_and_counted(sink, wandb_dir):
    """A 604-bin histogram (a migrated torch one) is stored as 302 bins of the same total, counted; not refused."""
    from tracklane.core.histogram import HistogramFigures

    edges = np.linspace(-1.0, 1.0, 605).tolist()
    counts = list(range(604))
    figures = HistogramFigures(count=sum(counts), min=-1.0, max=1.0, bin_edges=edges, counts=counts)
    sink.write([Histogram(step=1, name="migrated/weights", values=b"", time=0.0, figures=figures)])
    sink.close(0)
    [(got_edges, got_counts)] = read_wandb_media(wandb_dir, RUN_ID).histograms("migrated/weights").values()
    assert len(got_counts) == 302 and sum(got_counts) == sum(counts) and got_counts[0] == 0 + 1
    assert math.isclose(got_edges[0], -1.0) and math.isclose(got_edges[-1], 1.0) and len(got_edges) == 303
    assert sink.counts.cuts == {"histogram_bins_merged": 1}
