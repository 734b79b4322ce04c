"""Read back a run from trackio's (0.43) local store through trackio's own reading API, no SQL of our own.

The store and the calls are ``tracklane.workers.sources.trackio``'s (``trackio.Api().runs`` and the ``SQLiteStorage``
functions trackio's dashboard calls; an artifact's files from ``trackio.cas.blob_path``). trackio reads
``TRACKIO_DIR`` once at import, so each function first points the imported trackio at the folder asked for
(``point_trackio_at``); a sink of this process moves it back to its own folder before its next write.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklane.workers.sinks.trackio import EXIT_ALERT_TITLE, TRACKIO_RESERVED_CONFIG, point_trackio_at
from tracklane.workers.sources.trackio import matching_runs, seconds_of
from tracklane.workers.testing.readers import ReadBack


@dataclass
class TrackioRunInfo:
    """One run of a project, as ``trackio.Api().runs`` lists it."""

    run_id: str
    name: str


@dataclass
class TrackioArtifact:
    """One artifact version a run produced."""

    name: str
    type: str
    version: int
    aliases: list[str]
    metadata: dict[str, Any]
    files: dict[str, Path]
    """Logical path inside the artifact -> its blob in trackio's store."""


@dataclass
class TrackioRun(ReadBack):
    """What a trackio run holds. ``points`` are the numeric values of its metric rows (step, key, value)."""

    run_id: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    """The stored config as is (``params`` is it without trackio's own ``_`` keys)."""
    times: list[float] = field(default_factory=list)
    """The timestamp (seconds since the epoch) of each of ``points``' rows, in the same order."""
    values: dict[str, dict[int, list[Any]]] = field(default_factory=dict)
    """key -> step -> the non-numeric values stored (histogram, markdown, image, table dicts, ...), one per row."""
    traces: dict[str, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)
    """key -> step -> traces ({messages, metadata, spans, index, id, timestamp}), in their list order."""
    system: list[tuple[float, str, float]] = field(default_factory=list)
    """System metrics: (timestamp, key, value)."""
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """Newest first, as trackio returns them: {timestamp, title, text, level, step}."""
    artifacts: list[TrackioArtifact] = field(default_factory=list)
    media_dir: Path = Path()

    def point_times(self) -> dict[tuple[int, str], float]:
        """(step, key) -> its row's timestamp; later rows win."""
        return {(step, key): when for (step, key, _), when in zip(self.points, self.times, strict=True)}

    def one(self, key: str) -> dict[int, Any]:
        """step -> the single non-numeric value stored for ``key`` there (raises if a step has several)."""
        out = {}
        for step, stored in self.values.get(key, {}).items():
            if len(stored) != 1:
                raise ValueError(f"{key!r} has {len(stored)} values at step {step}")
            out[step] = stored[0]
        return out

    def histograms(self, key: str) -> dict[int, tuple[list[float], list[int]]]:
        """step -> (bin edges, counts) of the trackio.Histogram stored for ``key``."""
        return {step: (value["bins"], value["values"]) for step, value in self._typed(key, "trackio.histogram").items()}

    def texts(self, key: str) -> dict[int, str]:
        return {step: value["_value"] for step, value in self._typed(key, "trackio.markdown").items()}

    def images(self, key: str) -> dict[int, Path]:
        """step -> the image file trackio stored for ``key``."""
        return {step: self.media_dir / value["file_path"] for step, value in self._typed(key, "trackio.image").items()}

    def _typed(self, key: str, kind: str) -> dict[int, dict[str, Any]]:
        out = self.one(key)
        wrong = {step: value for step, value in out.items() if not isinstance(value, dict) or value.get("_type") != kind}
        if wrong:
            raise ValueError(f"{key!r} holds no {kind} at steps {sorted(wrong)}")
        return out

    def exit_code(self) -> int | None:
        """The exit code of the newest "trainer exited" alert the trackio sink wrote at close (None: no close)."""
        for alert in self.alerts:
            if alert["title"] == EXIT_ALERT_TITLE:
                return int(str(alert["text"]).removeprefix("exit code "))
        return None


def list_trackio_runs(trackio_dir: str | Path, project: str) -> list[TrackioRunInfo]:
    """Every run of ``project`` in the store, oldest first (none when the project does not exist)."""
    return [TrackioRunInfo(run_id=run.id, name=run.name) for run in matching_runs(_trackio(trackio_dir), project)]


def read_trackio_run(trackio_dir: str | Path, project: str, *, run_id: str | None = None, name: str | None = None) -> TrackioRun:
    """The run with this id and/or name (or the only run) of ``project``; ``LookupError`` unless exactly one matches."""
    trackio = _trackio(trackio_dir)
    storage = trackio.SQLiteStorage
    runs = matching_runs(trackio, project, name, run_id)
    if len(runs) != 1:
        raise LookupError(f"expected one trackio run in project {project!r} of {trackio_dir} (run_id={run_id!r}, "
                          f"name={name!r}), found {[(r.name, r.id) for r in runs]}")
    (run,) = runs
    out = TrackioRun(run_id=run.id, name=run.name, config=dict(run.config or {}), alerts=run.alerts(),
                     media_dir=Path(trackio.utils.MEDIA_DIR))
    out.params = {key: value for key, value in out.config.items() if key not in TRACKIO_RESERVED_CONFIG}
    _read_rows(storage.get_logs(project, run_id=run.id), out)
    _read_traces(storage.get_traces(project, run_id=run.id, sort="step_asc"), out)
    for row in storage.get_system_logs(project, run_id=run.id):
        when = seconds_of(row.pop("timestamp"))
        out.system += [(when, key, value) for key, value in row.items()]
    out.artifacts = _read_artifacts(trackio, project, run)
    out.status = None if out.exit_code() is None else f"exit_code={out.exit_code()}"
    return out


def _trackio(trackio_dir: str | Path) -> Any:
    trackio = importlib.import_module("trackio")
    point_trackio_at(Path(trackio_dir).absolute())
    return trackio


def _read_rows(rows: list[dict[str, Any]], out: TrackioRun) -> None:
    for row in rows:
        step, when = row.pop("step"), seconds_of(row.pop("timestamp"))
        for key, value in row.items():
            if isinstance(value, (int, float)):
                out.points.append((step, key, value))
                out.times.append(when)
            else:
                out.values.setdefault(key, {}).setdefault(step, []).append(value)


def _read_traces(traces: list[dict[str, Any]], out: TrackioRun) -> None:
    for trace in sorted(traces, key=lambda t: (t["step"], t["timestamp"], t["index"] or 0)):
        out.traces.setdefault(trace["key"], {}).setdefault(trace["step"], []).append(trace)


def _read_artifacts(trackio: Any, project: str, run: Any) -> list[TrackioArtifact]:
    storage, cas = trackio.SQLiteStorage, importlib.import_module("trackio.cas")
    found = []
    for link in storage.get_run_artifacts(project, run.name, run.id)["output"]:
        record = storage.get_artifact_manifest(project, link["name"], f"v{link['version']}")
        files = {entry["path"]: Path(cas.blob_path(project, entry["digest"])) for entry in record["manifest"]}
        found.append(TrackioArtifact(name=record["name"], type=record["type"], version=record["version"],
                                     aliases=sorted(record["aliases"]), metadata=record["metadata"] or {}, files=files))
    return found

