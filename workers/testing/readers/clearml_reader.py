"""Read back what ClearML (2.1.12) stored for a task in offline mode: its session folder (or the zip of it).

``Task.import_offline_session`` is ClearML's reader of this format, but it cannot run without a server:
it creates the task on one first (offline: ``UsageError: Creating task in offline mode``; with no server
configured: ``MissingConfigError``). So this module reads the folder the way that function does, with
ClearML's own ``text_to_config_dict`` for configuration objects. Not its typed ``services.tasks.Task``
(what ClearML's offline reload builds): that module is a proxy that picks its API version from the server,
so a process that is not switched offline opens a session on first use (seen: with an access key in the
environment it tried to log in to https://api.clear.ml). The format, as written by clearml 2.1.12:

    <cache>/offline/<task id>/   (``config.get_offline_dir``; <cache> is CLEARML_CACHE_DIR)
        task.json      the task object: ``Task.data.to_dict()`` plus project_name, offline_folder,
                       offline_output_models, rewritten whole on every change
                       (backend_interface/task/task.py ``_save_data_to_offline_dir``)
        metrics.jsonl  one JSON list of event dicts per reporter write, appended
                       (backend_interface/metrics/interface.py ``Metrics._do_write_events``;
                       read back by ``Metrics.report_offline_session``): type "training_stats_scalar"
                       (metric, variant, iter, value, timestamp in ms), "plot" (plot_str: plotly JSON;
                       tables and histograms), "training_debug_image" (key: the file under data/, url)
        log.jsonl      console events (backend_interface/task/log.py ``TaskHandler``)
        data/          debug sample files (at their event's key) and artifacts (at their uri, which
                       starts with <offline_folder>/data/)
    <cache>/offline/<task id>.zip   the folder zipped at ``Task.close`` (task.py ``__shutdown``)

Offline, ClearML stores no status change (``InterfaceBase._send`` returns at once); ``status`` is
task.json's, usually absent. The ClearML sink tags how the run ended (``tracklane.exit_code=<n>``):
``exit_code``. Scalar keys are rebuilt from title and series as the sink split them: ``title/series``,
or ``title`` when both are equal (so a stored "x/x" reads back as "x").
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clearml.utilities.config import text_to_config_dict

from tracklane.workers.testing.readers import ReadBack

EXIT_TAG = "tracklane.exit_code="
RUN_TAG = "tracklane.run_id:"
CONFIG_NAME = "Hyperparameters"
_Source = Callable[[str], bytes | None]
"""A session's files by their name in it: ``data/<key>``, ``task.json`` ...; None when it has none of the name."""


@dataclass
class ClearmlEvent:
    """What every event of metrics.jsonl has: where it is (title, series, iteration) and when it was reported."""

    title: str
    series: str
    iteration: int
    timestamp: int
    """Milliseconds since the epoch, when it was reported."""


@dataclass
class ClearmlScalar(ClearmlEvent):
    value: float

    @property
    def key(self) -> str:
        return scalar_key(self.title, self.series)


@dataclass
class ClearmlPlot(ClearmlEvent):
    """A "plot" event: a table or a histogram as plotly JSON."""

    plot: dict[str, Any]

    def table(self) -> tuple[list[Any], list[list[Any]]]:
        """(headers, rows) of a table plot."""
        (trace,) = [d for d in self.plot["data"] if d.get("type") == "table"]
        columns = trace["cells"]["values"]
        return list(trace["header"]["values"]), [list(row) for row in zip(*columns, strict=True)]

    def bars(self) -> tuple[list[Any], list[Any]]:
        """(x, y) of the first bar trace of a histogram plot."""
        (trace, *_) = [d for d in self.plot["data"] if d.get("type") == "bar"]
        return list(trace["x"]), list(trace["y"])


@dataclass
class ClearmlSample(ClearmlEvent):
    """A debug sample (image, text or other media) and its file's bytes."""

    key: str
    """The file's path under the session's data/ folder."""
    content: bytes | None
    """None when the file is not in the session."""


@dataclass
class ClearmlArtifact:
    name: str
    type: str
    """ClearML's artifact type: "custom" for a file, "archive" for a zipped directory."""
    metadata: dict[str, str]
    """ClearML keeps metadata values as strings."""
    file_name: str
    content: bytes | None

    def files(self) -> dict[str, bytes]:
        """{name: bytes}: the one file, or the members of an archive."""
        if self.content is None:
            return {}
        if self.type != "archive":
            return {self.file_name: self.content}
        with zipfile.ZipFile(io.BytesIO(self.content)) as archive:
            return {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}


@dataclass
class ClearmlRun(ReadBack):
    """One offline ClearML task: ``ReadBack`` (points, params, status) and everything else it holds."""

    task_id: str = ""
    name: str = ""
    project: str = ""
    tags: list[str] = field(default_factory=list)
    exit_code: int | None = None
    configuration: dict[str, Any] = field(default_factory=dict)
    """Configuration objects by name: a "dictionary" parsed by ClearML, other types as their text."""
    configuration_types: dict[str, str] = field(default_factory=dict)
    scalar_events: list[ClearmlScalar] = field(default_factory=list)
    """Every scalar event with its title, series and timestamp; ``points`` holds the same as (step, key, value)."""
    plots: list[ClearmlPlot] = field(default_factory=list)
    samples: list[ClearmlSample] = field(default_factory=list)
    artifacts: dict[str, ClearmlArtifact] = field(default_factory=dict)
    console: list[str] = field(default_factory=list)
    folder: Path | None = None

    def tables(self, title: str, series: str) -> dict[int, tuple[list[Any], list[list[Any]]]]:
        """iteration -> (headers, rows) of the table plots of (title, series); the last one of an iteration wins."""
        return {p.iteration: p.table() for p in self.plots if (p.title, p.series) == (title, series)}

    def bars(self, title: str, series: str) -> dict[int, tuple[list[Any], list[Any]]]:
        return {p.iteration: p.bars() for p in self.plots if (p.title, p.series) == (title, series)}

    def samples_of(self, title: str, series: str) -> dict[int, list[ClearmlSample]]:
        """iteration -> the debug samples of (title, series), in storage order."""
        out: dict[int, list[ClearmlSample]] = {}
        for sample in self.samples:
            if (sample.title, sample.series) == (title, series):
                out.setdefault(sample.iteration, []).append(sample)
        return out


def scalar_key(title: str, series: str) -> str:
    """The metric key the ClearML sink split into ``title`` and ``series``."""
    return title if title == series else f"{title}/{series}"


def clearml_sessions(cache_dir: str | Path) -> list[Path]:
    """Every offline session folder under ``cache_dir`` (ClearML's CLEARML_CACHE_DIR), oldest first."""
    folders = [path.parent for path in Path(cache_dir, "offline").glob("*/task.json")]
    return sorted(folders, key=lambda folder: ((folder / "task.json").stat().st_mtime, folder.name))


def read_clearml_run(cache_dir: str | Path, *, task_id: str | None = None, run_id: str | None = None,
                     experiment: str | None = None) -> ClearmlRun:
    """The one offline task under ``cache_dir`` with this id / tracklane run id / task name (or the only one).
    Raises ``LookupError`` when none or several match."""
    found = []
    for folder in clearml_sessions(cache_dir):
        data = _task_dict(_session(folder), folder)
        tags = data.get("tags") or []
        if ((task_id is None or data.get("id") == task_id) and (run_id is None or RUN_TAG + run_id in tags)
                and (experiment is None or data.get("name") == experiment)):
            found.append(folder)
    if len(found) != 1:
        raise LookupError(f"expected one clearml offline task under {cache_dir} (task_id={task_id!r}, "
                          f"run_id={run_id!r}, experiment={experiment!r}), found {[f.name for f in found]}")
    return read_clearml_session(found[0])


def read_clearml_session(path: str | Path) -> ClearmlRun:
    """One offline session: its folder, or the zip ClearML wrote beside it at close."""
    path = Path(path)
    source = _session(path)
    data = _task_dict(source, path)
    out = ClearmlRun(task_id=str(data.get("id", "")), name=str(data.get("name", "")),
                     project=str(data.get("project_name", "")), status=data.get("status"),
                     tags=list(data.get("tags") or []), folder=path if path.is_dir() else None)
    out.exit_code = _exit_code(out.tags)
    _read_configuration(data.get("configuration") or {}, out)
    _read_events(source, out)
    _read_artifacts(source, (data.get("execution") or {}).get("artifacts") or [], str(data.get("offline_folder", "")), out)
    out.console = [str(event.get("msg", "")) for event in _jsonl_events(source("log.jsonl"))]
    return out


def _exit_code(tags: list[str]) -> int | None:
    codes = [tag[len(EXIT_TAG):] for tag in tags if tag.startswith(EXIT_TAG)]
    return int(codes[-1]) if codes else None


def _read_configuration(configuration: dict[str, Any], out: ClearmlRun) -> None:
    """Configuration objects ({name: {name, type, value}}); ClearML parses a "dictionary" from its HOCON text."""
    for name, item in configuration.items():
        kind, text = str(item.get("type", "")), str(item.get("value", ""))
        out.configuration_types[name] = kind
        out.configuration[name] = _plain(text_to_config_dict(text)) if kind == "dictionary" else text
    params = out.configuration.get(CONFIG_NAME)
    out.params = params if isinstance(params, dict) else {}


def _read_events(source: _Source, out: ClearmlRun) -> None:
    for event in _jsonl_events(source("metrics.jsonl")):
        kind = event.get("type")
        common = (str(event["metric"]), str(event["variant"]), int(event.get("iter", 0)), int(event.get("timestamp", 0)))
        if kind == "training_stats_scalar":
            out.scalar_events.append(ClearmlScalar(*common, float(event["value"])))
            out.points.append((common[2], scalar_key(common[0], common[1]), float(event["value"])))
        elif kind == "plot":
            out.plots.append(ClearmlPlot(*common, json.loads(event["plot_str"])))
        elif kind == "training_debug_image":
            key = str(event.get("key", ""))
            out.samples.append(ClearmlSample(*common, key, source(f"data/{key}")))


def _read_artifacts(source: _Source, artifacts: list[dict[str, Any]], offline_folder: str, out: ClearmlRun) -> None:
    """Artifact files at their uri below <offline_folder>/data/ (as ``import_offline_session`` finds them)."""
    prefix = offline_folder.rstrip("/") + "/data/"
    for artifact in artifacts:
        uri, key = str(artifact.get("uri") or ""), str(artifact.get("key", ""))
        local = uri[len(prefix):] if uri.startswith(prefix) else ""
        content = source(f"data/{local}") if local else None
        metadata = {str(k): str(v) for k, v in (artifact.get("display_data") or [])}
        out.artifacts[key] = ClearmlArtifact(key, str(artifact.get("type", "")), metadata, uri.rsplit("/", 1)[-1], content)


def _task_dict(source: _Source, path: Path) -> dict[str, Any]:
    raw = source("task.json")
    if raw is None:
        raise LookupError(f"{path} holds no task.json: not a ClearML offline session")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: task.json is not an object")
    return data


def _jsonl_events(raw: bytes | None) -> Iterator[dict[str, Any]]:
    """The events of a ClearML .jsonl file; a last line cut short by a killed process is left out."""
    lines = (raw or b"").decode("utf-8").split("\n")
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            batch = json.loads(line)
        except ValueError:
            if index == len(lines) - 1:  # no newline after it: the write never finished
                return
            raise
        yield from batch


def _plain(value: Any) -> Any:
    """ClearML's parsed config (OrderedDicts) as plain dicts and lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _session(path: Path) -> _Source:
    """The files of a session folder, or of the zip ClearML wrote beside it at close."""
    if path.is_file():
        with zipfile.ZipFile(path) as archive:
            return {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}.get
    return lambda name: file.read_bytes() if (file := path.joinpath(*name.split("/"))).is_file() else None
