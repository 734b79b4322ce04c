"""Count what each tracker actually stored, read back from its own files or server.

One reader per tracker, each returning ``{"scalars": (step, key) points, "trajectories": rows,
"generations": validation steps}``. Only the kinds a run logged are compared. The pipeline's
own ``tracklane/*`` health metrics are left out: they were not logged by the benchmark.
Console output cannot be read back; its count comes from the pipeline's report instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TRAJ_KEY, GEN_KEY = "rollout/trajectories", "val/generations"


@dataclass(frozen=True, slots=True)
class RunPlace:
    """Where one benchmark run's trackers wrote (each run has folders of its own)."""

    root: Path
    project: str
    experiment: str
    mlflow_uri: str

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    @property
    def swanlog(self) -> Path:
        return self.root / "swanlog"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def file(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def rollout_dump(self) -> Path:
        return self.root / "rollout_dump"


def _user(points) -> int:
    return sum(1 for _, key, _ in points if not key.startswith(("tracklane/", "tracklane_")))


def _wandb(place: RunPlace) -> dict[str, int]:
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_media, read_wandb_run

    media = read_wandb_media(place.wandb)
    rows = media.table_rows(TRAJ_KEY) if media.of(TRAJ_KEY) else {}
    return {"scalars": _user(read_wandb_run(place.wandb).points),
            "trajectories": sum(len(r) for r in rows.values()), "generations": len(media.of(GEN_KEY))}


def _swanlab(place: RunPlace) -> dict[str, int]:
    from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_media, read_swanlab_run

    media = read_swanlab_media(place.swanlog)
    tables = media.tables(TRAJ_KEY) if media.of(TRAJ_KEY) else {}
    return {"scalars": _user(read_swanlab_run(place.swanlog).points),
            "trajectories": sum(len(rows) for _, rows in tables.values()), "generations": len(media.of(GEN_KEY))}


def _mlflow(place: RunPlace) -> dict[str, int]:
    from tracklane.workers.testing.readers.mlflow_reader import (
        find_mlflow_run_ids,
        list_mlflow_artifacts,
        read_mlflow_run,
        read_mlflow_steps,
    )

    [run_id] = find_mlflow_run_ids(place.mlflow_uri, place.project, place.experiment)
    files = list_mlflow_artifacts(place.mlflow_uri, run_id)
    # tracklane: generations/<key>/step_N.json; verl: val_stepN.json at the root.
    generations = [f for f in files if f.startswith("generations/") or re.fullmatch(r"val_step\d+\.json", f)]
    trajectories = 0
    if any(f.startswith("trajectories/") for f in files):
        steps = read_mlflow_steps(place.mlflow_uri, run_id, "trajectories/" + TRAJ_KEY.replace("/", "~"))
        trajectories = sum(len(content["trajectories"]) for content in steps.values())
    return {"scalars": _user(read_mlflow_run(place.mlflow_uri, run_id).points),
            "trajectories": trajectories, "generations": len(generations)}


def _tensorboard(place: RunPlace) -> dict[str, int]:
    from tracklane.workers.testing.readers.tensorboard_reader import (
        parse_markdown_table,
        read_tensorboard_dir,
        read_tensorboard_rich,
    )

    texts = read_tensorboard_rich(place.tensorboard).texts
    tables = texts.get(f"{TRAJ_KEY}/text_summary", {})
    return {"scalars": _user(read_tensorboard_dir(place.tensorboard).points),
            "trajectories": sum(len(parse_markdown_table(md)) for mds in tables.values() for md in mds),
            "generations": len(texts.get(f"{GEN_KEY}/text_summary", {}))}


def _file(place: RunPlace) -> dict[str, int]:
    scalars = 0
    with open(place.file, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if row.get("step") is not None:
                scalars += sum(1 for key in row["data"] if not key.startswith("tracklane/"))
    base = place.file.with_suffix("")
    rollouts = Path(f"{base}_rollouts")
    return {"scalars": scalars, "trajectories": _lines(rollouts.glob("*.jsonl")),
            "generations": len(list(Path(f"{base}_generations").glob("*.jsonl")))}


def _rollout_dump(place: RunPlace) -> dict[str, int]:
    """verl's own path for trajectories: a JSON-lines dump per step (its trainer.rollout_data_dir)."""
    return {"scalars": 0, "trajectories": _lines(place.rollout_dump.glob("*.jsonl")), "generations": 0}


def _lines(paths) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += sum(1 for _ in f)
    return total


READERS: dict[str, Callable[[RunPlace], dict[str, int]]] = {
    "wandb": _wandb, "swanlab": _swanlab, "mlflow": _mlflow, "tensorboard": _tensorboard, "file": _file,
    "rollout_dump": _rollout_dump,
}


def read_back(tracker: str, place: RunPlace) -> dict[str, int] | str:
    """What ``tracker`` stored for this run, or why it could not be read."""
    reader = READERS.get(tracker)
    if reader is None:
        return "no reader (output only on stdout)"
    try:
        return reader(place)
    except Exception as exc:  # a missing run is a result to report, not a crash of the benchmark
        return f"read failed: {type(exc).__name__}: {str(exc)[:160]}"
