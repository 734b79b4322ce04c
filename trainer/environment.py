"""Embedded tracker defaults (offline, everything under ``tracklane_runs/``) and the end-of-run summary."""

from __future__ import annotations

import os

from tracklane import PipelineReport

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


# Where each kind the main job logs shows up in each tracker's own viewer.
WHERE_TO_LOOK = {
    "console": "Console: a compact line a step (the headline figures), every key each 10th step",
    "tensorboard": "TensorBoard: Scalars, Histograms (gradients, weights, scores), Images (actor/kl_heatmap), "
                   "Text (rollout/samples, rollout/trajectories, val/generations, the params); no artifacts",
    "wandb": "wandb (after `wandb sync`): Charts (scalars, histograms, actor/kl_heatmap), Tables (rollout/trajectories, "
             "rollout/samples, val/generations), Artifacts (checkpoint:v0, v1..., config)",
    "mlflow": "MLflow UI: Metrics (scalars, histogram summaries), Artifacts (images/, text/, trajectories/, "
              "generations/, histograms/, checkpoint/, config/)",
    "swanlab": "SwanLab: Charts (scalars, histograms as bars, images, text, tables), Files (checkpoint, config)",
    "file": "the JSON-lines file; beside it _rollouts/, _generations/ and _media/ (images, text, histograms.jsonl, "
            "artifacts)",
    "trackio": "trackio: Metrics, Histograms, Images, Markdown, Traces (messages, tool calls), Artifacts",
    "clearml": "ClearML (import the offline session): Scalars, Plots (histograms, tables), Debug Samples (images, "
               "text), Artifacts",
}


def where_summary(report: PipelineReport) -> str:
    """Two lines per tracker: where it wrote and the command that shows it (the sinks' own words), then where to
    look there for each kind."""
    lines = ["Where each tracker wrote:"]
    for lane in report.lanes.values():
        lines.append(f"  {lane.where or lane.name}")
        if lane.name in WHERE_TO_LOOK:
            lines.append(f"    {WHERE_TO_LOOK[lane.name]}")
    return "\n".join(lines)
