"""File tracker: verl 0.9.1's ``FileLogger`` file, byte for byte, and what tracklane adds beside it.

``<name>.jsonl`` holds one line per ``log()`` call, ``{"step": N, "data": {...}}``, as verl's FileLogger writes it:
``orjson.dumps(..., option=OPT_SERIALIZE_NUMPY)`` of the call's dict (compact, NaN and +-Inf as ``null``, bools,
strings and nested dicts as the caller passed them: ``Metrics.verl_data``, capture/verl_line.py). Nothing else
goes into it, so a reader of verl's file (a strict JSON parser, ``max(step)``) reads tracklane's the same.

What tracklane adds goes into ``<name>_tracklane/``: ``run.json`` (project, experiment, run id, whether resumed, the
config) and ``metrics.jsonl`` (its ``tracklane/*`` vitals and the lines of metrics on another axis than the
trainer's step, a producer's own or the system metrics' seconds: ``{"step", "axis", "data"}``). Rich records go
beside it too: validation generations and rollout trajectories as one ``{step}.jsonl`` per step in
``<name>_generations/`` and ``<name>_rollouts/`` (the shape of verl's ``validation_data_dir`` / ``rollout_data_dir``
dumps, but never in those folders: verl's trainer writes its own ``{step}.jsonl`` there, and the two would mix or
overwrite each other), verl's rollout traces as one ``{step}.jsonl`` per step in ``<name>_traces/`` (``{"step", "name",
"key", "start_ns", "end_ns", "status", "attributes", "messages", "metadata"}``, the metadata nested as verl made it),
histograms, text, images and artifacts under ``<name>_media/``: an artifact is copied to
``artifacts/<type>/<name>/step_<step>/<file or folder name>``, so each step's version of one name is kept. Every
file is strict JSON, encoded by orjson; rollout rows are rendered so by the shipper (core/trajectory_lines.py) and
this sink appends the bytes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from tracklane.core.files import write_atomically
from tracklane.core.packed_values import PackedValues
from tracklane.core.records import (
    Artifact,
    Generations,
    Histogram,
    Image,
    Metrics,
    Record,
    RunSpec,
    Text,
    Trace,
    Trajectories,
)
from tracklane.core.trajectory_lines import TrajectoryLines, trajectory_line
from tracklane.host.sink import Sink
from tracklane.workers.sinks.media import safe_name
from tracklane.workers.sinks.steps import merge_by_axis_step


class FileSink(Sink):
    name = "file"
    takes_pieces = True  # appends each chunk to the step's rollout file
    writes_verl_lines = True  # verl's FileLogger line of each log() call
    reads_packed_metrics = True  # verl's line rendered from the wire's numbers (_verl_line)

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        path = env.get("VERL_FILE_LOGGER_PATH")
        if not path:
            root = os.path.expanduser(env.get("VERL_FILE_LOGGER_ROOT", "."))
            path = os.path.join(root, run.project, f"{run.experiment}.jsonl")
        base = os.path.splitext(os.path.abspath(path))[0]
        # Folders of the file tracker's own, whatever trainer.validation_data_dir / rollout_data_dir say (docstring).
        return {"path": os.path.abspath(path), "validation_dir": f"{base}_generations", "rollout_dir": f"{base}_rollouts",
                "media_dir": f"{base}_media", "traces_dir": f"{base}_traces", "tracklane_dir": tracklane_dir(path)}

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        path = self.settings["path"]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # A fresh run truncates like verl; a restarted actor, or a resumed training run, appends.
        appending = resume is not None or self.run.resume
        # Unbuffered, as verl's FileLogger opens it: each write() is in the file when it returns.
        self._handle = open(path, "ab" if appending else "wb", buffering=0)
        if appending and not _ends_a_line(path):  # a kill tore the last line: ours start on a line of their own
            self._handle.write(b"\n")
        own = self._own_dir()
        os.makedirs(own, exist_ok=True)
        side = os.path.join(own, METRICS_FILE)
        self._side = open(side, "ab" if appending else "wb", buffering=0)
        if appending and not _ends_a_line(side):
            self._side.write(b"\n")
        if resume is None:
            identity = {"project": self.run.project, "experiment": self.run.experiment, "run_id": self.run.run_id,
                        "resumed": self.run.resume, "config": self.run.params}
            write_atomically(os.path.join(own, RUN_FILE),
                             orjson.dumps(identity, option=_OPTIONS | orjson.OPT_NON_STR_KEYS))
        return {"path": path}

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        # verl's lines, one a call; tracklane's own figures and other axes' lines beside the file. One write each.
        verl: list[Metrics] = []
        own: list[Metrics] = []
        for record in records:
            (own if record.axis is not None or _tracklanes(record.values) else verl).append(record)
        if verl:
            self._handle.write(b"".join(map(_verl_line, verl)))
        if own:
            self._side.write(b"".join(_line({"step": step, "data": values} if axis is None else
                                            {"step": step, "axis": axis, "data": values})
                                      for axis, step, values in merge_by_axis_step(own)))

    def write_generations(self, records: Sequence[Generations]) -> None:
        for record in records:
            lines = [{"input": i, "output": o, "score": score, "step": record.step} for i, o, score in record.samples]
            self._append_lines(os.path.join(self.settings["validation_dir"], f"{record.step}.jsonl"), lines)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        # Rows as the pipeline carries them (JSON lines rendered by the shipper) are appended as they are.
        for record in records:
            rows = record.trajectories
            lines = rows.lines if isinstance(rows, TrajectoryLines) and rows.step == record.step \
                else b"".join(trajectory_line(t, record.step) for t in rows)
            self._put(os.path.join(self.settings["rollout_dir"], f"{record.step}.jsonl"), lines)

    def write_traces(self, records: Sequence[Trace]) -> None:
        by_step: dict[int, list[bytes]] = {}
        for record in records:
            by_step.setdefault(record.step, []).append(trace_line(record))
        for step, lines in by_step.items():
            self._put(self._traces_file(step), b"".join(lines))

    def _traces_file(self, step: int) -> str:
        folder = self.settings.get("traces_dir") or f"{os.path.splitext(self.settings['path'])[0]}_traces"  # older spools
        return os.path.join(folder, f"{step}.jsonl")

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        lines = [{"step": r.step, "name": r.name, **_histogram_line(r)} for r in records]
        self._append_lines(os.path.join(self.settings["media_dir"], "histograms.jsonl"), lines)

    def write_text(self, records: Sequence[Text]) -> None:
        for record in records:
            self._put(self._media("text", record.name, f"{record.step}.txt"), record.text.encode("utf-8"), "wb")

    def write_image(self, records: Sequence[Image]) -> None:
        for record in records:
            self._put(self._media("images", record.name, f"{record.step}.png"), record.png, "wb")

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        for record in records:
            folder = os.path.join(self.settings["media_dir"], "artifacts", safe_name(record.type), safe_name(record.name),
                                  f"step_{record.step}")
            os.makedirs(folder, exist_ok=True)
            copy = os.path.join(folder, os.path.basename(os.path.normpath(record.path)))
            if os.path.isdir(record.path):  # a checkpoint folder, a multi-file artifact: its files, under its name
                shutil.copytree(record.path, copy, dirs_exist_ok=True)
            else:
                shutil.copy2(record.path, copy)

    def _append_lines(self, path: str, lines: list[dict[str, Any]]) -> None:
        self._put(path, b"".join(map(_line, lines)))

    def _put(self, path: str, data: bytes | memoryview, mode: str = "ab") -> None:
        """``data`` appended to the file at ``path`` (``mode="wb"``: the file's whole content), its folder made."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, mode) as handle:
            handle.write(data)

    def _media(self, kind: str, name: str, file: str) -> str:
        return os.path.join(self.settings["media_dir"], kind, safe_name(name), file)

    # -- exactly once: the files a batch appends to are cut back to where they stood --------
    def mark(self, records: Sequence[Record]) -> dict[str, Any]:
        paths = {self.settings["path"], os.path.join(self._own_dir(), METRICS_FILE)}
        for record in records:
            if isinstance(record, Generations):
                paths.add(os.path.join(self.settings["validation_dir"], f"{record.step}.jsonl"))
            elif isinstance(record, Trajectories):
                paths.add(os.path.join(self.settings["rollout_dir"], f"{record.step}.jsonl"))
            elif isinstance(record, Trace):
                paths.add(self._traces_file(record.step))
            elif isinstance(record, Histogram):
                paths.add(os.path.join(self.settings["media_dir"], "histograms.jsonl"))
        # text, images and artifacts are written whole under their step's name: writing them again is harmless
        return {"sizes": {path: _size(path) for path in sorted(paths)}}

    def rollback(self, mark: Mapping[str, Any]) -> None:
        for path, size in dict(mark.get("sizes") or {}).items():
            now = _size(path)
            if size < 0 and now >= 0:
                os.remove(path)
            elif 0 <= size < now:
                os.truncate(path, size)

    def close(self, exit_code: int) -> None:
        for handle in (getattr(self, "_handle", None), getattr(self, "_side", None)):
            if handle is not None and not handle.closed:
                handle.close()

    def _own_dir(self) -> str:
        return self.settings.get("tracklane_dir") or tracklane_dir(self.settings["path"])  # older spools lack it

    def where(self) -> str:
        return f"file: {self.settings['path']}"


def tracklane_dir(path: str) -> str:
    """The folder beside a file tracker's ``.jsonl`` that holds what tracklane adds (docstring)."""
    return f"{os.path.splitext(os.path.abspath(path))[0]}_tracklane"


RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
OWN_PREFIX = "tracklane/"


def _tracklanes(values: Mapping[str, Any]) -> bool:
    """A record of tracklane's own figures (its health keys), not the trainer's."""
    return next(iter(values), "").startswith(OWN_PREFIX) and all(key.startswith(OWN_PREFIX) for key in values)


def _verl_line(record: Metrics) -> bytes:
    """``orjson.dumps({"step": step, "data": data}, option=OPT_SERIALIZE_NUMPY) + b"\\n"``, verl's line."""
    if record.verl_data is not None:
        return b'{"step":%d,"data":%b}\n' % (record.step, record.verl_data)
    if type(record.values) is PackedValues:  # in a lane: straight from the wire's numbers, no dict
        return record.values.verl_line(record.step)
    return orjson.dumps({"step": record.step, "data": record.values}, option=_OPTIONS)


def trace_line(record: Trace) -> bytes:
    """A trace as one JSON line, its metadata nested (parsed from the JSON text the record carries: a line stays
    strict JSON whatever that text holds)."""
    return orjson.dumps({"step": record.step, "name": record.name, "key": record.key, "start_ns": record.start_ns,
                         "end_ns": record.end_ns, "status": record.status, "attributes": record.attributes,
                         "messages": record.messages, "metadata": record.metadata_object()}, option=_OPTIONS)



def _line(data: Any) -> bytes:
    """One JSON line as verl's FileLogger writes it: orjson (compact, NaN and +-Inf as null, numpy values as numbers)."""
    return orjson.dumps(data, option=_OPTIONS)


_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def _size(path: str) -> int:
    """Bytes in ``path``, -1 if it does not exist."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return -1


def _histogram_line(record: Histogram) -> dict[str, Any]:
    figures = record.summary()
    return {"count": figures.count, "nonfinite": figures.nonfinite, "min": figures.min, "max": figures.max,
            "mean": figures.mean, "std": figures.std, "bin_edges": figures.bin_edges, "counts": figures.counts}


def _ends_a_line(path: str) -> bool:
    """Whether the file is empty or its last byte ends a line."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return True
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
