"""Read a TensorBoard log directory back: scalars, the params table, and text, histogram and image events."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklane.workers.sinks.tensorboard import PARAMS_TAG, parse_params_table, table_cells
from tracklane.workers.sources.tensorboard import KEEP_ALL as KEEP_ALL  # benchmarks/chaos_check.py reads with it
from tracklane.workers.sources.tensorboard import load_events
from tracklane.workers.testing.readers import ReadBack


def _accumulators(logdir: str | Path) -> list[Any]:
    """One loaded accumulator per event file, oldest first: every event (no sampling), none purged, so a step
    written twice across a restart shows up twice."""
    return [load_events(path) for path in sorted(Path(logdir).glob("events.out.tfevents.*"))]


def read_tensorboard_dir(logdir: str | Path) -> ReadBack:
    """All scalar points of all event files in ``logdir`` (file by file, duplicates kept) and params."""
    back = ReadBack()
    for acc in _accumulators(logdir):
        tags = acc.Tags()
        for tag in tags["scalars"]:
            back.points += [(event.step, tag, event.value) for event in acc.Scalars(tag)]
        if PARAMS_TAG in tags["tensors"]:
            for event in acc.Tensors(PARAMS_TAG):
                back.params.update(parse_params_table(event.tensor_proto.string_val[0].decode()))
    back.points.sort(key=lambda point: point[0])  # stable: storage order kept within a step
    return back


@dataclass
class RichEvents:
    """Text, histogram and image events of a log directory: tag -> step -> values in storage order."""

    texts: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    """Text summaries (tags as stored, e.g. ``val/generations/text_summary``), the params table left out."""
    histograms: dict[str, dict[int, list[Any]]] = field(default_factory=dict)
    """``HistogramValue``s: min, max, num, sum, sum_squares, bucket_limit, bucket."""
    images: dict[str, dict[int, list[Any]]] = field(default_factory=dict)
    """``ImageEvent``s: encoded_image_string, width, height."""


def read_tensorboard_rich(logdir: str | Path) -> RichEvents:
    """Every text, histogram and image event of every event file in ``logdir``, duplicates kept."""
    back = RichEvents()
    for acc in _accumulators(logdir):
        tags = acc.Tags()
        for tag in tags["tensors"]:
            if tag != PARAMS_TAG:
                for event in acc.Tensors(tag):
                    _add(back.texts, tag, event.step, event.tensor_proto.string_val[0].decode("utf-8"))
        for tag in tags["histograms"]:
            for event in acc.Histograms(tag):
                _add(back.histograms, tag, event.step, event.histogram_value)
        for tag in tags["images"]:
            for event in acc.Images(tag):
                _add(back.images, tag, event.step, event)
    return back


def _add(out: dict[str, dict[int, list[Any]]], tag: str, step: int, value: Any) -> None:
    out.setdefault(tag, {}).setdefault(step, []).append(value)


def parse_markdown_table(markdown: str) -> list[list[str]]:
    """The rows (header left out) of a table the sink writes, each cell unescaped (backslash escapes, "<br>"
    -> newline, HTML entities): ``tracklane.workers.sinks.tensorboard.table_cells`` of each line."""
    return [table_cells(line) for line in markdown.split("\n")[2:]]  # after the header and the |---| line; only "\n" ends a row
