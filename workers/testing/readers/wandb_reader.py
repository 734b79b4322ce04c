"""Read a wandb run back from its ``run-<id>.wandb`` files, checking every record's CRC.

The file's framing (header, 32 KiB blocks, CRC'd records) is read by ``tracklane.workers.sinks.wandb_store``,
which the wandb sink also uses to follow what reached the disk.

``ReadBack.params`` is nested: wandb stores one JSON value per top-level config key,
and each is parsed back whole (``{"actor": {"lr": 1e-6}}``); wandb's own ``_wandb``
key is left out.

Media (tables, histograms, images, html ...) are history items whose ``nested_key`` is
``[logged key, field]``, one of the fields being ``_type``; they are not scalar points.
A point's step is the value of its key's step metric in the row (the sink logs every key against
one, ``define_metric``), else the row's ``_step``; the step metrics themselves are not points.
``read_wandb_media`` returns them per step, with the files they name under the run's
``files/`` folder (``media/table/...table.json``, ``media/images/...``), and the run's
artifact records (offline, each file's copy waits in ``WANDB_DATA_DIR/artifacts/staging``).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklane.workers.sinks.wandb_store import apply_config
from tracklane.workers.testing.readers import ReadBack


def read_wandb_run(wandb_dir: str | Path, run_id: str | None = None) -> ReadBack:
    """Every run file of one run under ``wandb_dir`` (the WANDB_DIR), oldest first, as one ReadBack."""
    back = ReadBack()
    axes: dict[str, str] = {}
    for path in run_files(wandb_dir, run_id):
        part = read_run_file(path, axes)
        back.points.extend(part.points)
        back.params.update(part.params)
        back.status = part.status or back.status
    return back


def run_files(wandb_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """The ``run-<id>.wandb`` files of one run, oldest first (``tracklane.workers.sinks.wandb_store.run_files``);
    FileNotFoundError if there is none."""
    from tracklane.workers.sinks.wandb_store import run_files as files_of

    found = files_of(wandb_dir, run_id)
    if not found:
        raise FileNotFoundError(f"no wandb run file{f' for run {run_id!r}' if run_id else ''} under {wandb_dir}")
    return found


def read_run_file(path: str | Path, axes: dict[str, str] | None = None) -> ReadBack:
    """One ``.wandb`` file: history points, config, and the exit code as ``exit_code=N``. ``axes``
    (key -> its step metric) is filled from the file's metric records (and may come from earlier files)."""
    from wandb.proto import wandb_internal_pb2  # the record schema is wandb's own

    back = ReadBack()
    axes = {} if axes is None else axes
    for payload in iter_payloads(path):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated protobuf
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "metric":
            _define(axes, record.metric)
        elif kind == "history":
            back.points.extend(_history_points(record.history, axes))
        elif kind == "run":
            apply_config(back.params, record.run.config)
        elif kind == "config":
            apply_config(back.params, record.config)
        elif kind == "exit":
            back.status = f"exit_code={record.exit.exit_code}"
    return back


def iter_payloads(path: str | Path) -> Iterator[bytes]:
    """The record payloads of a ``.wandb`` file, each CRC-checked and reassembled; a torn last record ends
    it (its writer was killed mid-write), damage elsewhere raises ``tracklane.workers.sinks.wandb_store.CorruptRunFileError``."""
    from tracklane.workers.sinks.wandb_store import iter_payloads as payloads

    return payloads(path)


def _define(axes: dict[str, str], metric: Any) -> None:
    if metric.name and metric.step_metric:
        axes[metric.name] = metric.step_metric


def _history_points(history: Any, axes: dict[str, str]) -> Iterator[tuple[int, str, float]]:
    step, items, _ = _history_row(history, axes)
    steps = set(axes.values())
    for key, value in items.items():
        if not key.startswith("_") and key not in steps and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            yield step, key, value


def _history_row(history: Any, axes: dict[str, str] | None = None
                 ) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]]]:
    """(step, plain items by key, media values by logged key) of one history record."""
    items: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for item in history.item:
        if len(item.nested_key) > 1:
            nested.setdefault(item.nested_key[0], {})["/".join(item.nested_key[1:])] = _item_value(item)
        else:
            items[item.key or "/".join(item.nested_key)] = _item_value(item)
    media = {key: fields for key, fields in nested.items() if "_type" in fields}
    for key, fields in nested.items():  # a nested dict that is no media value: its leaves, as before
        if key not in media:
            items.update({f"{key}/{name}": value for name, value in fields.items()})
    step = int(items["_step"]) if "_step" in items else history.step.num
    for key in (*items, *media):  # the row's step metric, if its keys have one
        axis = (axes or {}).get(key)
        if axis is not None and isinstance(items.get(axis), (int, float)):
            return int(items[axis]), items, media
    return step, items, media


def _item_value(item: Any) -> Any:
    """wandb 0.31 writes ``value_json``; the typed ``value`` oneof is read too, should a writer use it."""
    typed = item.WhichOneof("value")
    if typed == "json":
        return json.loads(item.json)
    if typed is not None:
        return None if typed == "none" else getattr(item, typed)
    return json.loads(item.value_json)  # Python's json reads NaN, Infinity and -Infinity


@dataclass
class MediaValue:
    """One media value of one history row."""

    step: int
    key: str
    fields: dict[str, Any]
    """What wandb stored for it: ``_type`` (table-file, incremental-table-file, histogram, image-file,
    html-file ...), ``path`` (relative to ``files_dir``) and the type's own fields."""
    files_dir: Path
    """The ``files/`` folder of the run directory that logged it."""

    @property
    def file(self) -> Path:
        return self.files_dir / self.fields["path"]


@dataclass
class StoredArtifact:
    """One ``log_artifact`` as the run file recorded it."""

    name: str
    type: str
    metadata: dict[str, Any]
    files: dict[str, Path]
    """Path inside the artifact -> the local copy wandb made (offline: until ``wandb sync``)."""
    digests: dict[str, str]
    """Path inside the artifact -> base64 MD5 of its content, as wandb computed it."""

    def content_ok(self) -> bool:
        """Every local copy still has the digest wandb recorded for it."""
        return all(base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode() == self.digests[name]
                   for name, path in self.files.items())


@dataclass
class WandbMedia:
    """The media values and artifacts of one run, in storage order."""

    values: list[MediaValue] = field(default_factory=list)
    artifacts: list[StoredArtifact] = field(default_factory=list)
    alerts: list[dict[str, str]] = field(default_factory=list)
    """``run.alert`` calls as the run file keeps them (sent when synced): title, text, level."""

    def of(self, key: str) -> dict[int, MediaValue]:
        """step -> the value logged under ``key`` (one per step: wandb keeps the last)."""
        return {value.step: value for value in self.values if value.key == key}

    def table_rows(self, key: str) -> dict[int, list[list[Any]]]:
        """step -> the rows of the table file logged at that step (an increment's new rows only)."""
        return {step: _table_file(value)["data"] for step, value in self.of(key).items()}

    def table_columns(self, key: str) -> list[str]:
        columns = {tuple(_table_file(value)["columns"]) for value in self.of(key).values()}
        if len(columns) != 1:
            raise ValueError(f"table {key!r}: columns differ between steps: {sorted(columns)}")
        return list(columns.pop())

    def histograms(self, key: str) -> dict[int, tuple[list[float], list[int]]]:
        """step -> (bin edges, counts)."""
        return {step: (value.fields["bins"], value.fields["values"]) for step, value in self.of(key).items()}

    def images(self, key: str) -> dict[int, Path]:
        """step -> the image file wandb stored."""
        return {step: value.file for step, value in self.of(key).items()}

    def user_artifacts(self) -> list[StoredArtifact]:
        """Artifacts other than wandb's own (the increments of incremental tables, run tables)."""
        return [a for a in self.artifacts if a.type not in ("wandb-run-incremental-table", "run_table")]


def read_wandb_media(wandb_dir: str | Path, run_id: str | None = None) -> WandbMedia:
    """Media values and artifact records of one run (every run file of it, oldest first)."""
    from wandb.proto import wandb_internal_pb2

    media = WandbMedia()
    axes: dict[str, str] = {}
    for path in run_files(wandb_dir, run_id):
        files_dir = Path(path).parent / "files"
        for payload in iter_payloads(path):
            record = wandb_internal_pb2.Record.FromString(payload)  # type: ignore[attr-defined]  # generated protobuf
            kind = record.WhichOneof("record_type")
            if kind == "metric":
                _define(axes, record.metric)
            elif kind == "history":
                step, _, values = _history_row(record.history, axes)
                media.values += [MediaValue(step, key, fields, files_dir) for key, fields in values.items()]
            elif kind == "artifact":
                media.artifacts.append(_artifact(record.artifact))
            elif kind == "alert":
                media.alerts.append({"title": record.alert.title, "text": record.alert.text,
                                     "level": record.alert.level})
    return media


def _table_file(value: MediaValue) -> dict[str, Any]:
    if not value.fields["_type"].endswith("table-file"):
        raise ValueError(f"{value.key} at step {value.step} is a {value.fields['_type']}, not a table")
    return json.loads(value.file.read_text(encoding="utf-8"))  # Python's json reads NaN and Infinity


def _artifact(record: Any) -> StoredArtifact:
    entries = record.manifest.contents
    return StoredArtifact(
        name=record.name, type=record.type, metadata=json.loads(record.metadata) if record.metadata else {},
        files={entry.path: Path(entry.local_path) for entry in entries},
        digests={entry.path: entry.digest for entry in entries},
    )
