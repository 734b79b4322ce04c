"""MLflow: one MLflow run per tracklane run, written with ``MlflowClient`` on the lane's thread.

The client API (not the fluent ``mlflow.start_run`` globals) lets several runs live in one
process. Behaviour follows verl's MLflow logger: the project is the MLflow experiment, the
experiment name is the run name, ``MLFLOW_RUN_ID`` attaches to an existing run, params are
flattened with ``/`` and metric names are sanitised the way verl sanitises them.

What MLflow stores (sqlite store, directly or behind ``mlflow server``): NaN is kept (an
``is_nan`` flag), +-Inf become +-1.7976931348623157e308 (the largest float64).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import time
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlparse

from pipeline.errors import SinkError
from pipeline.params import flatten_params
from pipeline.records import Metrics, RunSpec
from workers.sink import Sink, import_sdk

log = logging.getLogger("tracklane")

DEFAULT_TRACKING_URI = "sqlite:////tmp/mlruns.db"  # verl's default
MAX_PARAMS_PER_REQUEST = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
MAX_METRICS_PER_REQUEST = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (mlflow 3.x)
MAX_KEY_LENGTH = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH

# verl's rules (verl/utils/tracking.py, _MlflowLoggingAdapter): MLflow accepts only slashes,
# alphanumerics, underscores, periods, dashes, colons and spaces, and treats "//" as a path.
_SLASH_RUNS = re.compile(r"/+")
_INVALID_CHARS = re.compile(r"[^/\w.\- :]")


def mlflow_key(key: str) -> str:
    """A metric or param name MLflow accepts: "@" -> "_at_", "//" -> "/", other bad chars -> "_"."""
    name = _INVALID_CHARS.sub("_", _SLASH_RUNS.sub("/", key.replace("@", "_at_")))
    if _is_path_safe(name) and len(name) <= MAX_KEY_LENGTH:
        return name
    # Beyond verl (which would fail the whole request): names MLflow rejects as paths
    # ("/a", "a/", "a/../b", ".") or as too long.
    parts = [part.replace(".", "_") if part in (".", "..") else part for part in name.strip("/").split("/")]
    return ("/".join(parts) or "_")[:MAX_KEY_LENGTH]


def _is_path_safe(name: str) -> bool:
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith(("..", "/"))


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


class MlflowSink(Sink):
    name = "mlflow"
    sdk_module = "mlflow"
    extra = "mlflow"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        uri = env.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        return {"tracking_uri": absolute_tracking_uri(uri), "run_id": env.get("MLFLOW_RUN_ID") or ""}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self.tracking_uri: str = self.settings["tracking_uri"]
        self.run_id: str = ""
        self.params_truncated = 0
        """How many param values were cut to MLflow's length limit."""
        self._client: Any = None
        self._keys: dict[str, str] = {}  # metric name -> sanitised name, warned once each
        self._closed = False

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        import_sdk(type(self))
        from mlflow.tracking import MlflowClient

        with _translate(f"open an MLflow run at {self.tracking_uri}"):
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            if resume:
                self.run_id = resume["run_id"]
                self._client.update_run(self.run_id, status="RUNNING")
            elif self.settings.get("run_id"):
                self.run_id = self.settings["run_id"]
                self._client.update_run(self.run_id, status="RUNNING")
                self._log_params(existing=self._client.get_run(self.run_id).data.params)
            else:
                experiment_id = self._experiment_id(self.run.project)
                tags = {"tracklane.run_id": self.run.run_id} if self.run.run_id else None
                created = self._client.create_run(experiment_id, run_name=self.run.experiment, tags=tags)
                self.run_id = created.info.run_id
                self._log_params(existing={})
        return {"run_id": self.run_id}

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self._client.create_experiment(name)
        except MlflowException:  # created by another process meanwhile
            experiment = self._client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _log_params(self, existing: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        params = []
        for key, value in flatten_params(self.run.params).items():
            name, text = mlflow_key(key), str(value)
            if len(text) > MAX_PARAM_VALUE_LENGTH:
                text = text[:MAX_PARAM_VALUE_LENGTH]
                self.params_truncated += 1
            if name in existing:  # attached run: MLflow params are write-once
                if existing[name] != text:
                    log.warning("mlflow: run %s already has param %r = %r; keeping it, not %r",
                                self.run_id, name, existing[name][:100], text[:100])
                continue
            params.append(Param(name, text))
        if self.params_truncated:
            log.warning("mlflow: %d param value(s) cut to %d characters", self.params_truncated,
                        MAX_PARAM_VALUE_LENGTH)
        for start in range(0, len(params), MAX_PARAMS_PER_REQUEST):
            self._client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_PER_REQUEST],
                                   synchronous=True)

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        from mlflow.entities import Metric

        metrics = []
        for record in records:
            timestamp = int(record.time * 1000)
            for key, value in record.values.items():
                metrics.append(Metric(self._key(key), float(value), timestamp, record.step))
        with _translate(f"log metrics to MLflow run {self.run_id}"):
            for start in range(0, len(metrics), MAX_METRICS_PER_REQUEST):
                self._client.log_batch(self.run_id, metrics=metrics[start:start + MAX_METRICS_PER_REQUEST],
                                       synchronous=True)

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


@contextlib.contextmanager
def _translate(action: str) -> Iterator[None]:
    """Re-raise an MLflow SDK error as ``SinkError`` saying what was attempted."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        raise SinkError(f"could not {action}: {exc}") from exc
