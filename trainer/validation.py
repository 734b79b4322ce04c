"""Validation on the task's fixed problem set: verl's ``val-core``/``val-aux`` metrics per data source, and rows.

Keys follow verl's ``val-core/{data_source}/acc/mean@1`` and ``val-aux/{data_source}/{var}/mean@1``
(``var``: score, each reward component, num_turns, response_length); the whole set goes under the
task's name as well (``val-core/tool_addition/acc/mean@1``).
"""

from __future__ import annotations

import numpy as np
import torch

from .agent_loop import run_episodes
from .config import RolloutConfig
from .episode import Episode
from .rewards import rows_by_source, score_episodes
from .rollout import RolloutEngine
from .task import Task


def validate(engine: RolloutEngine, task: Task, cfg: RolloutConfig, max_response: int, samples: int,
             device: torch.device) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
    """One greedy (by default) episode per problem; returns the metrics and the first ``samples`` rows."""
    problems = task.val_problems
    out = run_episodes(engine, task, problems, 1, max_response, cfg.val_temperature,
                       cfg.multi_turn.max_assistant_turns, device)
    scored = score_episodes(task, problems, out.episodes, device)
    figures = {"acc": np.array(scored.exact, dtype=np.float64), "score": scored.scores.cpu().numpy(),
               **{name: np.array(values) for name, values in scored.components.items()},
               "num_turns": np.array([len(e.assistant_turns()) for e in out.episodes], dtype=np.float64),
               "response_length": out.rollout.response_lengths.float().cpu().numpy()}
    groups = {task.name: list(range(len(problems))), **dict(sorted(rows_by_source(scored.sources).items()))}
    metrics = {}
    for group, rows in groups.items():
        for var, values in figures.items():
            family = "val-core" if var == "acc" else "val-aux"
            metrics[f"{family}/{group}/{var}/mean@1"] = float(values[rows].mean())
    rows_out = [(p.prompt, transcript(task, e), float(s))
                for p, e, s in zip(problems[:samples], out.episodes, scored.scores.tolist(), strict=False)]
    return metrics, rows_out


def transcript(task: Task, episode: Episode) -> str:
    """The response as one text: each turn and tool reply in order (``<call>37+48</call><tool>85</tool>85``)."""
    return "".join(task.tokenizer.decode(turn.ids) for turn in episode.turns)
