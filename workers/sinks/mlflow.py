"""MLflow: one MLflow run per tracklane run, written with ``MlflowClient`` on the lane's thread.

The client API (not the fluent ``mlflow.start_run`` globals) lets several runs live in one
process. Behaviour follows verl's MLflow logger: the project is the MLflow experiment, the
experiment name is the run name, ``MLFLOW_RUN_ID`` attaches to an existing run, params are
flattened with ``/`` and metric names are sanitised the way verl sanitises them.

What MLflow stores (sqlite store, directly or behind ``mlflow server``): NaN is kept (an
``is_nan`` flag), +-Inf become +-1.7976931348623157e308 (the largest float64).

Rich records become run artifacts, one small file per record (``log_table`` is not used: after
~170 table files the server's ``mlflow.loggedArtifacts`` tag overflows and every later call fails):

    generations   generations/<key>/step_<step:08d>.json    [{"input", "output", "score"}, ...] as verl's val_step*.json
    trajectories  trajectories/<key>/step_<step:08d>.json   {"step", "key", "trajectories": [Trajectory.as_dict(), ...]}
    histogram     histograms/<name>/step_<step:08d>.json    30 bins of the finite values + non-finite counts,
                  and metrics <name>/mean, /std (population), /min, /max, /count (finite values) at the step
    text          text/<name>/step_<step:08d>.txt
    alert         the text ``alert/<rule>``, and the run tag ``tracklane.alert.<rule>``: "<level> at step N: why"
    image         client.log_image(key=<name>, step=step): images/<name>+step+<step>+... .png (+ a .webp thumbnail)
    artifact      <type>/<name>/step_<step>/<file name> (a directory: its files), each step a version of its own
    traces        not artifacts: one MLflow trace each (the run page's Traces tab), in the run's experiment, linked to
                  the run by trace metadata ``mlflow.sourceRun`` (what ``search_traces(run_id=...)`` matches);
                  one root span <name> from start_ns to end_ns, status OK / ERROR (description: exception_type),
                  inputs = metadata["inputs"], outputs = metadata["output"], attributes ``exception_type`` and
                  ``mlflow.chat.messages`` = messages (the UI's Chat view); trace tags str(key) -> str(value) for
                  each attribute (as verl's mlflow backend sets them), ``tracklane.key``, ``tracklane.trace_id``

In the path, ``<key>``/``<name>`` is sanitised like a metric name with "/" turned into "~" (one folder,
as ``log_image`` does). JSON is strict UTF-8 JSON: NaN and +-Inf are written as ``null``. Where the
artifacts land: a server's artifact store; for a sqlite URI, an experiment this sink creates gets an explicit
artifact location beside the database, ``<db folder>/mlartifacts/<experiment>`` (MLflow's own default is
``./mlruns`` of whichever process created the experiment: the trainer's folder, outside tracklane_runs/);
an experiment that exists keeps the location it has.
A second record of one name at one step replaces the first file (images are kept, each has a uuid).

Traces are stored exactly once per run, written by ``workers/sinks/mlflow_traces.py`` (its docstring says how).

A new sqlite database is never migrated where it will live. MLflow's first open of a missing file creates
it there and runs its ~100 schema migrations on it (about 1 s here), one DDL statement at a time: a kill in
between leaves a database that every later open refuses (mlflow 3.17, kills spread over the migration: 19
of 24 left ``table _alembic_tmp_experiments already exists``, ``duplicate column name: ...`` and the like).
So ``create_sqlite_store`` builds it under a temporary name in the same folder and links it into place
once complete: a kill at any moment leaves no database or a complete one (``tests/trackers/test_store_creation.py``).
The artifact folder beside it needs nothing of the kind: MLflow makes nothing there until a file is logged,
and a run whose folder is missing lists no artifacts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import socket
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson

from tracklane.core.errors import SinkError
from tracklane.core.histogram import HistogramFigures
from tracklane.core.params import flatten_params
from tracklane.core.records import (
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
)
from tracklane.host.sink import Sink, exception_chain, import_sdk
from tracklane.workers.sinks.media import histogram_stats, pil_image, safe_name
from tracklane.workers.sinks.mlflow_traces import TRACE_ID_TAG as TRACE_ID_TAG  # re-exported: tests read traces by it
from tracklane.workers.sinks.mlflow_traces import MlflowTraces
from tracklane.workers.sinks.mlflow_traces import trace_record_id as trace_record_id  # re-exported, as TRACE_ID_TAG

log = logging.getLogger("tracklane")

DEFAULT_TRACKING_URI = "sqlite:////tmp/mlruns.db"  # verl's default
MAX_PARAMS_PER_REQUEST = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
MAX_METRICS_PER_REQUEST = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (mlflow 3.x)
MAX_KEY_LENGTH = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
MAX_TAG_VALUE_LENGTH = 8000  # mlflow.utils.validation.MAX_TAG_VAL_LENGTH (mlflow 3.x)
ALERT_TAG = "tracklane.alert."
"""A run tag per rule that fired: its newest alert (level, step, why)."""

# verl's rules (verl/utils/tracking.py, _MlflowLoggingAdapter): MLflow accepts only slashes,
# alphanumerics, underscores, periods, dashes, colons and spaces, and treats "//" as a path.
_SLASH_RUNS = re.compile(r"/+")
_INVALID_CHARS = re.compile(r"[^/\w.\- :]")
_INVALID_IMAGE_KEY_CHARS = re.compile(r"[^a-zA-Z0-9_\-./ ]")  # MlflowClient.log_image's rule for key


def mlflow_key(key: str) -> str:
    """A metric or param name MLflow accepts: "@" -> "_at_", "//" -> "/", other bad chars -> "_"."""
    name = _INVALID_CHARS.sub("_", _SLASH_RUNS.sub("/", key.replace("@", "_at_")))
    if _is_path_safe(name) and len(name) <= MAX_KEY_LENGTH:
        return name
    # Beyond verl (which would fail the whole request): names MLflow rejects as paths
    # ("/a", "a/", "a/../b", ".") or as too long.
    parts = [part.replace(".", "_") if part in (".", "..") else part for part in name.strip("/").split("/")]
    name = "/".join(parts) or "_"
    if name.startswith(".."):  # "..x" too reads as a path out of the run's folder
        name = "__" + name[2:]
    return name[:MAX_KEY_LENGTH]


def _is_path_safe(name: str) -> bool:
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith(("..", "/"))


def sqlite_file(uri: str) -> str:
    """The database file of a ``sqlite:///`` URI with an absolute path ("" for any other store or in memory)."""
    if not uri.startswith("sqlite:///"):
        return ""
    path = uri[len("sqlite:///"):].partition("?")[0]
    return path if path.startswith("/") else ""


def sqlite_artifact_root(uri: str) -> str:
    """``file://`` URI of ``mlartifacts`` beside a sqlite database file ("" for any other store)."""
    path = sqlite_file(uri)
    return Path(os.path.dirname(path), "mlartifacts").as_uri() if path else ""


def absolute_tracking_uri(uri: str) -> str:
    """Make a relative sqlite path or a bare local directory absolute: the lane may run elsewhere."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and not path.startswith(("/", ":memory:")):
            return "sqlite:///" + os.path.abspath(path)
        return uri
    if not urlparse(uri).scheme:
        return os.path.abspath(uri)
    return uri


CREATING_SUFFIX = ".creating"
"""A database ``create_sqlite_store`` is building: ``.<db name>.<host>.<pid>.<random>.creating`` beside it."""


def create_sqlite_store(path: str) -> bool:
    """Create MLflow's sqlite database at ``path`` if there is none, so that a kill at any moment leaves none
    or a complete one: created and migrated under a temporary name in the same folder, closed, then
    hard-linked into place, which fails rather than replaces a database another lane or process made
    meanwhile (theirs is complete too, and kept). True if this call put the database there."""
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    remove_dead_temporaries(path)
    if os.path.exists(path):
        return False
    temp = os.path.join(folder, f".{name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}{CREATING_SUFFIX}")
    try:
        _migrate(temp)
        return _link_new(temp, path)
    finally:
        for leftover in (temp, temp + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _migrate(path: str) -> None:
    """What ``SqlAlchemyStore.__init__`` does to a new database (mlflow/store/tracking/sqlalchemy_store.py), then
    every connection closed: the file is complete, with no journal beside it."""
    from mlflow.store.db import utils

    engine = utils.create_sqlalchemy_engine(f"sqlite:///{path}")
    try:
        utils._initialize_tables(engine)
        utils._verify_schema(engine)
    finally:
        engine.dispose()


def _link_new(temp: str, path: str) -> bool:
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links on this filesystem: a rename, which could replace a database made this instant
        if os.path.exists(path):
            return False
        os.rename(temp, path)
        return True


def remove_dead_temporaries(path: str) -> None:
    """Remove what ``create_sqlite_store`` calls killed on this host left beside ``path`` (their process is gone)."""
    folder, name = os.path.split(path)
    prefix, host = f".{name}.", socket.gethostname()
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        stem = entry.removesuffix("-journal")
        if not (entry.startswith(prefix) and stem.endswith(CREATING_SUFFIX)):
            continue
        owner, _, pid = stem[len(prefix):-len(CREATING_SUFFIX)].rpartition(".")[0].rpartition(".")  # host.pid.random
        if owner == host and pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):  # gone already, or another user's in a sticky /tmp
                os.unlink(os.path.join(folder, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process is there
    except ProcessLookupError:
        return False
    except PermissionError:  # there, as another user's
        pass
    return True


_BUSY_STATUSES = (429, 502, 503, 504)


class MlflowSink(Sink):
    name = "mlflow"
    sdk_module = "mlflow"
    extra = "mlflow"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        uri = env.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        uri = absolute_tracking_uri(uri)
        return {"tracking_uri": uri, "run_id": env.get("MLFLOW_RUN_ID") or "", "artifact_root": sqlite_artifact_root(uri)}

    @classmethod
    def is_outage(cls, exc: BaseException) -> bool:
        """The server cannot be reached, or answers that it cannot serve now (429, 502-504; a 500 may be
        these records' fault, so it counts as a refusal). MLflow's client raises its own exception
        while handling the network's, so the cause is in the chain."""
        import requests
        from mlflow.exceptions import MlflowException

        network = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                   requests.exceptions.RetryError)
        for error in exception_chain(exc):
            if isinstance(error, network) or super().is_outage(error):
                return True
            if isinstance(error, MlflowException):
                if error.get_http_status_code() in _BUSY_STATUSES:
                    return True
        return False

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.tracking_uri: str = self.settings["tracking_uri"]
        self.run_id: str = ""
        self._client: Any = None
        self._keys: dict[str, str] = {}  # metric name -> sanitised name, warned once each
        self._closed = False
        self._pending: list[Any] = []  # the batch's metrics, sent at the end of write()
        self._stamps: dict[tuple[str, int], int] = {}  # (name, step) -> its last timestamp in this write
        self._traces: MlflowTraces | None = None  # the run's traces, from the first written

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        import_sdk(type(self))
        from mlflow.tracking import MlflowClient

        with _translate(f"open an MLflow run at {self.tracking_uri}"):
            database = sqlite_file(self.tracking_uri)
            if database:  # never let MLflow migrate a new database in place (module docstring)
                create_sqlite_store(database)
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            # MLFLOW_RUN_ID (verl's way to attach), else for a resumed run the run tagged with its id
            attach = self.settings.get("run_id") or (
                _tagged_run(self._client, self.run.project, self.run.run_id) if self.run.resume else "")
            if resume:
                self.run_id = resume["run_id"]
                self._client.update_run(self.run_id, status="RUNNING")
            elif attach:
                self.run_id = attach
                self._client.update_run(self.run_id, status="RUNNING")
                self._log_params(existing=self._client.get_run(self.run_id).data.params)
            else:
                experiment_id = _experiment_for(self._client, self.run.project, self.settings.get("artifact_root") or "")
                tags = {"tracklane.run_id": self.run.run_id} if self.run.run_id else None
                created = self._client.create_run(experiment_id, run_name=self.run.experiment, tags=tags)
                self.run_id = created.info.run_id
                self._log_params(existing={})
        return {"run_id": self.run_id}

    def _log_params(self, existing: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        params = []
        truncated = 0
        for key, value in flatten_params(self.run.params).items():
            name, text = mlflow_key(key), str(value)
            if len(text) > MAX_PARAM_VALUE_LENGTH:
                text = text[:MAX_PARAM_VALUE_LENGTH]
                truncated += 1
            if name in existing:  # attached run: MLflow params are write-once
                if existing[name] != text:
                    log.warning("mlflow: run %s already has param %r = %r; keeping it, not %r",
                                self.run_id, name, existing[name][:100], text[:100])
                continue
            params.append(Param(name, text))
        if truncated:
            self.counts.add(self.counts.cuts, "params_truncated", truncated)
            log.warning("mlflow: %d param value(s) cut to %d characters", truncated, MAX_PARAM_VALUE_LENGTH)
        for start in range(0, len(params), MAX_PARAMS_PER_REQUEST):
            self._client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_PER_REQUEST],
                                   synchronous=True)

    def write(self, records: Sequence[Record]) -> None:
        # The batch's metrics (scalars and histogram summaries, every step in it) go in as few log_batch requests
        # as fit: a request costs the server ~14 ms of CPU before its first metric (measured on a local server),
        # and the hooks are called once per run of one kind, so a step at a time.
        self._pending, self._stamps = [], {}
        super().write(records)
        with _translate(f"log metrics to MLflow run {self.run_id}"):
            for start in range(0, len(self._pending), MAX_METRICS_PER_REQUEST):
                self._client.log_batch(self.run_id, metrics=self._pending[start:start + MAX_METRICS_PER_REQUEST],
                                       synchronous=True)

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        from mlflow.entities import Metric

        # MLflow's store keeps one row per (name, step, timestamp, value): two calls logging the same value of a key
        # at one step within a millisecond (verl's own calls, a few ms apart, never are) would be stored once. A
        # repeat of (name, step) in the batch gets a timestamp 1 ms past the one before, so every point logged is a
        # row. Only from the batch itself: a batch written again (after a restart) gets the same timestamps, and
        # the store keeps it once.
        stamps = self._stamps
        for record in records:
            timestamp = int(record.time * 1000)
            for key, value in record.values.items():
                name = self._key(key)
                at = timestamp
                last = stamps.get((name, record.step))
                if last is not None and at <= last:
                    at = last + 1
                stamps[name, record.step] = at
                self._pending.append(Metric(name, float(value), at, record.step))

    def write_generations(self, records: Sequence[Generations]) -> None:
        with _translate(f"log generations to MLflow run {self.run_id}"):
            for record in records:
                rows = [{"input": row[0], "output": row[1], "score": row[2]} for row in record.samples]
                self._log_json(rows, "generations", record.key, record.step)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        with _translate(f"log trajectories to MLflow run {self.run_id}"):
            for record in records:
                content = {"step": record.step, "key": record.key,
                           "trajectories": [trajectory.as_dict() for trajectory in record.trajectories]}
                self._log_json(content, "trajectories", record.key, record.step)

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        from mlflow.entities import Metric

        with _translate(f"log histograms to MLflow run {self.run_id}"):
            for record in records:
                figures = record.summary()
                self._log_json(_histogram_json(record, figures), "histograms", record.name, record.step)
                timestamp = int(record.time * 1000)
                self._pending += [Metric(self._key(f"{record.name}/{stat}"), value, timestamp, record.step)
                                  for stat, value in histogram_stats(figures).items()]

    def write_text(self, records: Sequence[Text]) -> None:
        with _translate(f"log text to MLflow run {self.run_id}"):
            for record in records:
                self._client.log_text(self.run_id, record.text, _artifact_file("text", record.name, record.step, "txt"))

    def write_alert(self, records: Sequence[Alert]) -> None:
        """The text ``alert/<rule>``, and the tag ``tracklane.alert.<rule>`` (the newest of the rule: the runs table
        can filter and show it) saying at which step and why."""
        with _translate(f"tag an alert on MLflow run {self.run_id}"):
            for record in records:
                value = f"{record.level} at step {record.step}: {record.text}"
                self._client.set_tag(self.run_id, f"{ALERT_TAG}{record.rule}", value[:MAX_TAG_VALUE_LENGTH])
        super().write_alert(records)

    def write_image(self, records: Sequence[Image]) -> None:
        with _translate(f"log images to MLflow run {self.run_id}"):
            for record in records:
                image = pil_image(record.png)  # decoded as stored: MLflow writes it back as PNG, pixels unchanged
                key = _INVALID_IMAGE_KEY_CHARS.sub("_", mlflow_key(record.name))
                self._client.log_image(self.run_id, image, key=key, step=record.step,
                                       timestamp=int(record.time * 1000), synchronous=True)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        with _translate(f"log artifacts to MLflow run {self.run_id}"):
            for record in records:
                folder = f"{_path_part(record.type)}/{_path_part(record.name)}/step_{record.step}"
                if os.path.isdir(record.path):
                    self._client.log_artifacts(self.run_id, record.path, artifact_path=folder)
                else:
                    self._client.log_artifact(self.run_id, record.path, artifact_path=folder)

    def write_traces(self, records: Sequence[Trace]) -> None:
        if self._traces is None or not self._traces.loaded:  # read at the first traces written (MlflowTraces.load)
            self._traces = MlflowTraces(self._client, self.tracking_uri, self.run_id)
            with _translate(f"read the traces of MLflow run {self.run_id}"):
                self._traces.load()
        new = self._traces.new(records)
        if not new:
            return
        with _translate(f"log traces to MLflow run {self.run_id}"):
            self._traces.write(new)

    def _log_json(self, content: Any, kind: str, name: str, step: int) -> None:
        # strict JSON (NaN and +-Inf as null), encoded by orjson: a step's rollout rows are megabytes
        text = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
        self._client.log_text(self.run_id, text, _artifact_file(kind, name, step, "json"))

    def _key(self, key: str) -> str:
        name = self._keys.get(key)
        if name is None:
            name = self._keys[key] = mlflow_key(key)
            if name != key:
                log.warning("[MLflow] Metric key '%s' sanitized to '%s' due to invalid characters.", key, name)
        return name

    def close(self, exit_code: int) -> None:
        if self._client is None or self._closed:
            return
        status = "FINISHED" if exit_code == 0 else "FAILED"
        with _translate(f"end MLflow run {self.run_id}"):
            self._client.set_terminated(self.run_id, status=status, end_time=int(time.time() * 1000))
        self._closed = True

    def where(self) -> str:
        if urlparse(self.tracking_uri).scheme in ("http", "https"):
            return f"mlflow: run {self.run_id} at {self.tracking_uri}"
        return (f"mlflow: run {self.run_id} in {self.tracking_uri} "
                f"(view: mlflow ui --backend-store-uri {self.tracking_uri})")


def _tagged_run(client: Any, project: str, run_id: str) -> str:
    """The run of ``project`` tagged with our ``run_id`` ("" when there is none): what a resumed run continues."""
    experiment = client.get_experiment_by_name(project)
    if experiment is None:
        return ""
    found = client.search_runs([experiment.experiment_id], max_results=1,
                               filter_string=f"tags.`tracklane.run_id` = '{run_id}'")
    return found[0].info.run_id if found else ""


def _experiment_for(client: Any, name: str, root: str) -> str:
    """The id of experiment ``name``, created if missing (artifacts under ``root``/<name> when ``root`` is set)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=f"{root}/{safe_name(name)}" if root else None)
    except MlflowException:  # created by another process meanwhile
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _path_part(name: str) -> str:
    """A name as one artifact folder: sanitised like a metric name, "/" -> "~"."""
    return mlflow_key(name).replace("/", "~")


def _artifact_file(kind: str, name: str, step: int, extension: str) -> str:
    return f"{kind}/{_path_part(name)}/step_{step:08d}.{extension}"


def _histogram_json(record: Histogram, figures: HistogramFigures) -> dict[str, Any]:
    """Bin edges and counts of the finite values (numpy's bins), and how many values were not finite."""
    return {"step": record.step, "name": record.name, "bin_edges": figures.bin_edges, "counts": figures.counts,
            "count": figures.count, "nonfinite": {"nan": figures.nan, "+inf": figures.posinf, "-inf": figures.neginf}}


@contextlib.contextmanager
def _translate(action: str) -> Iterator[None]:
    """Re-raise an MLflow SDK error as ``SinkError`` saying what was attempted."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        raise SinkError(f"could not {action}: {exc}") from exc
