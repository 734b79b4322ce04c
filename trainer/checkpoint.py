"""Checkpoints in verl's layout: ``{dir}/global_step_{N}/trainer_state.pt`` and ``latest_checkpointed_iteration.txt``."""

from __future__ import annotations

import os
from typing import Any

import torch

LATEST = "latest_checkpointed_iteration.txt"
STATE = "trainer_state.pt"


def save_checkpoint(directory: str, step: int, state: dict[str, Any]) -> str:
    """Write the state (atomically), then point the latest marker at it; returns the step's folder."""
    folder = os.path.join(directory, f"global_step_{step}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, STATE)
    torch.save({**state, "step": step}, path + ".tmp")
    os.replace(path + ".tmp", path)
    with open(os.path.join(directory, LATEST + ".tmp"), "w") as handle:
        handle.write(str(step))
    os.replace(os.path.join(directory, LATEST + ".tmp"), os.path.join(directory, LATEST))
    return folder


def latest_checkpoint(directory: str) -> str | None:
    """The folder the latest marker names, or None when there is none."""
    try:
        with open(os.path.join(directory, LATEST)) as handle:
            step = int(handle.read().strip())
    except (FileNotFoundError, ValueError):
        return None
    folder = os.path.join(directory, f"global_step_{step}")
    return folder if os.path.exists(os.path.join(folder, STATE)) else None


def load_checkpoint(folder: str, device: torch.device) -> dict[str, Any]:
    path = os.path.join(folder, STATE) if os.path.isdir(folder) else folder
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location=device, weights_only=True)
