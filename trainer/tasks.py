"""The built-in tasks by name (``task.name``)."""

from __future__ import annotations

from .config import TaskConfig
from .task import AdditionTask, Task
from .tool_task import ToolAdditionTask

TASKS: dict[str, type[AdditionTask]] = {"addition": AdditionTask, "tool_addition": ToolAdditionTask}


def make_task(cfg: TaskConfig, seed: int) -> Task:
    return TASKS[cfg.name](cfg, seed)
