"""The rich records the wandb, SwanLab and ClearML sink tests write, and the checks of their tables they share.

Each test opens its tracker's sink, writes one of these sets, closes the sink and reads back what the tracker
stored with its reader (workers/testing/readers/); what differs per tracker (how it stores a histogram, where
its files go) stays in the test.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image as PILImage

from tests.conftest import same_value
from tracklane.core.records import Artifact, Generations, Histogram, Image, Metrics, RunSpec, Text, Trajectories, Trajectory
from tracklane.host.sink import Sink
from tracklane.workers.sinks.media import GENERATION_COLUMNS, TRAJECTORY_COLUMNS

LONG = "é🚀x" * 333_334  # ~1 MB of characters, as if the converter had kept it whole
RUN_ID = "rich1"
GENERATION_STEPS: dict[int, list[list[Any]]] = {
    0: [["héllo 中文 🚀", "", math.nan], ["", "out", 1.0]],
    1: [[LONG, "ok", -0.5]],
    2: [],
    3: [["q3", "a3", 0.25]],
}
"""Step -> the samples of its validation generations (unicode, "", NaN, 1 MB; none at step 2)."""


def opened_sink(cls: type[Sink]) -> Iterator[Sink]:
    """For a fixture to ``yield from``: a ``cls`` sink opened on run ``RUN_ID`` with the tracker settings the
    environment gives, closed (exit code 1) afterwards if the test did not close it."""
    run = RunSpec(project="p", experiment="e", params={"lr": 0.1}, run_id=RUN_ID)
    sink = cls(run, cls.resolve(run, os.environ, {}))
    sink.open(None)
    yield sink
    sink.close(1)


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array).save(out, format="PNG")
    return out.getvalue()


# -- generations ------------------------------------------------------------------------------
def write_generations(sink: Sink, steps: dict[int, list[list[Any]]] = GENERATION_STEPS) -> dict[int, list[list[Any]]]:
    """Write, in two batches cut inside a step, each step's "val/score" and generations, then at step 3 more
    rows of the same key and a table of another key ("val/other"); return step -> the "val/generations"
    rows the tracker should hold (``[step, input, output, score]``)."""
    records: list[Metrics | Generations] = []
    for step, samples in steps.items():
        records += [Metrics(step=step, values={"val/score": float(step)}, time=0.0),
                    Generations(step=step, samples=samples, time=0.0)]
    records.append(Generations(step=3, samples=[["q3b", "a3b", math.inf]], time=0.0))  # same step, same key
    records.append(Generations(step=3, samples=[["other", "key", 2.0]], time=0.0, key="val/other"))
    sink.write(records[:3])
    sink.write(records[3:])
    want = {step: [[step, *row] for row in rows] for step, rows in steps.items() if rows}
    want[3].append([3, "q3b", "a3b", math.inf])
    return want


def assert_generation_tables(tables: dict[int, tuple[list[str], list[list[Any]]]], want: dict[int, list[list[Any]]],
                             score: Callable[[Any], float]) -> None:
    """Tables (step -> (headers, rows)) hold exactly ``want``'s steps and rows, a score cell read with ``score``."""
    assert sorted(tables) == sorted(want)
    for step, rows in want.items():
        headers, got = tables[step]
        assert headers == GENERATION_COLUMNS
        assert [row[:3] for row in got] == [row[:3] for row in rows]
        assert all(same_value(score(g[3]), w[3]) for g, w in zip(got, rows, strict=True))


# -- trajectories -----------------------------------------------------------------------------
def trajectory(i: int, step: int) -> Trajectory:
    return Trajectory(
        messages=[{"role": "user", "content": f"question {i} ü"}, {"role": "assistant", "content": ""}],
        tool_calls=[{"name": "search", "arguments": '{"q": "中文"}', "result": "r" * 100, "latency_s": 0.25}],
        rewards={"score": float(i), "format": math.nan},
        meta={"sample_index": i, "rollout_index": step, "validation": i % 2 == 0, "uid": f"u{i}"},
        token_ids=np.arange(10 * i, dtype="<i4").tobytes(),
    )


def write_trajectories(sink: Sink) -> dict[int, list[Trajectory]]:
    """Write three trajectories at steps 5 and 6, then an empty list at step 7 (stores nothing); return them by step."""
    written = {step: [trajectory(i, step) for i in range(3)] for step in (5, 6)}
    sink.write([Trajectories(step=step, trajectories=items, time=0.0) for step, items in written.items()])
    sink.write([Trajectories(step=7, trajectories=[], time=0.0)])
    return written


def assert_trajectory_tables(tables: dict[int, tuple[list[str], list[list[Any]]]], written: dict[int, list[Trajectory]],
                             score: Callable[[Any], Any] = lambda cell: cell) -> None:
    """Tables (step -> (headers, rows)) hold ``written``'s steps, a row each trajectory: its JSON cells parse back
    to what was written, the score cell read with ``score``; the token ids are counted."""
    assert sorted(tables) == sorted(written)
    for step, items in written.items():
        headers, got = tables[step]
        assert headers == TRAJECTORY_COLUMNS and len(got) == len(items)
        for row, item in zip((dict(zip(headers, row, strict=True)) for row in got), items, strict=True):
            assert row["step"] == step and score(row["score"]) == item.score()
            assert (row["sample_index"], row["rollout_index"], row["validation"]) == (
                item.meta["sample_index"], item.meta["rollout_index"], item.meta["validation"])
            assert json.loads(row["messages"]) == item.messages
            assert json.loads(row["tool_calls"]) == item.tool_calls
            rewards = json.loads(row["rewards"])
            assert rewards["score"] == item.rewards["score"] and math.isnan(rewards["format"])
            assert json.loads(row["meta"]) == {"uid": item.meta["uid"]}
            assert row["num_tokens"] == item.token_array().size


# -- histograms, text, images -----------------------------------------------------------------
@dataclass
class Media:
    """Histogram values, images and texts by step, to write with ``records`` and compare with what was stored."""

    values: dict[int, np.ndarray]
    """"rollout/kl" at steps 1 and 2 (1000 normal values; step 2 starts with non-finite ones)."""
    images: dict[int, np.ndarray]
    """"samples/picture" at steps 1 (RGB) and 2 (RGBA)."""
    grey: np.ndarray
    """A greyscale image at step 3."""
    texts: dict[int, str]
    """"notes/prompt" at steps 1 to 3 (unicode and a line break, "", 1 MB)."""

    def records(self, grey_name: str = "samples/grey") -> list[Histogram | Image | Text]:
        """Per step its histogram, image and text; at step 3 also a histogram of no finite value ("rollout/empty")
        and the greyscale image, named ``grey_name``."""
        records: list[Histogram | Image | Text] = []
        for step in (1, 2, 3):
            if step in self.values:
                records += [Histogram(step=step, name="rollout/kl", values=self.values[step].tobytes(), time=0.0),
                            Image(step=step, name="samples/picture", png=png(self.images[step]), time=0.0)]
            records.append(Text(step=step, name="notes/prompt", text=self.texts[step], time=0.0))
        records += [Histogram(step=3, name="rollout/empty", values=np.array([math.nan]).tobytes(), time=0.0),
                    Image(step=3, name=grey_name, png=png(self.grey), time=0.0)]
        return records


def media(nonfinite: list[float]) -> Media:
    """The same values every time (seeded), the first ones of step 2's histogram replaced by ``nonfinite``."""
    rng = np.random.default_rng(0)
    values = {step: rng.normal(step, 1.0, 1000) for step in (1, 2)}
    values[2][:len(nonfinite)] = nonfinite
    images = {1: rng.integers(0, 256, (12, 20, 3), dtype=np.uint8), 2: rng.integers(0, 256, (9, 7, 4), dtype=np.uint8)}
    grey = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    return Media(values=values, images=images, grey=grey, texts={1: "première ligne\n第二行 🚀", 2: "", 3: LONG})


# -- artifacts --------------------------------------------------------------------------------
def write_artifacts(sink: Sink, folder: Path) -> bytes:
    """Write a file artifact (a 100 kB "model[1].bin", deleted afterwards: the trainer may rotate its checkpoints
    away, the tracker keeps a copy), a directory one ("tokenizer": vocab.json, sub/merges.txt) and one whose path
    does not exist, all made under ``folder``; return the file's content."""
    checkpoint = folder / "model[1].bin"
    checkpoint.write_bytes(os.urandom(100_000))
    tokenizer = folder / "tokenizer"
    (tokenizer / "sub").mkdir(parents=True)
    (tokenizer / "vocab.json").write_text('{"a": 1}', encoding="utf-8")
    (tokenizer / "sub" / "merges.txt").write_text("a b\n", encoding="utf-8")
    sink.write([
        Artifact(step=10, path=str(checkpoint), name="actor ckpt/step:10", type="model", time=0.0),
        Artifact(step=10, path=str(tokenizer), name="tokenizer", type="dataset", time=0.0),
        Artifact(step=11, path=str(folder / "gone.bin"), name="gone", type="model", time=0.0),
    ])
    content = checkpoint.read_bytes()
    checkpoint.unlink()
    return content
