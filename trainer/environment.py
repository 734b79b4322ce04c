"""Embedded tracker defaults (offline, everything under ``tracklane_runs/``) and the end-of-run summary."""

from __future__ import annotations

import os

from pipeline import PipelineReport

OUT = "tracklane_runs"


def offline_environment(project: str, experiment: str, out: str = OUT) -> None:
    """No server, no account, no network: wandb and SwanLab offline, MLflow on sqlite, trackio's local store,
    ClearML offline; a user's own settings win."""
    out = os.path.abspath(out)
    defaults = {
        "WANDB_MODE": "offline", "WANDB_DIR": f"{out}/wandb", "WANDB_SILENT": "true",
        "SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": f"{out}/swanlog",
        "MLFLOW_TRACKING_URI": f"sqlite:///{out}/mlruns.db",
        "TENSORBOARD_DIR": f"{out}/tensorboard/{project}/{experiment}",
        "VERL_FILE_LOGGER_PATH": f"{out}/{project}/{experiment}.jsonl",
        "TRACKIO_DIR": f"{out}/trackio",
        "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": f"{out}/clearml",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)


def where_summary(report: PipelineReport) -> str:
    """One line per tracker: where it wrote and the command that shows it (the sinks' own words)."""
    lines = ["Where each tracker wrote:"]
    lines += [f"  {lane.where or lane.name}" for lane in report.lanes.values()]
    return "\n".join(lines)
