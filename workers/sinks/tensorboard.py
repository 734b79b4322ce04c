"""TensorBoard: event files written with the ``tensorboard`` package's own writer (no torch).

One ``Summary`` per step carries all of that step's scalars as ``simple_value`` (float32, as
``SummaryWriter.add_scalar`` stores them). Hyper-parameters go once, at step 0, as a markdown
table in a text summary tagged ``hyperparameters``. After a restart a new event file is opened
in the same directory; TensorBoard reads every file there as one run. ``write()`` returns once
its events are handed to the OS, so a batch it was handed survives the actor's death.

Rich records, one event per record at its step:

    generations   text  "<key>/text_summary": markdown table, columns GENERATION_COLUMNS (workers/sinks/media.py)
    trajectories  text  "<key>/text_summary": markdown table, columns TRAJECTORY_COLUMNS: nested parts as
                  JSON cells (NaN written as the token NaN), the token count (the ids are in the file
                  logger's and MLflow's JSON); an empty list is written as "*no samples*" / "*no trajectories*"
    histogram     histo "<name>": 30 bins of the finite values (non-finite ones left out; none finite: no event)
    text          text  "<name>/text_summary"
    alert         the text ``alert/<rule>``
    image         image "<name>": the PNG bytes as given, with height, width and colour space from its header
    artifact      not stored (TensorBoard holds no files): counted in ``unsupported`` by the base class

Text tags end in ``/text_summary`` as ``torch``'s ``SummaryWriter.add_text`` writes them (verl logs its
validation generations that way). In table cells ``|`` and ``\\`` are escaped and line breaks become ``<br>``.
"""

from __future__ import annotations

import html
import os
import re
import struct
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tracklane.core.histogram import HistogramFigures
from tracklane.core.params import flatten_params
from tracklane.core.records import Generations, Histogram, Image, Metrics, Record, RunSpec, Text, Trajectories
from tracklane.host.sink import Sink, import_sdk
from tracklane.workers.sinks.media import GENERATION_COLUMNS, TRAJECTORY_COLUMNS, generation_rows, trajectory_rows

PARAMS_TAG = "hyperparameters"
FLUSH_SECS = 10  # the writer thread's own flush period; write() and flush() force one
MAX_QUEUED_EVENTS = 100  # events (steps) queued for the writer thread before add_event blocks
TEXT_SUFFIX = "/text_summary"  # torch's SummaryWriter.add_text appends it to every text tag
# PNG colour type (IHDR byte 25) -> Summary.Image colorspace: 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA
_PNG_COLORSPACE = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}
_FLOAT32_TINY, _FLOAT32_MAX = 1.401298464324817e-45, 3.4028234663852886e38  # smallest subnormal, largest finite
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|>~])")


class TensorboardSink(Sink):
    name = "tensorboard"
    sdk_module = "tensorboard"
    extra = "tensorboard"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        logdir = env.get("TENSORBOARD_DIR") or os.path.join("tensorboard_log", run.project, run.experiment)
        return {"logdir": os.path.abspath(logdir)}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.logdir: str = self.settings["logdir"]
        self._writer: Any = None

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        writer_module = import_sdk(type(self), "tensorboard.summary.writer.event_file_writer")
        os.makedirs(self.logdir, exist_ok=True)
        # The file name holds time (s), host, pid and a per-process counter; the random
        # suffix also keeps apart writers on hosts that share a name and a pid.
        self._writer = writer_module.EventFileWriter(
            self.logdir, max_queue_size=MAX_QUEUED_EVENTS, flush_secs=FLUSH_SECS,
            filename_suffix=f".{uuid.uuid4().hex[:8]}",
        )
        if not resume:
            self._write_params()
            self._writer.flush()
        return {"logdir": self.logdir}

    def _write_params(self) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb

        rows = ["| parameter | value |", "|---|---|"]
        rows += [f"| {_cell(key)} | {_cell(value)} |" for key, value in flatten_params(self.run.params).items()]
        summary = text_pb(PARAMS_TAG, "\n".join(rows))
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))

    def write(self, records: Sequence[Record]) -> None:
        super().write(records)
        self._writer.flush()  # in the OS's hands before the batch counts as handed

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        from tensorboard.compat.proto import summary_pb2

        # An event a record, as verl's add_scalar a value: two calls logging one key at one step are two points
        # (merged, the later one would hide the earlier)
        for record in records:
            values = record.values
            self._add(record, summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=key, simple_value=value)
                                                         for key, value in values.items()]))
            changed = sum(map(_beyond_float32, values.values()))
            if changed:  # simple_value is a float32: 1e300 is shown as Infinity, 1e-300 as 0
                self.counts.add(self.counts.cuts, "float32_out_of_range", changed)

    def write_generations(self, records: Sequence[Generations]) -> None:
        for record in records:
            self._add(record, _text(record.key, _table(GENERATION_COLUMNS, generation_rows(record), "no samples")))

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        for record in records:
            self._add(record, _text(record.key, _table(TRAJECTORY_COLUMNS, trajectory_rows(record), "no trajectories")))

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        for record in records:
            histogram = _histogram_proto(record.summary())
            if histogram is not None:
                self._add(record, _value(tag=record.name, histo=histogram))

    def write_text(self, records: Sequence[Text]) -> None:
        for record in records:
            self._add(record, _text(record.name, record.text))

    def write_image(self, records: Sequence[Image]) -> None:
        from tensorboard.compat.proto import summary_pb2

        for record in records:
            width, height, colour_type = struct.unpack(">IIxB", record.png[16:26])  # the IHDR chunk
            image = summary_pb2.Summary.Image(height=height, width=width, encoded_image_string=record.png,
                                              colorspace=_PNG_COLORSPACE.get(colour_type, 3))
            self._add(record, _value(tag=record.name, image=image))

    def _add(self, record: Record, summary: Any) -> None:
        from tensorboard.compat.proto import event_pb2

        self._writer.add_event(event_pb2.Event(wall_time=record.time, step=record.step, summary=summary))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    # -- exactly once: an event file is a sequence of records; cut it back to the last one handed
    def mark(self, records: Sequence[Record]) -> dict[str, Any] | None:
        path = getattr(self._writer, "_file_name", None)  # EventFileWriter keeps its file's name here
        if not isinstance(path, str) or not os.path.exists(path):
            return None
        return {"event_file": path, "size": os.path.getsize(path)}  # every earlier batch was flushed

    def rollback(self, mark: Mapping[str, Any]) -> None:
        path, size = str(mark["event_file"]), int(mark["size"])
        if os.path.exists(path) and os.path.getsize(path) > size:
            os.truncate(path, size)

    def close(self, exit_code: int) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def where(self) -> str:
        return f"tensorboard: {self.logdir} (view: tensorboard --logdir {self.logdir})"


def _text(name: str, text: str) -> Any:
    from tensorboard.plugins.text.summary_v2 import text_pb

    return text_pb(name + TEXT_SUFFIX, text)


def _value(**value: Any) -> Any:
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(**value)])


def _beyond_float32(value: float | int) -> bool:
    """A finite, non-zero value float32 turns into infinity or zero."""
    magnitude = abs(value)
    return magnitude != 0 and magnitude != float("inf") and magnitude == magnitude \
        and not _FLOAT32_TINY <= magnitude <= _FLOAT32_MAX


def _cell(value: Any) -> str:
    """A value as one markdown table cell that TensorBoard shows as it was logged: HTML and every markdown
    character escaped (its text plugin renders markdown: ``__init__`` came out bold, ``a*b*c`` italic,
    ``&amp;`` as ``&``, seen through its own server), line breaks as ``<br>``."""
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(str(value), quote=False))
    return text.replace("\r\n", "<br>").replace("\r", "<br>").replace("\n", "<br>")


def parse_params_table(markdown: str) -> dict[str, str]:
    """The ``| parameter | value |`` table ``_write_params`` writes -> {flattened key: value as text} (its inverse;
    ``tracklane migrate --from tensorboard`` reads a tracklane run's params with it)."""
    rows = [table_cells(line) for line in markdown.split("\n")[2:]]  # after the header and the |---| line
    return {cells[0]: cells[1] for cells in rows if len(cells) == 2}


def table_cells(line: str) -> list[str]:
    """A row of a table ``_table`` writes, split on unescaped pipes, ``_cell``'s escapes undone ("\\x" -> "x", "<br>" ->
    line break, entities): ``| a | b\\|c |`` -> ["a", "b|c"]."""
    cells, cell, chars = [], [], iter(line)
    for char in chars:
        if char == "\\":
            cell.append(next(chars, ""))
        elif char == "|":
            cells.append("".join(cell))
            cell = []
        else:
            cell.append(char)
    return [html.unescape(text[1:-1].replace("<br>", "\n")) for text in cells[1:]]


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], empty: str) -> str:
    """A markdown table, one cell per value; ``empty`` in italics when there are no rows.

    (TensorBoard renders a header-only table with one blank row, which would read as a sample.)
    """
    if not rows:
        return f"*{empty}*"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _histogram_proto(figures: HistogramFigures) -> Any:
    """A HistogramProto of the finite values: 30 numpy bins after an empty one whose limit is the left edge.

    TensorBoard stores only right bin limits; the leading empty bucket keeps the left edge, as
    torch's ``make_histogram`` does. None when no value is finite.
    """
    from tensorboard.compat.proto import summary_pb2

    if not figures.count:
        return None
    return summary_pb2.HistogramProto(
        min=figures.min, max=figures.max, num=float(figures.count), sum=figures.sum, sum_squares=figures.sum_squares,
        bucket_limit=figures.bin_edges, bucket=[0.0, *figures.counts],
    )
