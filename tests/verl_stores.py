"""What one run left in each tracker, read back through the trackers' own formats, as comparable points.

``RunStores`` names the folders (and the MLflow store) one run writes to, as the environment verl and
tracklane both read, and reads each tracker back into ``Stored``: (step, key) -> value, plus how the run
ended. Used by tests/e2e/test_verl_side_by_side.py to compare verl's own ``Tracking`` with tracklane's, run by
verl's own trainer code; the readers are the ones in ``tracklane.workers.testing.readers`` (wandb's run file,
TensorBoard's event files, MLflow's client, SwanLab's run store, trackio's Api), plus verl's two text
formats (the file logger's JSON lines, the console's ``step:N - key:value`` lines).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACKERS = ("console", "file", "tensorboard", "mlflow", "wandb", "swanlab", "trackio")


@dataclass
class Stored:
    """One tracker's copy of a run."""

    points: dict[tuple[int, str], float] = field(default_factory=dict)
    status: str | None = None
    twice: list[tuple[int, str]] = field(default_factory=list)
    """(step, key) pairs met again after the first time."""

    def add(self, step: int, key: str, value: float) -> None:
        if (step, key) in self.points:
            self.twice.append((step, key))
        self.points[(step, key)] = value


@dataclass
class RunStores:
    """The stores of one run: a folder of its own, the MLflow store and trackio folder shared by key (project)."""

    root: Path
    mlflow_uri: str
    trackio_dir: Path

    def env(self) -> dict[str, str]:
        """The trackers' environment, as verl's Tracking and tracklane's read it."""
        return {
            "VERL_FILE_LOGGER_PATH": str(self.root / "metrics.jsonl"),
            "TENSORBOARD_DIR": str(self.root / "tensorboard"),
            "MLFLOW_TRACKING_URI": self.mlflow_uri,
            "WANDB_MODE": "offline", "WANDB_DIR": str(self.root / "wandb"), "WANDB_SILENT": "true",
            "SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": str(self.root / "swanlog"),
            "TRACKIO_DIR": str(self.trackio_dir),
        }

    def clearml_env(self) -> dict[str, str]:
        """ClearML offline, its sessions in <root>/clearml/offline/<task id>/ (where ``read`` looks), no config file
        read. Apart from ``env()``: a test in this process sets ClearML's own folders (conftest's offline_trackers)."""
        return {"CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": str(self.root / "clearml"),
                "CLEARML_CONFIG_FILE": str(self.root / "clearml.conf")}

    def prepare(self) -> None:
        (self.root / "wandb").mkdir(parents=True, exist_ok=True)

    def read(self, tracker: str, project: str, experiment: str, console: str) -> Stored:
        """What ``tracker`` holds of the run ``project``/``experiment`` (``console``: the run's printed output)."""
        return {
            "console": lambda: console_points(console),
            "file": lambda: file_points(self.root / "metrics.jsonl"),
            "tensorboard": lambda: _readback(_tensorboard(self.root / "tensorboard")),
            "mlflow": lambda: _mlflow(self.mlflow_uri, project, experiment),
            "wandb": lambda: _readback(_wandb(self.root / "wandb")),
            "swanlab": lambda: _readback(_swanlab(self.root / "swanlog", experiment)),
            "trackio": lambda: _readback(_trackio(self.trackio_dir, project, experiment)),
            "clearml": lambda: _readback(_clearml(self.root / "clearml", project)),
        }[tracker]()


def _readback(back: Any) -> Stored:
    out = Stored(status=back.status)
    for step, key, value in back.points:
        out.add(int(step), key, float(value))
    return out


def _tensorboard(folder: Path) -> Any:
    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

    return read_tensorboard_dir(folder)


def _wandb(folder: Path) -> Any:
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

    return read_wandb_run(folder)


def _swanlab(folder: Path, experiment: str) -> Any:
    from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run

    return read_swanlab_run(folder, experiment=experiment)


def _trackio(folder: Path, project: str, experiment: str) -> Any:
    from tracklane.workers.testing.readers.trackio_reader import read_trackio_run

    return read_trackio_run(folder, project, name=experiment)


def _clearml(folder: Path, project: str) -> Any:
    from tracklane.workers.testing.readers.clearml_reader import clearml_sessions, read_clearml_session

    [found] = [session for session in clearml_sessions(folder)
               if json.loads((session / "task.json").read_bytes()).get("project_name") == project]
    return read_clearml_session(found)


def _mlflow(uri: str, project: str, experiment: str) -> Stored:
    from mlflow.tracking import MlflowClient

    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

    ids = find_mlflow_run_ids(uri, project, experiment)
    assert len(ids) == 1, f"expected one MLflow run {project}/{experiment}, found {ids}"
    stored = _readback(read_mlflow_run(uri, ids[0]))
    stored.status = MlflowClient(tracking_uri=uri).get_run(ids[0]).info.status
    return stored


def file_points(path: Path) -> Stored:
    """verl's file logger format: ``{"step": N, "data": {...}}`` lines (a header line of an older tracklane has step
    null). orjson writes NaN as null: read back as NaN."""
    out = Stored()
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["step"] is None:
            continue
        for key, value in record["data"].items():
            if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
                out.add(record["step"], key, math.nan if value is None else float(value))
    return out


_CONSOLE_LINE = re.compile(r"step:(\d+) - (.*)$")
_NUMPY_REPR = re.compile(r"^np\.\w+\((.*)\)$")  # pprint.pformat of a numpy scalar under numpy 2: np.float64(0.25)


def console_points(output: str) -> Stored:
    """verl's console lines (``step:N - key:value - ...``, numbers only), wherever a line carries a prefix."""
    out = Stored()
    for line in output.splitlines():
        match = _CONSOLE_LINE.search(line)
        if not match:
            continue
        step = int(match.group(1))
        for pair in match.group(2).split(" - "):
            key, _, text = pair.rpartition(":")
            text = _NUMPY_REPR.sub(r"\1", text.strip())
            try:
                value = float(text)
            except ValueError:
                continue  # tracklane's one-line summaries of rich records ("val/generations: 2 samples, ...")
            out.add(step, key, value)
    return out
