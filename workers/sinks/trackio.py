"""trackio: one trackio run per tracklane run, written straight into trackio's local SQLite store.

Written against trackio 0.43.0. The run is a row set in ``<TRACKIO_DIR>/<project>.db`` (``project`` =
``RunSpec.project``, run name = ``RunSpec.experiment``, run id = ``RunSpec.run_id``); ``trackio show
--project <project>`` shows it. Every write is one call of trackio's own storage API,
``SQLiteStorage.bulk_log`` (the call trackio's ``Run`` makes from its sender thread), not ``trackio.log``,
because in 0.43 ``trackio.init``/``Run`` cannot do what a lane needs (trackio/run.py, __init__.py):

- ``Run.log`` keeps no timestamp: its sender thread stamps every row with the time it flushes
  (``_write_logs_to_sqlite`` passes no ``timestamps``); ``bulk_log(timestamps=...)`` keeps ``Metrics.time``.
- it gives every row a random ``log_id``, so a batch sent again after an actor restart would be stored
  twice; here a row's ``log_id`` is made from its batch (run id, sender, seq, positions, time) and trackio's
  ``INSERT OR IGNORE`` on its unique ``log_id`` index stores a re-sent batch once (no mark/rollback needed).
- it swallows write errors into a one-time warning (``_warn_once("write-logs-to-sqlite")``), so a lost
  batch would count as handed; ``bulk_log`` raises, the lane retries and counts.
- ``init(resume=...)`` resumes by run *name* only (the newest run with that name that has metrics);
  here the run id is ours, so a restarted actor re-attaches to exactly its run.
- ``Run.__init__`` asks the Hub who the user is (``huggingface_hub.whoami`` whenever a token is set: network;
  trackio/run.py:164), ``init`` starts a CPU monitor thread when psutil is there and follows ``TRACKIO_SPACE_ID`` /
  ``TRACKIO_SERVER_URL`` to a Space or server.

So there is no background thread, no server and no network here; ``write()`` returns with its rows
committed (WAL, ``synchronous=NORMAL``: they survive a killed process) and ``flush()`` has nothing to do.
The hyper-parameters go once, as the run's config (trackio's ``configs`` table, one row per run id), with
the first rows, plus the keys trackio's own ``Run`` adds (``_Username``: None here, ``_Created``, ``_Group``).

What lands where (non-finite floats are stored as the strings "NaN"/"Infinity"/"-Infinity" by trackio's
``serialize_values``; its readers turn top-level ones back into floats, nested ones stay strings):

    metrics       one row per run of consecutive records of one step, stamped with the last record's time; a
                  record logging a key that row holds starts a new row (both values kept, as verl's trackio
                  keeps a row per call); keys trackio reserves (step, time, timestamp, project, run, metrics,
                  "__*") get "__" in front, as ``trackio.log`` renames them
    other axis    a producer's axis (``rollout/step``): the row's step is that axis' step and the axis is
                  a key of the row, so the dashboard's X-axis menu can plot against it
    system axis   ``system/elapsed_s`` rows go to trackio's system metrics (its System tab, by time), one
                  per record, with ``system/elapsed_s`` among the values
    generations   a list of ``trackio.Trace`` per key and step, as verl logs them to trackio (user/assistant
                  messages, metadata source/sample_index/score): the Traces tab shows each conversation
    trajectories  a list of ``trackio.Trace``: the messages as given, each tool call a "tool" span (name,
                  input = arguments, output = result, duration_ms), metadata sample_index, rollout_index,
                  validation, score, rewards, num_tokens, meta (token ids are not stored)
    traces        one row per rollout trace, ``{key: trackio.Trace(messages, metadata)}`` at its step, as verl's own
                  trackio trace backend logs each traced call (``_log_trackio_trace``; metadata nested as verl made
                  it; the worker that traced it and the call's start and end ns added to the metadata as
                  ``tracklane``)
    histogram     ``trackio.Histogram`` of the 30 shared bins of the finite values; non-finite values are
                  left out and counted (``cuts["histogram_nonfinite"]``), none finite: nothing logged
    text          ``trackio.Markdown``
    alert         the text ``alert/<rule>``, and a trackio alert (title "tracklane: <rule>", level warn or error,
                  its step; id from the batch position, so a re-sent batch stores it once)
    image         ``trackio.Image`` of the PNG as given: trackio copies the file byte for byte (media/)
    artifact      a version of trackio artifact <name> (characters outside [A-Za-z0-9._-] -> "-") of its
                  type, files in trackio's content-addressed store (artifacts/), alias "step-<N>",
                  metadata {"step", "source"}; identical content is one version (trackio dedups)
    close         an alert "tracklane: trainer exited", text "exit code N", level info (0) or error: trackio
                  0.43 has no run status or exit code

Media files are written before their row; a row stored once but sent twice leaves an unreferenced copy.

Two trackio quirks this file works around:
- trackio reads ``TRACKIO_DIR`` once, at import (trackio/utils.py ``TRACKIO_DIR = _get_trackio_dir()``), and
  several modules copy it by value (sqlite_storage, run, table, media.media). ``point_trackio_at`` moves
  those copies to this sink's folder before every write, so the sink works whoever imported trackio first
  and with whatever ``TRACKIO_DIR`` the lane actor inherited.
- on a network filesystem trackio wants JSONL fragments instead of SQLite (``get_storage_mode``); that
  store is not written here: ``open()`` refuses it with a clear error.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import shlex
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracklane.core.errors import ConfigError, SinkError
from tracklane.core.records import (
    ALERT_TITLE,
    SYSTEM_AXIS,
    Alert,
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
    Trajectory,
)
from tracklane.host.sink import Sink, exception_chain, import_sdk
from tracklane.workers.sinks.media import png_file
from tracklane.workers.sinks.steps import merged_values, records_by_step

log = logging.getLogger("tracklane")

REMOTE_VARIABLES = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID")
"""What would send trackio to a Space, a server or the Hub; this sink writes only the local store."""
RESERVED_KEYS = frozenset({"project", "run", "timestamp", "step", "time", "metrics"})  # trackio.utils.RESERVED_KEYS
TRACKIO_RESERVED_CONFIG = ("_Username", "_Created", "_Group")
"""Config keys trackio's own ``Run`` adds (trackio/run.py); the dashboard groups runs by ``_Group``."""
EXIT_ALERT_TITLE = "tracklane: trainer exited"
_DIR_NAMES = ("TRACKIO_DIR", "MEDIA_DIR", "ARTIFACTS_DIR")
_SQLITE_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED: another process holds the database; retry later
_UNSAFE_ARTIFACT_CHARS = re.compile(r"[^A-Za-z0-9._-]+")  # trackio.cas.ARTIFACT_NAME_RE


@dataclass(slots=True)
class _Row:
    """One metrics (or system metrics) row to commit: what ``bulk_log`` takes, column by column."""

    step: int
    values: dict[str, Any]
    time: float
    log_id: str


class TrackioSink(Sink):
    """Rows into trackio's local store; each ``write()`` is committed before it returns."""

    name = "trackio"
    sdk_module = "trackio"
    extra = "trackio"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        """The store folder, absolute (the lane actor may have another cwd and environment): ``TRACKIO_DIR``,
        else trackio's default ``$HF_HOME/trackio``. verl passes trackio nothing else; tokens stay out."""
        remote = remote_variables(env)
        if remote:
            raise ConfigError(f"the trackio backend writes a local store only (TRACKIO_DIR); unset {', '.join(remote)} "
                              f"and sync it yourself later (`trackio sync --project {run.project} --space-id ...`)")
        return {"dir": trackio_dir(env)}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.dir = Path(self.settings["dir"])
        self.run_id = ""
        self._trackio: Any = None  # the trackio module once open
        self._storage: Any = None  # trackio's SQLiteStorage class once open
        self._open = False
        self._config_pending = False  # the run holds no config yet: it goes with the next rows
        self._rows: list[_Row] = []  # collected by the hooks of one write(), committed at its end
        self._system: list[_Row] = []
        self._last_step: int | None = None
        self._ids = _RowIds()  # each row's log_id, from the lane batch being written (begin_batch)
        self._renamed: set[str] = set()

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        self._trackio = import_sdk(type(self))
        remote = remote_variables(os.environ)
        if remote:  # in this process trackio's store would download from the Hub on first use
            raise SinkError(f"trackio: this process has {', '.join(remote)} set; the trackio backend writes a local "
                            "store only")
        storage = import_sdk(type(self), "trackio.sqlite_storage").SQLiteStorage
        point_trackio_at(self.dir)
        with _translate(f"open trackio project {self.run.project!r} in {self.dir}"):
            storage.validate_project_name(self.run.project)
            if import_sdk(type(self), "trackio.utils").get_storage_mode() != "sqlite":
                raise SinkError(f"trackio wants JSONL fragments for {self.dir} (a network filesystem?), which this "
                                "backend does not write: point TRACKIO_DIR at a local disk or set "
                                "TRACKIO_STORAGE_MODE=sqlite")
            storage.init_db(self.run.project)
            self.run_id = (resume or {}).get("id") or self.run.run_id or uuid.uuid4().hex
            # A run re-attached to (actor restart, resumed training) keeps the config it has.
            self._config_pending = storage.get_run_config(self.run.project, run_id=self.run_id) is None
        self._storage, self._open = storage, True
        return {"id": self.run_id}

    # -- writing: the hooks collect rows, write() commits them in one transaction -------------
    def begin_batch(self, sender: str, seq: int, records: Sequence[Record]) -> None:
        self._ids.begin_batch(sender, seq, records)

    def write(self, records: Sequence[Record]) -> None:
        if not self._open:
            raise SinkError("trackio sink written to before open() or after close()")
        point_trackio_at(self.dir)
        self._rows, self._system = [], []
        try:
            with _translate(f"prepare records for trackio run {self.run_id}"):
                super().write(records)
            self._commit()
        finally:
            self._rows, self._system = [], []

    def _commit(self) -> None:
        """System rows, then the rest with the config if due: each in one ``INSERT OR IGNORE`` transaction."""
        project, run = self.run.project, self.run.experiment
        with _translate(f"write to trackio run {self.run_id} in {self.dir}"):
            if self._system:
                self._storage.bulk_log_system(project, run, [r.values for r in self._system],
                                              timestamps=[_iso(r.time) for r in self._system],
                                              log_ids=[r.log_id for r in self._system], run_id=self.run_id)
            if self._rows:
                self._storage.bulk_log(project, run, [r.values for r in self._rows],
                                       steps=[r.step for r in self._rows], timestamps=[_iso(r.time) for r in self._rows],
                                       config=_trackio_config(self.run.params) if self._config_pending else None,
                                       log_ids=[r.log_id for r in self._rows], run_id=self.run_id)
                self._config_pending = False
                self._last_step = max([r.step for r in self._rows] + [self._last_step or 0])

    def _add(self, step: int, values: dict[str, Any], group: Sequence[Record]) -> None:
        if values:
            self._rows.append(_Row(step, values, group[-1].time, self._ids.log_id(self.run_id, group)))

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        for step, group in records_by_step(records):
            axis = group[0].axis
            if axis == SYSTEM_AXIS:  # one row per sample: its identity stays that record's alone
                self._system += [_Row(step, {**self._keys(r.values), SYSTEM_AXIS: step}, r.time,
                                      self._ids.log_id(self.run_id, [r])) for r in group]
                continue
            for part in _apart(group):
                values = self._keys(merged_values(part))
                if axis is not None:
                    values[axis] = step
                self._add(step, values, part)

    def _keys(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values with the keys trackio reserves renamed as ``trackio.log`` renames them ("__" + key)."""
        out = {}
        for key, value in values.items():
            if key in RESERVED_KEYS or key.startswith("__"):
                if key not in self._renamed:
                    self._renamed.add(key)
                    log.warning("tracklane: trackio reserves the key %r; stored as %r", key, "__" + key)
                key = "__" + key
            out[key] = value
        return out

    def write_generations(self, records: Sequence[Generations]) -> None:
        self._add_traces(records, lambda r, n: [_generation_trace(self._trackio, s, n + i) for i, s in enumerate(r.samples)])

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._add_traces(records, lambda r, n: [_trajectory_trace(self._trackio, t) for t in r.trajectories])

    def _add_traces(self, records: Sequence[Any], traces_of: Callable[[Any, int], list[Any]]) -> None:
        """A row per step: key -> the stored form of its traces (``traces_of(record, traces of its key so far)``);
        keys without any left out, so a step with no samples logs nothing."""
        for step, group in records_by_step(records):
            traces: dict[str, list[Any]] = {}
            for record in group:
                listed = traces.setdefault(record.key, [])
                listed += traces_of(record, len(listed))
            self._add(step, {self._key(key): [trace._to_dict(project=self.run.project, run=self.run.experiment,
                                                             step=step) for trace in listed]
                             for key, listed in traces.items() if listed}, group)

    def write_traces(self, records: Sequence[Trace]) -> None:
        for record in records:  # a row each, as verl's trackio.log per traced call
            metadata = record.metadata_object()
            metadata["tracklane"] = {"start_ns": record.start_ns, "end_ns": record.end_ns,
                                     "worker": record.attributes.get("worker")}
            trace = self._trackio.Trace(messages=record.messages, metadata=metadata)
            self._add(record.step, {self._key(record.key): trace._to_dict(project=self.run.project,
                                                                          run=self.run.experiment, step=record.step)},
                      [record])

    def _key(self, key: str) -> str:
        return next(iter(self._keys({key: None})))

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        for step, group in records_by_step(records):
            values = {}
            for record in group:
                figures = record.summary()
                if figures.nonfinite:  # trackio bins finite values only (Histogram drops the others itself)
                    self.counts.add(self.counts.cuts, "histogram_nonfinite", figures.nonfinite)
                if figures.count:
                    histogram = self._trackio.Histogram(np_histogram=(figures.counts, figures.bin_edges))
                    values[self._key(record.name)] = histogram._to_dict()
            self._add(step, values, group)

    def write_text(self, records: Sequence[Text]) -> None:
        for step, group in records_by_step(records):
            self._add(step, {self._key(r.name): self._trackio.Markdown(r.text)._to_dict() for r in group}, group)

    def write_alert(self, records: Sequence[Alert]) -> None:
        """trackio's own alert (its Alerts panel, ``trackio.Api().alerts``; its webhooks are the ``trackio.alert``
        call's, not the store's), stored once however often the batch is sent (its id is the row's), and the text."""
        with _translate(f"alert in trackio run {self.run_id}"):
            self._storage.bulk_alert(self.run.project, self.run.experiment,
                                     titles=[f"{ALERT_TITLE}{r.rule}" for r in records], texts=[r.text for r in records],
                                     levels=[r.level.lower() for r in records], steps=[r.step for r in records],
                                     timestamps=[_iso(r.time) for r in records],
                                     alert_ids=[self._ids.log_id(self.run_id, [r]) for r in records], run_id=self.run_id)
        super().write_alert(records)

    def write_image(self, records: Sequence[Image]) -> None:
        # Staged inside the store folder: trackio copies the file into media/<project>/<run>/<step>/.
        with tempfile.TemporaryDirectory(prefix=".tracklane-staging-", dir=self.dir) as folder:
            for step, group in records_by_step(records):
                values = {}
                for index, record in enumerate(group):
                    image = self._trackio.Image(png_file(folder, f"{step}-{index}", record.png))
                    image._save(self.run.project, self.run.experiment, step)
                    values[self._key(record.name)] = image._to_dict()
                self._add(step, values, group)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        with _translate(f"log artifacts to trackio run {self.run_id}"):
            for record in records:
                artifact = self._trackio.Artifact(artifact_name(record.name), type=record.type or "unspecified",
                                            metadata={"step": record.step, "source": record.path})
                if os.path.isdir(record.path):
                    artifact.add_dir(record.path)
                else:
                    artifact.add_file(record.path)
                # What Run.log_artifact does for a local run: stage the blobs, commit the version.
                self._storage.commit_artifact_version(
                    project=self.run.project, name=artifact.name, type=artifact.type, description=None,
                    manifest=artifact._build_manifest(self.run.project), metadata=artifact.metadata,
                    aliases=[f"step-{record.step}"], run_name=self.run.experiment, run_id=self.run_id)

    # -- the rest of the protocol -------------------------------------------------------------
    def close(self, exit_code: int) -> None:
        """Record how the trainer ended as an alert (trackio 0.43 keeps no run status); once."""
        if not self._open:
            return
        point_trackio_at(self.dir)
        with _translate(f"close trackio run {self.run_id}"):
            self._storage.bulk_alert(self.run.project, self.run.experiment, titles=[EXIT_ALERT_TITLE],
                                     texts=[f"exit code {exit_code}"], levels=["info" if exit_code == 0 else "error"],
                                     steps=[self._last_step], alert_ids=[uuid.uuid4().hex], run_id=self.run_id)
        self._open = False

    @classmethod
    def is_outage(cls, exc: BaseException) -> bool:
        """Another process holds the database (busy or locked): retry later; else the default."""
        return any(isinstance(e, sqlite3.OperationalError) and getattr(e, "sqlite_errorcode", None) in _SQLITE_BUSY
                   for e in exception_chain(exc)) or super().is_outage(exc)

    def where(self) -> str:
        name = self._storage.get_project_db_filename(self.run.project) if self._storage else f"{self.run.project}.db"
        store = self.dir / name
        return (f"trackio: run {self.run.experiment!r} (id {self.run_id or 'not opened'}) in {store}; view with "
                f"`TRACKIO_DIR={shlex.quote(str(self.dir))} trackio show --project {shlex.quote(self.run.project)}`")


class _RowIds:
    """Each row's ``log_id``, made from where its records sit in the lane batch being written."""

    def __init__(self) -> None:
        self._sender, self._seq = "", 0  # the lane batch being written (begin_batch)
        self._batch: Sequence[Record] = ()  # kept alive so that the ids in _positions stay theirs
        self._positions: dict[int, int] = {}

    def begin_batch(self, sender: str, seq: int, records: Sequence[Record]) -> None:
        self._sender, self._seq, self._batch = sender, seq, records
        self._positions = {id(record): position for position, record in enumerate(records)}

    def log_id(self, run_id: str, group: Sequence[Record]) -> str:
        """The row's identity: where its records sit in their lane batch (the same when the batch is sent
        again), and the last one's time (a resumed run numbers its batches from 1 again); outside a lane's
        batch (the synchronous path) a random one."""
        first, last = self._position(group[0]), self._position(group[-1])
        if first is None or last is None:
            return uuid.uuid4().hex
        return f"{run_id}:{self._sender}:{self._seq}:{first}-{last}:{group[-1].time!r}"

    def _position(self, record: Record) -> int | None:
        position = self._positions.get(id(record))
        return position if position is not None and self._batch[position] is record else None


def _trackio_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """The params as trackio's ``Run`` stores its config: top-level "_" keys are trackio's, so a param's get
    "cfg" in front (warned)."""
    config: dict[str, Any] = {}
    for key, value in params.items():
        name = key
        while name.startswith("_") or name in config:
            name = "cfg" + name
        if name != key:
            log.warning("tracklane: trackio reserves config keys starting with '_': param %r stored as %r", key, name)
        config[name] = value
    config.update(_Username=None, _Created=datetime.now(timezone.utc).isoformat(), _Group=None)
    return config


def _apart(group: Sequence[Metrics]) -> list[list[Metrics]]:
    """A step's records, cut before each record that logs a key the row already holds: verl's trackio stores a row
    per call, so a key logged twice at a step keeps both values (merged, the later one replaced the earlier)."""
    if len(group) == 1:
        return [list(group)]
    parts: list[list[Metrics]] = []
    held: set[str] = set()
    for record in group:
        if not parts or not held.isdisjoint(record.values):
            parts.append([])
            held = set()
        parts[-1].append(record)
        held.update(record.values)
    return parts


def remote_variables(env: Mapping[str, str]) -> list[str]:
    return [name for name in REMOTE_VARIABLES if env.get(name)]


def trackio_dir(env: Mapping[str, str]) -> str:
    """Where trackio keeps its store given ``env``: ``TRACKIO_DIR``, else ``$HF_HOME/trackio`` with HF_HOME
    defaulting as huggingface_hub's (``$XDG_CACHE_HOME/huggingface``, ``~/.cache/huggingface``)."""
    folder = env.get("TRACKIO_DIR")
    if not folder:
        cache = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        folder = os.path.join(env.get("HF_HOME") or os.path.join(cache, "huggingface"), "trackio")
    return os.path.abspath(os.path.expanduser(folder))


def point_trackio_at(folder: str | Path) -> None:
    """Make the imported trackio use ``folder`` as its TRACKIO_DIR (media/ and artifacts/ inside it).

    trackio computes these paths once, at import, and copies them by value into its modules; every
    loaded trackio module holding the old value gets the new one. A no-op when they already agree."""
    utils = importlib.import_module("trackio.utils")
    folder = Path(folder)
    new = {"TRACKIO_DIR": folder, "MEDIA_DIR": folder / "media", "ARTIFACTS_DIR": folder / "artifacts"}
    old = {name: getattr(utils, name) for name in _DIR_NAMES}
    if old == new:
        return
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "trackio" or module_name.startswith("trackio.")):
            continue
        for name in _DIR_NAMES:
            if getattr(module, name, None) == old[name]:
                setattr(module, name, new[name])


def artifact_name(name: str) -> str:
    """A name trackio accepts for an artifact: characters outside [A-Za-z0-9._-] become "-"."""
    return _UNSAFE_ARTIFACT_CHARS.sub("-", name).strip("-") or "artifact"


def _generation_trace(trackio: Any, sample: list[Any], index: int) -> Any:
    """A validation sample as verl 0.9 logs it to trackio (``log_generations_to_trackio``)."""
    text_in, text_out, score = sample
    return trackio.Trace(messages=[{"role": "user", "content": str(text_in)},
                                   {"role": "assistant", "content": str(text_out)}],
                         metadata={"source": "validation_generations", "sample_index": index, "score": score})


def _trajectory_trace(trackio: Any, trajectory: Trajectory) -> Any:
    meta = dict(trajectory.meta)
    metadata = {"source": "rollout_trajectories", "sample_index": meta.pop("sample_index", None),
                "rollout_index": meta.pop("rollout_index", None), "validation": meta.pop("validation", None),
                "score": trajectory.score(), "rewards": trajectory.rewards,
                "num_tokens": len(trajectory.token_ids) // 4, "meta": meta}
    spans = [_tool_span(index, call) for index, call in enumerate(trajectory.tool_calls)]
    return trackio.Trace(messages=trajectory.messages, metadata=metadata, spans=spans)


def _tool_span(index: int, call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call as a trackio "tool" span; keys beyond name/arguments/result/latency_s go to its metadata."""
    rest = {k: v for k, v in call.items() if k not in ("name", "arguments", "result", "latency_s")}
    span = {"id": f"tool-{index}", "name": call.get("name"), "kind": "tool", "input": call.get("arguments"),
            "output": call.get("result"), "metadata": rest}
    if isinstance(call.get("latency_s"), (int, float)):
        span["duration_ms"] = call["latency_s"] * 1000.0
    return span


def _iso(when: float) -> str:
    """A record's wall-clock time as trackio stores timestamps (ISO 8601, UTC, microseconds)."""
    return datetime.fromtimestamp(when, tz=timezone.utc).isoformat(timespec="microseconds")


@contextlib.contextmanager
def _translate(action: str) -> Iterator[None]:
    """Re-raise what trackio's storage raises (sqlite, files, bad values) as ``SinkError``."""
    try:
        yield
    except (sqlite3.Error, OSError, ValueError, TypeError, OverflowError) as exc:
        raise SinkError(f"could not {action}: {type(exc).__name__}: {exc}") from exc
