"""Read an MLflow run back through ``MlflowClient``: metric points, params, status, artifacts."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tracklane.workers.sources.mlflow import IMAGE_FILE
from tracklane.workers.testing.readers import ReadBack


def read_mlflow_run(tracking_uri: str, run_id: str) -> ReadBack:
    """Every stored occurrence of every metric (duplicates kept), the params and the run status."""
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    points: list[tuple[int, str, float]] = []
    for key in sorted(run.data.metrics):
        history = client.get_metric_history(run_id, key)
        points += [(m.step, m.key, m.value) for m in sorted(history, key=lambda m: (m.step, m.timestamp))]
    return ReadBack(points=points, params=dict(run.data.params), status=run.info.status)


def find_mlflow_run_ids(tracking_uri: str, project: str, run_name: str) -> list[str]:
    """Ids of the runs named ``run_name`` in the experiment named ``project``, oldest first."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(project)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{run_name}'",
                              order_by=["attributes.start_time ASC"])
    return [run.info.run_id for run in runs]


def list_mlflow_artifacts(tracking_uri: str, run_id: str, path: str | None = None) -> list[str]:
    """Every artifact file of the run under ``path`` (recursively), as run-relative paths, sorted."""
    client = MlflowClient(tracking_uri=tracking_uri)
    files: list[str] = []
    folders = [path]
    while folders:
        for info in client.list_artifacts(run_id, folders.pop()):
            (folders if info.is_dir else files).append(info.path)
    return sorted(files)


def read_mlflow_artifact(tracking_uri: str, run_id: str, path: str) -> bytes:
    """The bytes of one artifact file, downloaded."""
    with tempfile.TemporaryDirectory() as tmp:
        local = MlflowClient(tracking_uri=tracking_uri).download_artifacts(run_id, path, tmp)
        return Path(local).read_bytes()


def read_mlflow_artifact_dir(tracking_uri: str, run_id: str, path: str) -> dict[str, bytes]:
    """Every file under an artifact folder, downloaded in one call: run-relative path -> bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        MlflowClient(tracking_uri=tracking_uri).download_artifacts(run_id, path, tmp)
        root = Path(tmp)
        return {str(file.relative_to(root)): file.read_bytes() for file in sorted(root.rglob("*")) if file.is_file()}


def read_mlflow_steps(tracking_uri: str, run_id: str, folder: str) -> dict[int, Any]:
    """The ``step_<step>.json`` / ``.txt`` files of a folder: step -> parsed JSON, or text."""
    out = {}
    for path, data in read_mlflow_artifact_dir(tracking_uri, run_id, folder).items():
        match = re.fullmatch(r".*/step_(-?\d+)\.(json|txt)", path)
        if match:
            text = data.decode("utf-8")
            out[int(match[1])] = json.loads(text) if match[2] == "json" else text
    return out



def read_mlflow_images(tracking_uri: str, run_id: str) -> dict[str, dict[int, list[bytes]]]:
    """Images logged with ``log_image(key=, step=)``: key ("/" as "~") -> step -> PNG bytes, thumbnails left out."""
    out: dict[str, dict[int, list[bytes]]] = {}
    for path, data in read_mlflow_artifact_dir(tracking_uri, run_id, "images").items():
        match = IMAGE_FILE.fullmatch(path)
        if match:
            out.setdefault(match[1], {}).setdefault(int(match[2]), []).append(data)
    return out
