"""The file logger's JSON lines, ``{"step": N, "data": {...}}``: verl's ``FileLogger`` (0.9.1) and tracklane's.

verl writes them with orjson, which writes NaN and +-Inf as ``null``: a null value is read as NaN (the two cannot
be told apart). tracklane's file sink writes verl's lines and puts what it adds in ``<base>_tracklane/``:
``run.json`` (project, experiment, run id and config: the run's identity here) and ``metrics.jsonl`` (its health
figures and the lines on another axis, with ``"axis"``), both read here. Files tracklane wrote before that layout
have a first header line in the ``.jsonl`` (``"step": null`` with the identity) and the axis lines in it: read the
same. Without either, the project and experiment are the folder's and the file's names (verl's
``<root>/<project>/<experiment>.jsonl``). Nested dicts are flattened with "/"; strings and other non-numbers are
skipped, counted; a bool is read as 0 or 1. A line that is no JSON object is skipped, counted.

The file keeps no time: every record gets its file's modification time (the latest the source can vouch for).

Rich records, where tracklane's file sink put them beside the file (``<base>`` is the path without ``.jsonl``):

    <base>_generations/<step>.jsonl   {"input", "output", "score", "step"} per sample  -> Generations (verl's
                                      validation dump; the key is not kept: "val/generations")
    <base>_rollouts/<step>.jsonl      ``Trajectory.as_dict()`` + "step" per trajectory -> Trajectories
    <base>_traces/<step>.jsonl        one rollout trace per line (file sink's ``trace_line``) -> Trace
    <base>_media/histograms.jsonl     bins and summary per line   -> Histogram (the non-finite count as NaNs)
    <base>_media/text/<name>/<step>.txt, images/<name>/<step>.png   -> Text, Image (names as made file-safe)
    <base>_media/artifacts/<type>/<name>/step_<step>/<file>         -> Artifact at that step (a folder's files
                                      each an Artifact; ``<type>/<name>/<file>``, written before versions: step 0)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from itertools import chain
from typing import Any

import orjson

from tracklane.core.errors import ConfigError
from tracklane.core.records import Artifact, Generations, Image, Metrics, Record, RunSpec, Text, Trace, Trajectories
from tracklane.host.source import Source, SourceRun, option
from tracklane.workers.sinks.file import METRICS_FILE, RUN_FILE, tracklane_dir
from tracklane.workers.sinks.media import safe_name
from tracklane.workers.sources.shaping import artifact_step, binned_histogram, in_step_order, number, png, score, trajectory

GENERATIONS_KEY = "val/generations"  # the records' default keys: the file sink does not keep the key
TRAJECTORIES_KEY = "rollout/trajectories"
_STORED_AS = {kind: kind for kind in ("generations", "trajectories", "text", "histogram", "image", "artifact", "trace")}


class FileSource(Source):
    name = "file"

    def __init__(self, path: str, validation_dir: str | None = None, rollout_dir: str | None = None,
                 media_dir: str | None = None) -> None:
        super().__init__()
        self.path = os.path.abspath(path)
        base = os.path.splitext(self.path)[0]
        self.validation_dir = validation_dir or f"{base}_generations"
        self.rollout_dir = rollout_dir or f"{base}_rollouts"
        self.media_dir = media_dir or f"{base}_media"
        self.traces_dir = f"{base}_traces"
        self.own_dir = tracklane_dir(self.path)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> FileSource:
        path = option(options, "path", cls.name)
        if not os.path.isfile(path):
            raise ConfigError(f"no file at {path}")
        return cls(path)

    @classmethod
    def of_target(cls, settings: Mapping[str, Any], run: RunSpec) -> FileSource:
        return cls(settings["path"], settings.get("validation_dir"), settings.get("rollout_dir"), settings.get("media_dir"))

    def _lines(self, path: str | None = None) -> Iterator[dict[str, Any]]:
        with open(path or self.path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)  # reads NaN and Infinity tokens
                except ValueError:
                    data = None
                if isinstance(data, dict):
                    yield data
                else:
                    self.skip("lines that are no JSON object")

    def run(self) -> SourceRun:
        where = f"file {self.path}"
        try:
            with open(os.path.join(self.own_dir, RUN_FILE), encoding="utf-8") as handle:
                header = json.load(handle)
        except (OSError, ValueError):  # verl's file, or tracklane's from before run.json: its first line, if any
            header = next(self._lines(), {})
        if not isinstance(header, dict):
            header = {}
        if header.get("step") is None and "project" in header:
            return SourceRun(project=str(header["project"]), experiment=str(header.get("experiment") or ""),
                             params=dict(header.get("config") or {}), run_id=str(header.get("run_id") or ""), where=where)
        folder = os.path.basename(os.path.dirname(self.path))
        return SourceRun(project=folder or "file", experiment=os.path.splitext(os.path.basename(self.path))[0], where=where)

    def records(self) -> Iterator[Record]:
        when = os.path.getmtime(self.path)
        records: list[Record] = []
        own = os.path.join(self.own_dir, METRICS_FILE)
        lines = chain(self._lines(), self._lines(own) if os.path.isfile(own) else ())
        for line in lines:
            step, data = line.get("step"), line.get("data")
            if step is None and not data:  # the header
                continue
            if type(step) is not int or not isinstance(data, dict):
                self.skip("lines without an integer step and a data object")
                continue
            values = self._values(data)
            if values:
                records.append(Metrics(step=step, values=values, time=when, axis=line.get("axis")))
        records += self._rich()
        return iter(in_step_order(records))

    def _values(self, data: dict[str, Any], prefix: str = "") -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for key, value in data.items():
            if isinstance(value, dict):
                out.update(self._values(value, f"{prefix}{key}/"))
                continue
            converted = number(value)
            if converted is None:
                self.skip(f"{type(value).__name__} values")
            else:
                out[f"{prefix}{key}"] = converted
        return out

    # -- what the file sink put beside the file --------------------------------------------------
    def _rich(self) -> list[Record]:
        records: list[Record] = []
        for step, path, lines in _step_files(self.validation_dir):
            samples = [[str(x.get("input", "")), str(x.get("output", "")), score(x.get("score"))] for x in lines]
            records.append(Generations(step=step, samples=samples, time=os.path.getmtime(path), key=GENERATIONS_KEY))
        for step, path, lines in _step_files(self.rollout_dir):
            records.append(Trajectories(step=step, trajectories=[trajectory(x) for x in lines],
                                        time=os.path.getmtime(path), key=TRAJECTORIES_KEY))
        for step, path, lines in _step_files(self.traces_dir):
            records += [self._trace(step, line, os.path.getmtime(path)) for line in lines]
        records += self._histograms()
        records += self._named_files("text", lambda step, name, path, data: Text(
            step=step, name=name, text=data.decode("utf-8"), time=os.path.getmtime(path)))
        records += self._named_files("images", lambda step, name, path, data: Image(
            step=step, name=name, png=png(data), time=os.path.getmtime(path)))
        records += self._artifacts()
        return records

    @staticmethod
    def _trace(step: int, line: dict[str, Any], when: float) -> Trace:
        return Trace(step=step, time=when, name=str(line["name"]), key=str(line["key"]), start_ns=int(line["start_ns"]),
                     end_ns=int(line["end_ns"]), status=str(line["status"]), attributes=dict(line["attributes"]),
                     messages=list(line["messages"]), metadata=orjson.dumps(line["metadata"]).decode())

    def _histograms(self) -> list[Record]:
        path = os.path.join(self.media_dir, "histograms.jsonl")
        if not os.path.exists(path):
            return []
        when = os.path.getmtime(path)
        with open(path, encoding="utf-8") as handle:
            lines = [json.loads(line) for line in handle if line.strip()]
        return [binned_histogram(int(x["step"]), when, str(x["name"]), x["bin_edges"], x["counts"], total=x["count"],
                                 minimum=x.get("min"), maximum=x.get("max"), mean=x.get("mean"), std=x.get("std"),
                                 nonfinite=(int(x.get("nonfinite") or 0), 0, 0)) for x in lines]

    def _named_files(self, kind: str, build: Any) -> list[Record]:
        """``<media>/<kind>/<name>/<step>.<ext>`` files, each built into a record."""
        root = os.path.join(self.media_dir, kind)
        out: list[Record] = []
        for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            for file_name in sorted(os.listdir(os.path.join(root, name))):
                stem = os.path.splitext(file_name)[0]
                if not stem.lstrip("-").isdigit():
                    self.skip(f"{kind} files not named <step>")
                    continue
                path = os.path.join(root, name, file_name)
                with open(path, "rb") as handle:
                    out.append(build(int(stem), name, path, handle.read()))
        return out

    def _artifacts(self) -> list[Record]:
        root = os.path.join(self.media_dir, "artifacts")
        out: list[Record] = []
        for folder, _dirs, files in sorted(os.walk(root)):
            parts = os.path.relpath(folder, root).split(os.sep)
            for file_name in sorted(files):
                if len(parts) < 2:
                    self.skip("artifact files outside <type>/<name>/")
                    continue
                path = os.path.join(folder, file_name)
                out.append(Artifact(step=artifact_step(parts[2] if len(parts) >= 3 else None), path=path,
                                    name=parts[1], type=parts[0], time=os.path.getmtime(path)))
        return out

    # -- how the file sink stores what it is handed ----------------------------------------------
    @classmethod
    def stored_as(cls, kind: str) -> str | None:
        return _STORED_AS.get(kind)

    @classmethod
    def stored_name(cls, kind: str, name: str) -> str:
        fixed = {"generations": GENERATIONS_KEY, "trajectories": TRAJECTORIES_KEY}.get(kind)
        return fixed or (safe_name(name) if kind in ("text", "image", "artifact") else name)


def _step_files(folder: str) -> Iterator[tuple[int, str, list[dict[str, Any]]]]:
    """(step, path, the JSON lines) of each ``<step>.jsonl`` in ``folder``."""
    if not os.path.isdir(folder):
        return
    for file_name in sorted(os.listdir(folder)):
        stem, extension = os.path.splitext(file_name)
        if extension != ".jsonl" or not stem.lstrip("-").isdigit():
            continue
        path = os.path.join(folder, file_name)
        with open(path, encoding="utf-8") as handle:
            yield int(stem), path, [json.loads(line) for line in handle if line.strip()]
