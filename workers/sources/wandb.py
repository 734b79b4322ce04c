"""wandb: an offline run folder read from its transaction log (``run-<id>.wandb``), as wandb 0.31 writes it.

The file's framing is ``workers/sinks/wandb_store.py``'s; each record is a ``wandb_internal_pb2.Record`` (wandb's own
schema). A run resumed offline has one folder per process: ``of_target`` reads every file of the run, oldest
first. What each record gives:

    run, config       project, display name, run id; the config (nested, JSON values; wandb's ``_wandb`` left out)
    metric            ``define_metric``: a key's step metric (also glob patterns)
    history           one Metrics record per row and step axis: the step is the value of the key's step metric
                      in the row (wandb's ``step_sync`` would fill in its last value: so is it here), else the
                      row's ``_step``; the time is the row's ``_timestamp``; keys starting with "_" and the step
                      metrics themselves are not points. A step metric other than ``_step`` or the tracklane
                      sink's ``tracklane/step`` becomes the record's ``axis``.
                      Media values of the row (``nested_key`` [key, field] with a ``_type``):
                        table-file / incremental-table-file  ->  by its columns: step,input,output,score ->
                          Generations; step,text -> Text (one per row); the tracklane trajectory columns ->
                          Trajectories (token ids are lost: wandb keeps only their count, counted); verl's
                          step,input_1,output_1,score_1,... (one row per step, the whole table logged again
                          each time) -> Generations of the row of that step; other tables -> an Artifact of
                          the table's JSON file (type "wandb-table")
                        histogram -> Histogram (bins and counts only: mean and std unknown, NaN)
                        image-file -> Image;  anything else (html, audio, video, several images) -> counted
    artifact          Artifact (offline, the files wait in WANDB_DATA_DIR/artifacts/staging until ``wandb sync``;
                      several files are copied into one folder); wandb's own table storage artifacts left out

A record with no time of its own (an artifact) gets the newest row time seen before it.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tracklane.core.errors import ConfigError
from tracklane.core.records import Artifact, Generations, Image, Metrics, Record, RunSpec, Text, Trajectories, Trajectory
from tracklane.core.values import as_number
from tracklane.host.sink import import_sdk
from tracklane.host.source import Source, SourceRun, option
from tracklane.workers.sinks.media import GENERATION_COLUMNS, TRAJECTORY_COLUMNS, safe_name
from tracklane.workers.sinks.wandb_store import apply_config, iter_payloads, metadata_step, run_files
from tracklane.workers.sources.shaping import ROLLOUT_INDICES, binned_histogram, in_step_order, png, score

STEP_AXIS = "tracklane/step"  # workers/sinks/wandb.py: the trainer's step
TEXT_COLUMNS = ["step", "text"]
INTERNAL_ARTIFACTS = frozenset({"run_table", "wandb-run-incremental-table", "job", "code", "wandb-history"})
_TABLES = frozenset({"table-file", "incremental-table-file"})
_STORED_AS = {kind: kind for kind in ("generations", "trajectories", "text", "histogram", "image", "artifact")}


class WandbSource(Source):
    name = "wandb"
    sdk_module = "wandb"
    extra = "wandb"

    def __init__(self, files: list[Path]) -> None:
        super().__init__()
        self.files = files
        self._run: SourceRun | None = None
        self._records: list[Record] = []
        self._axes: dict[str, str] = {}  # key -> its step metric
        self._globs: list[tuple[str, str]] = []  # (pattern, step metric)
        self._last: dict[str, float | int] = {}  # step metric -> its last value
        self._time = 0.0  # the newest row time

    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> WandbSource:
        """``--run-dir``: an offline run folder (``wandb/offline-run-<time>-<id>``), its ``.wandb`` file, or a
        WANDB_DIR holding exactly one run."""
        path = Path(option(options, "run_dir", cls.name))
        files = [path] if path.is_file() else sorted(path.glob("run-*.wandb")) or run_files(path)
        if not files:
            raise ConfigError(f"no wandb run file (run-<id>.wandb) in {path}")
        return cls(files)

    @classmethod
    def of_target(cls, settings: Mapping[str, Any], run: RunSpec) -> WandbSource:
        files = run_files(settings.get("dir") or ".", run.run_id)
        if not files:
            raise ConfigError(f"no wandb run file for run {run.run_id} under {settings.get('dir')}")
        return cls(files)

    def run(self) -> SourceRun:
        self._parse()
        assert self._run is not None
        return self._run

    def records(self) -> Iterator[Record]:
        self._parse()
        return iter(in_step_order(self._records))

    # -- reading the transaction log ------------------------------------------------------------
    def _parse(self) -> None:
        if self._run is not None:
            return
        import_sdk(type(self))
        self._run = SourceRun(project="", experiment="", where=f"wandb run files {', '.join(map(str, self.files))}")
        for path in self.files:
            for record in run_records(path):
                self._apply(record, path.parent / "files")
        if not self._run.experiment:
            self._run.experiment = self._run.run_id or "run"
        self._run.project = self._run.project or "wandb"

    def _apply(self, record: Any, files_dir: Path) -> None:
        kind = record.WhichOneof("record_type")
        assert self._run is not None
        if kind == "run":
            self._run.run_id = self._run.run_id or record.run.run_id
            self._run.project = self._run.project or record.run.project
            self._run.experiment = self._run.experiment or record.run.display_name
            self._time = self._time or float(record.run.start_time.ToSeconds())
            apply_config(self._run.params, record.run.config)
        elif kind == "config":
            apply_config(self._run.params, record.config)
        elif kind == "metric":
            self._define(record.metric)
        elif kind == "history":
            self._history(record.history, files_dir)
        elif kind == "artifact":
            self._artifact(record.artifact)

    def _define(self, metric: Any) -> None:
        if metric.step_metric and metric.name:
            self._axes[metric.name] = metric.step_metric
        elif metric.step_metric and metric.glob_name:
            self._globs.append((metric.glob_name, metric.step_metric))

    def _axis_of(self, key: str) -> str | None:
        return self._axes.get(key) or next((step for pattern, step in self._globs if fnmatch.fnmatchcase(key, pattern)), None)

    def _history(self, history: Any, files_dir: Path) -> None:
        items, media = history_row(history)
        row_step = int(items["_step"]) if isinstance(items.get("_step"), (int, float)) else int(history.step.num)
        when = float(items["_timestamp"]) if isinstance(items.get("_timestamp"), (int, float)) else self._time
        self._time = when
        axes = set(self._axes.values()) | {step for _, step in self._globs}
        for name in axes:
            if isinstance(items.get(name), (int, float)):
                self._last[name] = items[name]
        by_axis: dict[tuple[str | None, int], dict[str, float | int]] = {}
        for key, value in items.items():
            if key.startswith("_") or key in axes:
                continue
            number = as_number(value)  # JSON values: a bool as 0 or 1, a list or dict None
            if number is None:
                self.skip(f"{type(value).__name__} history values")
                continue
            by_axis.setdefault(self._step(key, row_step), {})[key] = number
        for (axis, step), values in by_axis.items():
            self._records.append(Metrics(step=step, values=values, time=when, axis=axis))
        for key, fields in media.items():
            _axis, step = self._step(key, row_step)
            self._media(key, fields, step, when, files_dir)

    def _step(self, key: str, row_step: int) -> tuple[str | None, int]:
        """(axis, step) of a key in a row whose ``_step`` is ``row_step``."""
        axis = self._axis_of(key)
        if axis is None or axis == "_step" or axis not in self._last:
            return None, row_step
        return (None if axis == STEP_AXIS else axis), int(self._last[axis])

    def _media(self, key: str, fields: dict[str, Any], step: int, when: float, files_dir: Path) -> None:
        kind = str(fields.get("_type"))
        if kind in _TABLES:
            self._records += self._table(key, step, when, files_dir / fields["path"])
        elif kind == "histogram":
            self._records.append(binned_histogram(step, when, key, fields["bins"], fields["values"]))
        elif kind == "image-file":
            data = (files_dir / fields["path"]).read_bytes()
            self._records.append(Image(step=step, name=key, png=png(data), time=when))
        else:
            self.skip(f"{kind} media")

    def _table(self, key: str, step: int, when: float, path: Path) -> list[Record]:
        table = json.loads(path.read_text(encoding="utf-8"))  # Python's json reads NaN and Infinity
        columns, rows = list(table.get("columns") or []), list(table.get("data") or [])
        if columns == GENERATION_COLUMNS:
            samples = [[str(r[1]), str(r[2]), score(r[3])] for r in rows]
            return [Generations(step=step, samples=samples, time=when, key=key)]
        if columns == TEXT_COLUMNS:
            return [Text(step=step, name=key, text=str(r[1]), time=when) for r in rows]
        if columns == TRAJECTORY_COLUMNS:
            return [Trajectories(step=step, trajectories=[self._trajectory(r) for r in rows], time=when, key=key)]
        if _verl_generations(columns):
            return [Generations(step=step, samples=_verl_samples(r), time=when, key=key) for r in rows if r[0] == step]
        return [Artifact(step=step, path=str(path), name=key, type="wandb-table", time=when)]

    def _trajectory(self, row: list[Any]) -> Trajectory:
        fields = dict(zip(TRAJECTORY_COLUMNS, row, strict=True))
        meta = json.loads(fields["meta"] or "{}")
        meta.update({name: fields[name] for name in ROLLOUT_INDICES if fields[name] is not None})
        if fields["num_tokens"]:
            self.skip("trajectory token ids (wandb keeps only their count)")
        rewards = {str(k): score(v) for k, v in json.loads(fields["rewards"] or "{}").items()}
        return Trajectory(messages=json.loads(fields["messages"] or "[]"), tool_calls=json.loads(fields["tool_calls"] or "[]"),
                          rewards=rewards, meta=meta)

    def _artifact(self, artifact: Any) -> None:
        if artifact.type in INTERNAL_ARTIFACTS or artifact.type.startswith("wandb-"):
            return
        entries = list(artifact.manifest.contents)
        if not entries:
            self.skip("empty artifacts")
            return
        if len(entries) == 1:
            path = entries[0].local_path
        else:  # one folder holding the artifact's files under their paths
            path = os.path.join(self.scratch(), safe_name(artifact.name), safe_name(artifact.type))
            for entry in entries:
                target = os.path.join(path, entry.path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(entry.local_path, target)
        step = metadata_step(artifact.metadata)
        step = int(step) if isinstance(step, (int, float)) and math.isfinite(step) else 0
        self._records.append(Artifact(step=step, path=path, name=artifact.name, type=artifact.type, time=self._time))

    # -- how wandb stores what the wandb sink hands it -------------------------------------------
    @classmethod
    def stored_as(cls, kind: str) -> str | None:
        return _STORED_AS.get(kind)

    @classmethod
    def stored_name(cls, kind: str, name: str) -> str:
        return safe_name(name, "-") if kind == "artifact" else name


def run_records(path: Path) -> Iterator[Any]:
    """The ``Record`` messages (wandb's own schema) of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    for payload in iter_payloads(path):
        yield wandb_internal_pb2.Record.FromString(payload)  # type: ignore[attr-defined]  # generated protobuf


def history_row(history: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(plain items by key, media values by logged key) of one history record."""
    items: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for item in history.item:
        if len(item.nested_key) > 1:
            nested.setdefault(item.nested_key[0], {})["/".join(item.nested_key[1:])] = _value(item)
        else:
            items[item.key or "/".join(item.nested_key)] = _value(item)
    media = {key: fields for key, fields in nested.items() if "_type" in fields}
    for key, fields in nested.items():  # a nested dict that is no media value: its leaves
        if key not in media:
            items.update({f"{key}/{name}": value for name, value in fields.items()})
    return items, media


def _value(item: Any) -> Any:
    """wandb 0.31 writes ``value_json``; the typed ``value`` oneof is read too, should a writer use it."""
    typed = item.WhichOneof("value")
    if typed == "json":
        return json.loads(item.json)
    if typed is not None:
        return None if typed == "none" else getattr(item, typed)
    return json.loads(item.value_json) if item.value_json else None  # Python's json reads NaN and Infinity


def _verl_generations(columns: list[str]) -> bool:
    """verl's ``ValidationGenerationsLogger`` table: step, input_1, output_1, score_1, input_2, ..."""
    triples = columns[1:]
    return bool(triples) and columns[0] == "step" and len(triples) % 3 == 0 and all(
        triples[3 * i: 3 * i + 3] == [f"input_{i + 1}", f"output_{i + 1}", f"score_{i + 1}"]
        for i in range(len(triples) // 3))


def _verl_samples(row: list[Any]) -> list[list[Any]]:
    cells = row[1:]
    return [[str(cells[i]), str(cells[i + 1]), score(cells[i + 2])] for i in range(0, len(cells), 3)]

