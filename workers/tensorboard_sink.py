"""TensorBoard: event files written with the ``tensorboard`` package's own writer (no torch).

One ``Summary`` per step carries all of that step's scalars as ``simple_value`` (float32, as
``SummaryWriter.add_scalar`` stores them). Hyper-parameters go once, at step 0, as a markdown
table in a text summary tagged ``hyperparameters``. After a restart a new event file is opened
in the same directory; TensorBoard reads every file there as one run. ``write()`` returns once
its events are handed to the OS, so an acknowledged batch survives the actor's death.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Mapping, Sequence

from pipeline.params import flatten_params
from pipeline.records import Metrics, RunSpec
from workers.sink import Sink, import_sdk

PARAMS_TAG = "hyperparameters"
FLUSH_SECS = 10  # the writer thread's own flush period; write() and flush() force one
MAX_QUEUED_EVENTS = 100  # events (steps) queued for the writer thread before add_event blocks


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
        self._writer.add_event(event_pb2.Event(step=0, summary=summary))

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary, step, wall_time = None, None, 0.0
        for record in records:
            if record.step != step:
                if summary is not None:
                    self._writer.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
                summary, step, wall_time = summary_pb2.Summary(), record.step, record.time
            summary.value.extend(
                summary_pb2.Summary.Value(tag=key, simple_value=value) for key, value in record.values.items()
            )
        if summary is not None:
            self._writer.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
        self._writer.flush()  # in the OS's hands before the batch is acknowledged

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self, exit_code: int) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def where(self) -> str:
        return f"tensorboard: {self.logdir} (view: tensorboard --logdir {self.logdir})"


def _cell(value: Any) -> str:
    """A value as one markdown table cell: pipes escaped, line breaks flattened."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")
