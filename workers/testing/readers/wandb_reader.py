"""Read a wandb run back from its ``run-<id>.wandb`` files, checking every record's CRC.

The records are parsed as the wandb source parses them (``tracklane.workers.sources.wandb``; the framing is
``tracklane.workers.sinks.wandb_store``'s, which the wandb sink also uses to follow what reached the disk).
``ReadBack.params`` is nested: one JSON value per top-level config key (``{"actor": {"lr": 1e-6}}``), wandb's own
``_wandb`` left out. A point's step is the value of its key's step metric in the row (``define_metric``), else the
row's ``_step``; the step metrics themselves are no points, nor are media values (tables, histograms, images ...:
history items whose ``nested_key`` is ``[logged key, field]``, one field being ``_type``). ``read_wandb_media``
returns those per step, with the files they name under the run's ``files/`` folder, and the run's artifact records
(offline, each file's copy waits in ``WANDB_DATA_DIR/artifacts/staging``).
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
from tracklane.workers.sources.wandb import history_row, run_records
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
    back = ReadBack()
    for kind, record in _records(Path(path), {} if axes is None else axes):
        if kind == "history":
            step, items, _ = record
            back.points += [(step, key, value) for key, value in items.items() if isinstance(value, (int, float))
                            and not isinstance(value, bool)]
        elif kind in ("run", "config"):
            apply_config(back.params, record.run.config if kind == "run" else record.config)
        elif kind == "exit":
            back.status = f"exit_code={record.exit.exit_code}"
    return back


def _records(path: Path, axes: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """(kind, record) of each record of a run file; a history record as (step, its points' items, its media),
    the step being the value of its keys' step metric in the row (``define_metric``s fill ``axes``), else ``_step``."""
    for record in run_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "metric" and record.metric.name and record.metric.step_metric:
            axes[record.metric.name] = record.metric.step_metric
        elif kind == "history":
            items, media = history_row(record.history)
            step = next((int(items[axes[key]]) for key in (*items, *media)
                         if key in axes and isinstance(items.get(axes[key]), (int, float))),
                        int(items["_step"]) if "_step" in items else record.history.step.num)
            steps = set(axes.values())
            yield kind, (step, {k: v for k, v in items.items() if not k.startswith("_") and k not in steps}, media)
        else:
            yield kind, record


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
    media = WandbMedia()
    axes: dict[str, str] = {}
    for path in run_files(wandb_dir, run_id):
        for kind, record in _records(path, axes):
            if kind == "history":
                step, _, values = record
                media.values += [MediaValue(step, key, fields, path.parent / "files") for key, fields in values.items()]
            elif kind == "artifact":
                media.artifacts.append(_artifact(record.artifact))
            elif kind == "alert":
                media.alerts.append({"title": record.alert.title, "text": record.alert.text, "level": record.alert.level})
    return media


def _table_file(value: MediaValue) -> dict[str, Any]:
    if not value.fields["_type"].endswith("table-file"):
        raise ValueError(f"{value.key} at step {value.step} is a {value.fields['_type']}, not a table")
    return json.loads(value.file.read_text(encoding="utf-8"))  # Python's json reads NaN and Infinity


def _artifact(record: Any) -> StoredArtifact:
    entries = record.manifest.contents
    return StoredArtifact(name=record.name, type=record.type, metadata=json.loads(record.metadata) if record.metadata else {},
                          files={entry.path: Path(entry.local_path) for entry in entries},
                          digests={entry.path: entry.digest for entry in entries})
