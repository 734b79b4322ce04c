"""TensorboardSink's rich records in real event files, read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("PIL.Image")
from PIL import Image as PIL_Image
from tensorboard.plugin_util import markdown_to_safe_html

from tracklane.core.png import encode_png
from tracklane.core.records import Artifact, Generations, Histogram, Image, Metrics, RunSpec, Text, Trajectories, Trajectory
from tracklane.workers.sinks.tensorboard import TensorboardSink
from tracklane.workers.testing.readers.tensorboard_reader import parse_markdown_table, read_tensorboard_dir, read_tensorboard_rich

LONG = "长" * 16_384  # as long as record_limits.max_chars lets a string be
SAMPLES = [["q: 2+2?", "4", 1.0], ["", "", 0.0],
           ["naïve 🤖 a | b \\ c\nnew line\r\nand\rmore", "ответ", math.nan], [LONG, "x" * 1000, -0.5]]


def open_sink(logdir: Path) -> TensorboardSink:
    run = RunSpec(project="p", experiment="e", params={"lr": 1e-6})
    sink = TensorboardSink(run, TensorboardSink.resolve(run, {"TENSORBOARD_DIR": str(logdir)}, {}))
    sink.open(None)
    return sink


def only(events: dict[int, list]) -> dict[int, object]:
    """step -> its one event (fails on a duplicate)."""
    assert all(len(values) == 1 for values in events.values()), events
    return {step: values[0] for step, values in events.items()}


def test_generations_as_one_markdown_table_per_step(tmp_path):
    """Each step is one text event holding a table whose cells give back every input, output and score."""
    sink = open_sink(tmp_path)
    records = [Generations(step=step, samples=SAMPLES[step:] if step < 4 else [], time=1.7e9 + step)
               for step in range(5)]
    sink.write(records)
    sink.close(0)

    texts = read_tensorboard_rich(tmp_path).texts
    assert set(texts) == {"val/generations/text_summary"}
    back = only(texts["val/generations/text_summary"])
    assert sorted(back) == list(range(5))
    for step, record in enumerate(records):
        expected = [[str(step), row[0].replace("\r\n", "\n").replace("\r", "\n"), row[1], str(row[2])]
                    for row in record.samples]
        assert parse_markdown_table(back[step]) == expected, step
        html = markdown_to_safe_html(back[step])  # how TensorBoard's text tab renders it
        assert html.count("<table>") == (step < 4) and html.count("<tr>") == (len(record.samples) + 1) * (step < 4)
    assert parse_markdown_table(back[0])[2][3] == "nan" and back[4] == "*no samples*"


def trajectory(index: int) -> Trajectory:
    tokens = np.array([0, 1, -1, 2**31 - 1, -(2**31), 151_643 + index], dtype="<i4")
    return Trajectory(
        messages=[{"role": "system", "content": ""}, {"role": "user", "content": f"solve #{index} ∑ | x"},
                  {"role": "assistant", "content": "<tool_call>calc</tool_call>\nok"}],
        tool_calls=[{"name": "calc", "arguments": '{"x": 1}', "result": "2\n", "latency_s": 0.125},
                    {"name": "search", "arguments": "", "result": "", "latency_s": None}],
        rewards={"score": math.nan if index == 1 else index / 2, "format": 1.0},
        meta={"sample_index": index, "rollout_index": 0, "validation": index == 2},
        token_ids=tokens.tobytes(),
    )


def test_trajectories_round_trip_through_json_cells(tmp_path):
    """Each trajectory is a table row (media.TRAJECTORY_COLUMNS) whose cells give back rewards, meta, messages,
    tool calls and the token count."""
    sink = open_sink(tmp_path)
    records = [Trajectories(step=3, trajectories=[trajectory(i) for i in range(3)], time=1.7e9),
               Trajectories(step=4, trajectories=[], time=1.7e9 + 1)]
    sink.write(records)
    sink.close(0)

    back = only(read_tensorboard_rich(tmp_path).texts["rollout/trajectories/text_summary"])
    assert back[4] == "*no trajectories*"
    rows = parse_markdown_table(back[3])
    for row, original in zip(rows, records[0].trajectories, strict=True):
        step, sample_index, rollout_index, validation, score, rewards, messages, tool_calls, num_tokens, meta = row
        assert json.loads(messages) == original.messages and json.loads(tool_calls) == original.tool_calls
        meta_back = {**json.loads(meta), "sample_index": int(sample_index), "rollout_index": int(rollout_index),
                     "validation": validation == "True"}
        assert step == "3" and meta_back == original.meta and int(num_tokens) == original.token_array().size
        assert json.loads(rewards).keys() == original.rewards.keys()
        assert str(original.score()) == score
    assert math.isnan(json.loads(rows[1][5])["score"]) and rows[1][4] == "nan"


def test_histogram_buckets_equal_numpy_bins(tmp_path):
    """Buckets are np.histogram's 30 bins of the finite values after an empty left-edge bucket; all-NaN writes none."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0.5, 2.0, 5000), [math.nan, math.inf, -math.inf]])
    sink = open_sink(tmp_path)
    sink.write([Histogram(step=7, name="critic/rewards", values=values.tobytes(), time=1.7e9),
                Histogram(step=8, name="critic/rewards", values=np.array([math.nan]).tobytes(), time=1.7e9)])
    sink.close(0)

    back = only(read_tensorboard_rich(tmp_path).histograms["critic/rewards"])
    assert list(back) == [7]
    finite = values[np.isfinite(values)]
    counts, edges = np.histogram(finite, bins=30)
    histogram = back[7]
    assert list(histogram.bucket) == [0, *counts] and list(histogram.bucket_limit) == edges.tolist()
    assert (histogram.min, histogram.max, histogram.num) == (finite.min(), finite.max(), 5000)
    assert histogram.sum == pytest.approx(finite.sum()) and histogram.sum_squares == pytest.approx(finite @ finite)


def test_text_image_and_artifact(tmp_path):
    """Text comes back equal, images as the same PNG bytes and pixels; artifacts are counted unsupported."""
    rng = np.random.default_rng(1)
    arrays = {"rgb": rng.integers(0, 256, (12, 20, 3), dtype=np.uint8),
              "rgba": rng.integers(0, 256, (5, 7, 4), dtype=np.uint8),
              "gray": rng.integers(0, 256, (9, 4), dtype=np.uint8)}
    (tmp_path / "model.bin").write_bytes(b"weights")
    logdir = tmp_path / "tb"
    sink = open_sink(logdir)
    sink.write([
        Text(step=1, name="notes/summary", text="héllo\n| not a table |\n\tend ", time=1.7e9),
        Text(step=2, name="notes/summary", text="", time=1.7e9),
        *[Image(step=i, name=f"val/{name}", png=encode_png(array), time=1.7e9)
          for i, (name, array) in enumerate(arrays.items())],
        Artifact(step=3, path=str(tmp_path / "model.bin"), name="best", type="model", time=1.7e9),
        Metrics(step=3, values={"a": 1.0}, time=1.7e9),
    ])
    sink.close(0)

    back = read_tensorboard_rich(logdir)
    assert only(back.texts["notes/summary/text_summary"]) == {1: "héllo\n| not a table |\n\tend ", 2: ""}
    for i, (name, array) in enumerate(arrays.items()):
        event = only(back.images[f"val/{name}"])[i]
        assert event.encoded_image_string == encode_png(array)
        assert (event.height, event.width) == array.shape[:2]
        assert np.array_equal(np.asarray(PIL_Image.open(io.BytesIO(event.encoded_image_string))), array)
    assert sink.counts.unsupported == {"artifact": 1}
    assert read_tensorboard_dir(logdir).points == [(3, "a", 1.0)]


def test_rich_records_do_not_import_torch(tmp_path):
    """Every rich kind is written with the tensorboard package alone, never importing torch or tensorflow."""
    script = (
        "import sys, numpy as np\n"
        "from tracklane.core.png import encode_png\n"
        "from tracklane.core.records import *\n"
        "from tracklane.workers.sinks.tensorboard import TensorboardSink\n"
        f"sink = TensorboardSink(RunSpec(project='p', experiment='e'), {{'logdir': {str(tmp_path)!r}}})\n"
        "sink.open(None)\n"
        "sink.write([Generations(step=1, samples=[['i', 'o', 1.0]], time=0.0),\n"
        "            Trajectories(step=1, trajectories=[Trajectory(token_ids=b'\\x01\\0\\0\\0')], time=0.0),\n"
        "            Histogram(step=1, name='h', values=np.ones(3).tobytes(), time=0.0),\n"
        "            Text(step=1, name='t', text='x', time=0.0),\n"
        "            Image(step=1, name='i', png=encode_png(np.zeros((2, 2), np.uint8)), time=0.0)])\n"
        "sink.close(0)\n"
        "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script], check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    back = read_tensorboard_rich(tmp_path)
    assert set(back.texts) == {"val/generations/text_summary", "rollout/trajectories/text_summary", "t/text_summary"}
    assert set(back.histograms) == {"h"} and set(back.images) == {"i"}
