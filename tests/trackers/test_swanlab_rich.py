"""SwanlabSink's rich records against the real swanlab SDK, offline, read back from what swanlab stored."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("swanlab")
from PIL import Image as PILImage

from tests.rich_setup import (
    GENERATION_STEPS,
    RUN_ID,
    assert_generation_tables,
    assert_trajectory_tables,
    media,
    opened_sink,
    write_artifacts,
    write_generations,
    write_trajectories,
)
from tracklane.workers.sinks.media import GENERATION_COLUMNS
from tracklane.workers.sinks.swanlab import SwanlabSink
from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_media, read_swanlab_run


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
    yield from opened_sink(SwanlabSink)


def number(cell) -> float:
    """A score cell as a float: the sink writes non-finite ones as "NaN", "Infinity", "-Infinity"."""
    return float(cell)


def test_generations_are_one_table_per_step_holding_that_steps_rows(sink, logdir):
    """Each step's table holds exactly that step's rows (unicode, "", NaN, 1 MB kept); no samples, no table."""
    want = write_generations(sink)
    sink.close(0)

    back = read_swanlab_media(logdir, run_id=RUN_ID)
    assert_generation_tables(back.tables("val/generations"), want, score=number)
    assert back.tables("val/other") == {3: (GENERATION_COLUMNS, [[3, "other", "key", 2.0]])}
    # Tables add no scalar: the metrics read back exactly as written.
    assert read_swanlab_run(logdir, run_id=RUN_ID).points == [(s, "val/score", float(s)) for s in GENERATION_STEPS]


def test_trajectories_keep_messages_tool_calls_rewards_and_token_counts(sink, logdir):
    """Each trajectory is one row of its step's table whose JSON cells parse back to what was written."""
    written = write_trajectories(sink)
    sink.close(0)

    assert_trajectory_tables(read_swanlab_media(logdir, run_id=RUN_ID).tables("rollout/trajectories"), written, score=number)


def test_histogram_text_and_image_come_back_as_written(sink, logdir):
    """Bars equal np.histogram of the finite values, with summary scalars; text is equal; image pixels are equal."""
    written = media([math.nan, math.inf, -math.inf, math.nan])
    sink.write(written.records())
    sink.close(0)

    back = read_swanlab_media(logdir, run_id=RUN_ID)
    bars = back.bars("rollout/kl")
    scalars = read_swanlab_run(logdir, run_id=RUN_ID).scalars()
    assert sorted(bars) == [1, 2]
    for step, array in written.values.items():
        finite = array[np.isfinite(array)]
        counts, edges = np.histogram(finite, bins=30)
        assert bars[step] == ([f"{edge:.6g}" for edge in edges[:-1]], counts.tolist())
        assert scalars[step] == {"rollout/kl/mean": finite.mean(), "rollout/kl/std": finite.std(),
                                 "rollout/kl/min": finite.min(), "rollout/kl/max": finite.max(),
                                 "rollout/kl/count": finite.size}
    assert back.of("rollout/empty") == {} and scalars[3] == {"rollout/empty/count": 0.0}

    assert back.texts("notes/prompt") == written.texts

    stored = back.images("samples/picture")
    assert sorted(stored) == [1, 2]
    for step, array in written.images.items():
        assert np.array_equal(np.asarray(PILImage.open(stored[step])), array)
    assert np.array_equal(np.asarray(PILImage.open(back.images("samples/grey")[3])), written.grey)


def test_artifacts_are_copied_into_the_run_and_saved(sink, logdir, tmp_path):
    """A file and a directory are copied under the run's files/ and registered with save; a missing path is counted."""
    content = write_artifacts(sink, tmp_path)  # the file is gone afterwards: the run kept a copy
    sink.close(0)

    saved = {f.name: f for f in read_swanlab_media(logdir, run_id=RUN_ID).saved}
    assert sorted(saved) == ["artifacts/dataset/tokenizer/step_10/tokenizer/sub/merges.txt",
                             "artifacts/dataset/tokenizer/step_10/tokenizer/vocab.json",
                             "artifacts/model/actor_ckpt_step_10/step_10/model[1].bin"]
    for entry in saved.values():
        assert entry.target.is_file() and not entry.target.is_symlink() and entry.target == entry.source
    assert saved["artifacts/model/actor_ckpt_step_10/step_10/model[1].bin"].target.read_bytes() == content
    assert saved["artifacts/dataset/tokenizer/step_10/tokenizer/vocab.json"].target.read_bytes() == b'{"a": 1}'
    assert sink.counts.artifacts_missing == 1
