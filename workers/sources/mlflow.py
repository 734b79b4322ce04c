"""MLflow: one run read through ``MlflowClient`` (mlflow 3.17): params, every metric point, the artifacts.

Metric history keeps each point's step and timestamp (ms): both are carried (``time`` = timestamp / 1000; mlflow's
int -> float -> int round trip is exact: 0 of 100,000 random 2020-2030 timestamps changed). Artifacts are
downloaded once into the source's scratch folder and read in tracklane's layout (workers/sinks/mlflow.py):

    generations/<key>/step_<N>.json    -> Generations      trajectories/<key>/step_<N>.json -> Trajectories
    histograms/<name>/step_<N>.json    -> Histogram (bins, counts; mean/std/min/max from its summary metrics,
                                          which are then not carried as scalars: the target's sink makes them)
    text/<name>/step_<N>.txt           -> Text
    images/<key>+step+<N>+timestamp+<ms>+<uuid>.png -> Image (MLflow's own ``log_image`` layout, fluent or
                                          client; its ``+compressed.webp`` thumbnails are MLflow's, not data)
    any other file                     -> Artifact: ``<type>/<name>/step_<N>/<file>`` as tracklane writes them
                                          (``<type>/<name>/<file>``, written before versions: step 0), else type
                                          "artifact" and name the first folder (or the file's name), step 0

In folder names "~" stands for "/" (as ``log_image`` writes keys). MLflow keeps no time for an artifact: those
records get the run's start time, except histograms (their summary metrics' time) and images (in the name).
Strict JSON wrote NaN as null: a null score or reward is read as NaN.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from tracklane.core.errors import ConfigError
from tracklane.core.records import Artifact, Generations, Histogram, Image, Record, RunSpec, Text, Trajectories
from tracklane.host.sink import import_sdk
from tracklane.host.source import Source, SourceRun, option
from tracklane.workers.sinks.mlflow import DEFAULT_TRACKING_URI, absolute_tracking_uri, mlflow_key
from tracklane.workers.sources.shaping import (
    Point,
    artifact_step,
    binned_histogram,
    in_step_order,
    metrics_records,
    png,
    score,
    trajectory,
)

DOUBLE_MAX = 1.7976931348623157e308
"""What MLflow stores for +-Inf."""
HISTOGRAM_STATS = ("mean", "std", "min", "max", "count")
_STEP_FILE = re.compile(r"(generations|trajectories|histograms|text)/([^/]+)/step_(-?\d+)\.(json|txt)")
IMAGE_FILE = re.compile(r"images/(.+)\+step\+(-?\d+)\+timestamp\+(\d+)\+[0-9a-f-]+\.png")  # key, step, ms
_THUMBNAIL = re.compile(r"images/.+\+compressed\.webp")
_IMAGE_KEY = re.compile(r"[^a-zA-Z0-9_\-./ ]")  # MlflowClient.log_image's rule for a key


class MlflowSource(Source):
    name = "mlflow"
    sdk_module = "mlflow"
    extra = "mlflow"
    value_note = "+-Inf as +-1.797e308, as MLflow stores them"

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        super().__init__()
        self.tracking_uri = absolute_tracking_uri(tracking_uri)
        self.run_id = run_id
        self._client: Any = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> MlflowSource:
        uri = options.get("tracking_uri") or env.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        return cls(uri, option(options, "run_id", cls.name))

    @classmethod
    def of_target(cls, settings: Mapping[str, Any], run: RunSpec) -> MlflowSource:
        """The run the MLflow sink attached to (MLFLOW_RUN_ID) or created (tagged with the run id)."""
        source = cls(settings["tracking_uri"], str(settings.get("run_id") or ""))
        if not source.run_id:
            source.run_id = source._tagged_run(run)
        return source

    def _tagged_run(self, run: RunSpec) -> str:
        client = self._mlflow()
        experiment = client.get_experiment_by_name(run.project)
        found = client.search_runs([experiment.experiment_id], max_results=1,
                                   filter_string=f"tags.`tracklane.run_id` = '{run.run_id}'") if experiment else []
        if not found:
            raise ConfigError(f"no MLflow run tagged tracklane.run_id={run.run_id} in experiment {run.project!r} "
                              f"at {self.tracking_uri}")
        return str(found[0].info.run_id)

    def _mlflow(self) -> Any:
        if self._client is None:
            import_sdk(type(self))
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _run(self) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self._mlflow().get_run(self.run_id)
        except MlflowException as exc:
            raise ConfigError(f"cannot read MLflow run {self.run_id} at {self.tracking_uri}: {exc}") from exc

    def run(self) -> SourceRun:
        run = self._run()
        experiment = self._mlflow().get_experiment(run.info.experiment_id)
        return SourceRun(project=experiment.name, experiment=run.info.run_name or self.run_id,
                         params=dict(run.data.params), run_id=self.run_id,
                         where=f"mlflow run {self.run_id} at {self.tracking_uri}")

    def records(self) -> Iterator[Record]:
        run = self._run()
        start = run.info.start_time / 1000 if run.info.start_time else 0.0
        history = {key: self._mlflow().get_metric_history(self.run_id, key) for key in sorted(run.data.metrics)}
        rich = list(self._artifact_records(start, history))
        derived = {(mlflow_key(f"{r.name}/{stat}"), r.step) for r in rich if isinstance(r, Histogram)
                   for stat in HISTOGRAM_STATS}
        points: list[Point] = [(m.step, m.timestamp / 1000, key, m.value) for key, metrics in history.items()
                               for m in metrics if (key, m.step) not in derived]
        return iter(in_step_order([*metrics_records(points), *rich]))

    # -- artifacts ---------------------------------------------------------------------------
    def _artifact_records(self, start: float, history: Mapping[str, list[Any]]) -> Iterator[Record]:
        root = self._download()
        for folder, _dirs, files in sorted(os.walk(root)):
            for file_name in sorted(files):
                local = os.path.join(folder, file_name)
                path = os.path.relpath(local, root).replace(os.sep, "/")
                record = self._record(path, local, start, history)
                if record is not None:
                    yield record

    def _download(self) -> str:
        root = os.path.join(self.scratch(), "artifacts")
        os.makedirs(root, exist_ok=True)
        if self._mlflow().list_artifacts(self.run_id):
            self._mlflow().download_artifacts(self.run_id, "", root)
        return root

    def _record(self, path: str, local: str, start: float, history: Mapping[str, list[Any]]) -> Record | None:
        match = _STEP_FILE.fullmatch(path)
        if match:
            kind, folder, step = match[1], match[2].replace("~", "/"), int(match[3])
            with open(local, encoding="utf-8") as handle:
                content = handle.read()
            return _step_record(kind, folder, step, content, start, history)
        match = IMAGE_FILE.fullmatch(path)
        if match:
            with open(local, "rb") as handle:
                data = png(handle.read())
            return Image(step=int(match[2]), name=match[1].replace("~", "/"), png=data, time=int(match[3]) / 1000)
        if _THUMBNAIL.fullmatch(path):
            return None
        parts = path.split("/")
        if len(parts) < 3:
            return Artifact(step=0, path=local, name=parts[0].replace("~", "/"), type="artifact", time=start)
        return Artifact(step=artifact_step(parts[2] if len(parts) >= 4 else None), path=local,
                        name=parts[1].replace("~", "/"), type=parts[0].replace("~", "/"), time=start)

    # -- how MLflow stores what the MLflow sink hands it ---------------------------------------
    @classmethod
    def stored_key(cls, key: str) -> str:
        return mlflow_key(key)

    @classmethod
    def stored_value(cls, value: float) -> float:
        return math.copysign(DOUBLE_MAX, value) if math.isinf(value) else value

    @classmethod
    def stored_as(cls, kind: str) -> str | None:
        return kind

    @classmethod
    def stored_name(cls, kind: str, name: str) -> str:
        if kind in ("histogram", "trajectories"):  # the JSON holds the name as it was
            return name
        if kind == "image":
            return _IMAGE_KEY.sub("_", mlflow_key(name))
        return mlflow_key(name)


def _step_record(kind: str, folder: str, step: int, content: str, start: float, history: Mapping[str, list[Any]]) -> Record:
    if kind == "text":
        return Text(step=step, name=folder, text=content, time=start)
    data = json.loads(content)
    if kind == "generations":
        samples = [[str(row.get("input", "")), str(row.get("output", "")), score(row.get("score"))] for row in data]
        return Generations(step=step, samples=samples, time=start, key=folder)
    if kind == "trajectories":
        return Trajectories(step=step, trajectories=[trajectory(t) for t in data["trajectories"]], time=start,
                            key=str(data.get("key") or folder))
    return _histogram(step, data, start, history)


def _histogram(step: int, data: dict[str, Any], start: float, history: Mapping[str, list[Any]]) -> Histogram:
    name = str(data.get("name") or "")
    stats = {stat: point for stat in HISTOGRAM_STATS
             for point in history.get(mlflow_key(f"{name}/{stat}"), []) if point.step == step}
    nonfinite = data.get("nonfinite") or {}
    return binned_histogram(
        step, stats["count"].timestamp / 1000 if "count" in stats else start, name, data["bin_edges"], data["counts"],
        total=data.get("count"), mean=_stat(stats, "mean"), std=_stat(stats, "std"), minimum=_stat(stats, "min"),
        maximum=_stat(stats, "max"),
        nonfinite=(int(nonfinite.get("nan", 0)), int(nonfinite.get("+inf", 0)), int(nonfinite.get("-inf", 0))))


def _stat(stats: Mapping[str, Any], name: str) -> float | None:
    return float(stats[name].value) if name in stats else None
