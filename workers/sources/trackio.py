"""trackio: one run of a project in trackio's local store (``<TRACKIO_DIR>/<project>.db``), trackio 0.43.

Read through trackio's own API only: ``trackio.Api().runs(project)`` for the runs and their configs, and the
``SQLiteStorage`` calls its dashboard makes (``get_logs``: every row with its step and ISO timestamp, top-level
"NaN"/"Infinity" turned back into floats; ``get_traces``; ``get_system_logs``; ``get_run_artifacts`` and
``get_artifact_manifest``). trackio reads ``TRACKIO_DIR`` once at import, so the store folder is pointed at with
``tracklane.workers.sinks.trackio.point_trackio_at`` before every read. What each value becomes:

    a number                                   -> Metrics at the row's step and time
    {"_type": "trackio.histogram"}             -> Histogram (bins and counts: mean and std unknown, NaN)
    {"_type": "trackio.markdown"}              -> Text
    {"_type": "trackio.image"}                 -> Image (the file trackio copied into media/)
    a list of traces (``trackio.Trace``)       -> Generations when their metadata says "validation_generations"
                                                  (user and assistant message, score), else Trajectories
                                                  (messages, tool spans as tool calls; token ids are not kept)
    system rows holding ``system/elapsed_s``   -> Metrics on that axis (what the tracklane sink writes there);
                                                  trackio's own system rows: counted, not carried
    an artifact version the run logged         -> Artifact (files copied out of trackio's content store)
    other typed values (tables, video, ...)     -> counted, not carried

Without ``--run`` the project must hold exactly one run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tracklane.core.errors import ConfigError
from tracklane.core.records import Artifact, Generations, Image, Metrics, Record, RunSpec, Text, Trajectories, Trajectory
from tracklane.core.values import as_number
from tracklane.host.sink import import_sdk
from tracklane.host.source import Source, SourceRun, option
from tracklane.workers.sinks.trackio import RESERVED_KEYS, TRACKIO_RESERVED_CONFIG, artifact_name, point_trackio_at, trackio_dir
from tracklane.workers.sources.shaping import ROLLOUT_INDICES, binned_histogram, in_step_order, png, score

SYSTEM_AXIS = "system/elapsed_s"  # pipeline/capture/convert.py: the system metrics' axis
_STORED_AS = {kind: kind for kind in ("generations", "trajectories", "text", "histogram", "image", "artifact")}


class TrackioSource(Source):
    name = "trackio"
    sdk_module = "trackio"
    extra = "trackio"

    def __init__(self, folder: str, project: str, run_name: str | None = None, run_id: str | None = None) -> None:
        super().__init__()
        self.folder = os.path.abspath(folder)
        self.project = project
        self.run_name = run_name
        self.run_id = run_id
        self._found: Any = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> TrackioSource:
        project = options.get("source_project") or option(options, "project", cls.name)
        return cls(trackio_dir(env), str(project), options.get("run") or None)

    @classmethod
    def of_target(cls, settings: Mapping[str, Any], run: RunSpec) -> TrackioSource:
        return cls(settings["dir"], run.project, run.experiment, run.run_id)

    def _storage(self) -> Any:
        import_sdk(type(self))
        point_trackio_at(Path(self.folder))
        return import_sdk(type(self), "trackio.sqlite_storage").SQLiteStorage

    def _run(self) -> Any:
        if self._found is None:
            self._storage()
            runs = matching_runs(import_sdk(type(self)), self.project, self.run_name, self.run_id)
            if len(runs) != 1:
                raise ConfigError(f"expected one trackio run {self.run_name or ''!r} in project {self.project!r} of "
                                  f"{self.folder}, found {[run.name for run in runs]} (pass --run NAME)")
            self._found = runs[0]
        return self._found

    def run(self) -> SourceRun:
        run = self._run()
        params = {k: v for k, v in dict(run.config or {}).items() if k not in TRACKIO_RESERVED_CONFIG}
        return SourceRun(project=self.project, experiment=run.name, params=params, run_id=str(run.id),
                         where=f"trackio run {run.name!r} of project {self.project!r} in {self.folder}")

    def records(self) -> Iterator[Record]:
        run, storage = self._run(), self._storage()
        records: list[Record] = []
        media = Path(import_sdk(type(self), "trackio.utils").MEDIA_DIR)
        for row in storage.get_logs(self.project, run_id=run.id):
            records += self._row(row, media)
        for trace_group in _grouped(storage.get_traces(self.project, run_id=run.id, sort="step_asc")):
            records.append(_traces(*trace_group))
        for row in storage.get_system_logs(self.project, run_id=run.id):
            self._system(row, records)
        records += self._artifacts(storage, run)
        return iter(in_step_order(records))

    def _row(self, row: dict[str, Any], media: Path) -> list[Record]:
        step, when = int(row.pop("step")), seconds_of(row.pop("timestamp"))
        values: dict[str, float | int] = {}
        rich: list[Record] = []
        for key, value in row.items():
            number = as_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if number is not None:
                values[key] = number
                continue
            kind = value.get("_type") if isinstance(value, dict) else None
            if kind == "trackio.histogram":
                rich.append(binned_histogram(step, when, key, value["bins"], value["values"]))
            elif kind == "trackio.markdown":
                rich.append(Text(step=step, name=key, text=str(value["_value"]), time=when))
            elif kind == "trackio.image":
                rich.append(Image(step=step, name=key, png=png((media / value["file_path"]).read_bytes()), time=when))
            elif not _is_traces(value):  # traces are read with get_traces
                self.skip(f"{kind or type(value).__name__} values")
        return ([Metrics(step=step, values=values, time=when)] if values else []) + rich

    def _system(self, row: dict[str, Any], records: list[Record]) -> None:
        when = seconds_of(row.pop("timestamp"))
        elapsed = row.pop(SYSTEM_AXIS, None)
        if not isinstance(elapsed, (int, float)):
            self.skip("trackio system metrics rows")
            return
        values = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        records.append(Metrics(step=int(elapsed), values=values, time=when, axis=SYSTEM_AXIS))

    def _artifacts(self, storage: Any, run: Any) -> list[Record]:
        cas = import_sdk(type(self), "trackio.cas")
        out: list[Record] = []
        for link in storage.get_run_artifacts(self.project, run.name, run.id)["output"]:
            record = storage.get_artifact_manifest(self.project, link["name"], f"v{link['version']}")
            folder = os.path.join(self.scratch(), f"{record['name']}-v{record['version']}")
            for entry in record["manifest"]:
                target = os.path.join(folder, entry["path"])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(cas.blob_path(self.project, entry["digest"]), target)
            files = [e["path"] for e in record["manifest"]]
            path = os.path.join(folder, files[0]) if len(files) == 1 else folder
            metadata = record.get("metadata") or {}
            step = int(metadata["step"]) if isinstance(metadata.get("step"), int) else 0
            out.append(Artifact(step=step, path=path, name=record["name"], type=record["type"], time=_created(record)))
        return out

    # -- how trackio stores what the trackio sink hands it ----------------------------------------
    @classmethod
    def stored_key(cls, key: str) -> str:
        return "__" + key if key in RESERVED_KEYS or key.startswith("__") else key

    @classmethod
    def stored_as(cls, kind: str) -> str | None:
        return _STORED_AS.get(kind)

    @classmethod
    def stored_name(cls, kind: str, name: str) -> str:
        return artifact_name(name) if kind == "artifact" else cls.stored_key(name)


def matching_runs(trackio: Any, project: str, name: str | None = None, run_id: str | None = None) -> list[Any]:
    """The runs of ``project`` (none where it does not exist) with this name and/or id, oldest first."""
    exists = trackio.SQLiteStorage.get_project_db_path(project).exists()
    return [run for run in (trackio.Api().runs(project) if exists else [])
            if (name is None or run.name == name) and (run_id is None or run.id == run_id)]


def seconds_of(timestamp: str) -> float:
    """An ISO timestamp as trackio stores it, in seconds since the epoch."""
    return datetime.fromisoformat(timestamp).timestamp()


def _created(record: Mapping[str, Any]) -> float:
    created = record.get("created_at")
    return seconds_of(created) if isinstance(created, str) else 0.0


def _is_traces(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and "messages" in v for v in value)


def _grouped(traces: list[dict[str, Any]]) -> Iterator[tuple[int, str, list[dict[str, Any]]]]:
    """(step, key, traces) per key and step, in their list order."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for trace in sorted(traces, key=lambda t: (t["step"], t["timestamp"], t.get("index") or 0)):
        groups.setdefault((int(trace["step"]), str(trace["key"])), []).append(trace)
    for (step, key), listed in groups.items():
        yield step, key, listed


def _traces(step: int, key: str, traces: list[dict[str, Any]]) -> Record:
    when = seconds_of(traces[0]["timestamp"])
    metadata = [t.get("metadata") or {} for t in traces]
    if all(m.get("source") == "validation_generations" for m in metadata):
        samples = [[_content(t, "user"), _content(t, "assistant"), score(m.get("score"))]
                   for t, m in zip(traces, metadata, strict=True)]
        return Generations(step=step, samples=samples, time=when, key=key)
    trajectories = [_trajectory(t, m) for t, m in zip(traces, metadata, strict=True)]
    return Trajectories(step=step, trajectories=trajectories, time=when, key=key)


def _content(trace: dict[str, Any], role: str) -> str:
    return next((str(m.get("content", "")) for m in trace.get("messages") or [] if m.get("role") == role), "")


def _trajectory(trace: dict[str, Any], metadata: dict[str, Any]) -> Trajectory:
    meta = dict(metadata.get("meta") or {})
    meta.update({name: metadata[name] for name in ROLLOUT_INDICES if metadata.get(name) is not None})
    calls = [{"name": str(span.get("name") or ""), "arguments": str(span.get("input") or ""),
              "result": str(span.get("output") or ""),
              "latency_s": span["duration_ms"] / 1000.0 if isinstance(span.get("duration_ms"), (int, float)) else None}
             for span in trace.get("spans") or [] if span.get("kind") == "tool"]
    rewards = {str(k): score(v) for k, v in (metadata.get("rewards") or {}).items()}
    messages = [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in trace.get("messages") or []]
    return Trajectory(messages=messages, tool_calls=calls, rewards=rewards, meta=meta)
