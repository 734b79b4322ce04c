"""Read back what swanlab (0.10.3) stored under a log folder in offline or local mode.

Layout: ``<logdir>/run-<YYYYmmdd_HHMMSS>-<run id>/`` per ``swanlab.init``, holding
``run-<run id>.swanlab`` (a LevelDB-style log of protobuf ``Record`` messages: start,
columns, scalars, terminal lines, saves, finish) and ``files/config.yaml`` (the config
as ``{key: {value, sort, desc}}``).

Several runs may share one logdir. A run resumed offline (same id, later ``init``)
gets a second folder with the same id: such folders are segments of one run, read
in start order, as ``swanlab sync`` would upload them into one experiment.

Media: a ``media`` record (key, step, column type, file name) per logged value, the file
under ``<run folder>/media/<text|image|echarts|...>/`` (named ``<step:03d>-<sha256[:8]>.<ext>``:
the key is not in the name). ``save`` records name the files ``run.save`` registered
(``files/<name>``, a symlink to the source unless the source is already there).
``read_swanlab_media`` returns both.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from swanlab.proto.swanlab.metric.column.v1.column_pb2 import ColumnType
from swanlab.proto.swanlab.record.v1.record_pb2 import Record
from swanlab.proto.swanlab.run.v1.run_pb2 import RunState
from swanlab.proto.swanlab.save.v1.save_pb2 import SaveType

from tracklane.workers.sinks.wandb_store import scan
from tracklane.workers.testing.readers import ReadBack

_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_SYSTEM_PREFIX = "__swanlab__."  # swanlab's own hardware metrics, not the user's


@dataclass
class SwanlabRunDir:
    """One ``swanlab.init`` found under a logdir."""

    run_id: str
    experiment: str
    project: str
    started: float
    path: Path


def list_swanlab_runs(logdir: str | Path) -> list[SwanlabRunDir]:
    """Every run folder under ``logdir``, oldest first."""
    found = []
    for store in sorted(Path(logdir).glob("run-*/run-*.swanlab")):
        first = next(_records(store), None)
        if first is None:  # killed before its first record reached disk: nothing to read
            continue
        start = first.start
        found.append(SwanlabRunDir(run_id=start.id, experiment=start.name, project=start.project,
                                   started=start.started_at.seconds + start.started_at.nanos / 1e9, path=store.parent))
    return sorted(found, key=lambda r: (r.started, r.path.name))


def read_swanlab_run(logdir: str | Path, *, run_id: str | None = None, experiment: str | None = None) -> ReadBack:
    """The run with this id and/or experiment name (or the only run) under ``logdir``.

    Segments of a resumed run are joined: points in order, params and status from the last.
    Raises ``LookupError`` when nothing matches or the selection names several run ids.
    """
    out = ReadBack()
    for segment in _segments(logdir, run_id, experiment):
        _read_segment(segment.path, out)
    return out


def _segments(logdir: str | Path, run_id: str | None, experiment: str | None) -> list[SwanlabRunDir]:
    segments = [r for r in list_swanlab_runs(logdir)
                if (run_id is None or r.run_id == run_id) and (experiment is None or r.experiment == experiment)]
    ids = {r.run_id for r in segments}
    if len(ids) != 1:
        raise LookupError(f"expected one swanlab run under {logdir} (run_id={run_id!r}, "
                          f"experiment={experiment!r}), found ids {sorted(ids)}")
    return segments


def _read_segment(run_dir: Path, out: ReadBack) -> None:
    (store,) = run_dir.glob("run-*.swanlab")
    out.status = None  # a segment without a finish record ended without swanlab knowing how
    for record in _records(store):
        kind = record.WhichOneof("record_type")
        if kind == "scalar" and not record.scalar.key.startswith(_SYSTEM_PREFIX):
            out.points.append((record.scalar.step, record.scalar.key, record.scalar.value.number))
        elif kind == "finish":
            out.status = RunState.Name(record.finish.state).removeprefix("RUN_STATE_")
    config = run_dir / "files" / "config.yaml"
    if config.exists():
        stored = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        out.params = {key: item["value"] for key, item in stored.items()}


def _records(store: Path) -> Iterator[Record]:
    """Every ``Record`` in a ``.swanlab`` file, up to a cut-off tail; a bad checksum raises ``ValueError``. The
    chunks are LevelDB's log records, framed as wandb frames its ``.wandb`` file (``wandb_store.scan``)."""
    data = store.read_bytes()
    if len(data) < _HEADER.size:
        return
    ident, _, version = _HEADER.unpack_from(data)
    if ident != b":SWL" or version != 2:
        raise ValueError(f"{store}: not a swanlab v2 store (ident {ident!r}, version {version})")
    for message, _ in scan(data[_HEADER.size:], _HEADER.size, store):
        yield Record.FromString(message)


# Column type -> folder under media/ (swanlab's own map: swanlab.sdk.internal.pkg.adapter.medium).
_MEDIA_FOLDERS = {ColumnType.COLUMN_TYPE_TEXT: "text", ColumnType.COLUMN_TYPE_IMAGE: "image",
                  ColumnType.COLUMN_TYPE_AUDIO: "audio", ColumnType.COLUMN_TYPE_VIDEO: "video",
                  ColumnType.COLUMN_TYPE_ECHARTS: "echarts", ColumnType.COLUMN_TYPE_OBJECT3D: "object3d",
                  ColumnType.COLUMN_TYPE_MOLECULE: "molecule", ColumnType.COLUMN_TYPE_HTML: "html"}


@dataclass
class MediaEntry:
    """One media value as a ``media`` record names it."""

    step: int
    key: str
    kind: str
    """The media folder: text, image, echarts, ..."""
    path: Path
    caption: str


@dataclass
class SavedFile:
    """One file registered with ``run.save``."""

    name: str
    """Its path under the run's ``files/`` folder."""
    source: Path
    target: Path


@dataclass
class SwanlabMedia:
    """The media values and saved files of one run, in storage order."""

    entries: list[MediaEntry] = field(default_factory=list)
    saved: list[SavedFile] = field(default_factory=list)
    """Files the user saved (swanlab's own config, metadata and requirements left out)."""

    def of(self, key: str) -> dict[int, list[MediaEntry]]:
        """step -> the entries logged under ``key`` at that step (one per log call)."""
        out: dict[int, list[MediaEntry]] = {}
        for entry in self.entries:
            if entry.key == key:
                out.setdefault(entry.step, []).append(entry)
        return out

    def one(self, key: str) -> dict[int, Path]:
        """step -> the file of the single entry of ``key`` at that step (raises if a step has several)."""
        out = {}
        for step, entries in self.of(key).items():
            if len(entries) != 1:
                raise ValueError(f"{key!r} has {len(entries)} entries at step {step}")
            out[step] = entries[0].path
        return out

    def tables(self, key: str) -> dict[int, tuple[list[str], list[list[Any]]]]:
        """step -> (headers, rows) of the echarts Table stored for ``key``."""
        out = {}
        for step, path in self.one(key).items():
            table = json.loads(path.read_text(encoding="utf-8"))
            if table.get("_swanLab") != "table":
                raise ValueError(f"{path} is no swanlab table")
            headers = [column["field"] for column in table["colDefs"]]
            out[step] = (headers, [[row.get(h) for h in headers] for row in table["rowData"]])
        return out

    def bars(self, key: str) -> dict[int, tuple[list[str], list[float]]]:
        """step -> (x-axis labels, values of the first series) of the echarts bar chart stored for ``key``."""
        out = {}
        for step, path in self.one(key).items():
            chart = json.loads(path.read_text(encoding="utf-8"))
            (series, *_) = [s for s in chart["series"] if s["type"] == "bar"]
            out[step] = (chart["xAxis"][0]["data"], [point["value"] if isinstance(point, dict) else point
                                                      for point in series["data"]])
        return out

    def texts(self, key: str) -> dict[int, str]:
        return {step: path.read_bytes().decode("utf-8") for step, path in self.one(key).items()}

    def images(self, key: str) -> dict[int, Path]:
        return self.one(key)


def read_swanlab_media(logdir: str | Path, *, run_id: str | None = None, experiment: str | None = None) -> SwanlabMedia:
    """Media entries and user-saved files of one run (all its segments, in start order)."""
    out = SwanlabMedia()
    own = (SaveType.SAVE_TYPE_CONFIG, SaveType.SAVE_TYPE_METADATA, SaveType.SAVE_TYPE_REQUIREMENTS, SaveType.SAVE_TYPE_CONDA)
    for segment in _segments(logdir, run_id, experiment):
        (store,) = segment.path.glob("run-*.swanlab")
        for record in _records(store):
            kind = record.WhichOneof("record_type")
            if kind == "media":
                media = record.media
                folder = _MEDIA_FOLDERS[media.type]
                where = segment.path / "media" / folder
                out.entries += [MediaEntry(media.step, media.key, folder, where / item.filename, item.caption)
                                for item in media.value.items]
            elif kind == "save" and record.save.type not in own:
                save = record.save
                out.saved.append(SavedFile(save.name, Path(save.source_path), Path(save.target_path)))
    return out
