"""The reward of each episode by component, summed into its score; and what is logged of them.

verl's reward managers return a score per sample plus ``reward_extra_info`` (one list per
component); here the task's ``rewards()`` gives the components, the score is their sum, and the
components are logged as ``reward/<component>/mean`` overall and ``reward/<data source>/<component>/mean``
per data source (verl #2115: each sub-reward on its own chart).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from .episode import Episode
from .task import Problem, Task


@dataclass(slots=True)
class Scored:
    components: dict[str, list[float]]
    """Component -> one value per episode."""
    scores: torch.Tensor
    """[N] the sum of the components."""
    sources: list[str]
    """Each episode's data source."""
    exact: list[bool]
    """The answer was exactly right."""


def score_episodes(task: Task, problems: list[Problem], episodes: list[Episode], device: torch.device) -> Scored:
    """``problems[i]`` is episode ``i``'s problem."""
    components: dict[str, list[float]] = {name: [] for name in task.components}
    for problem, episode in zip(problems, episodes, strict=True):
        for name, value in task.rewards(problem, episode).items():
            components[name].append(value)
    totals = np.sum([components[name] for name in task.components], axis=0) if episodes else np.zeros(0)
    exact = [episode.answer(task.tokenizer) == problem.answer for problem, episode in zip(problems, episodes, strict=True)]
    return Scored(components=components, scores=torch.tensor(totals, dtype=torch.float32, device=device),
                  sources=[task.data_source(p) for p in problems], exact=exact)


def reward_metrics(scored: Scored) -> dict[str, float]:
    """reward/<component>/mean, reward/<source>/<component>/mean and reward/<source>/score/mean."""
    metrics = {f"reward/{name}/mean": float(np.mean(values)) for name, values in scored.components.items()}
    rows = rows_by_source(scored.sources)
    for source, where in sorted(rows.items()):
        for name, values in scored.components.items():
            metrics[f"reward/{source}/{name}/mean"] = float(np.mean([values[i] for i in where]))
        metrics[f"reward/{source}/score/mean"] = float(scored.scores[where].mean())
    return metrics


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """verl's multi-turn figures: assistant turns per sample, and tool calls (how many, how many ran)."""
    turns = np.array([len(e.assistant_turns()) for e in episodes], dtype=np.float64)
    calls = np.array([len(e.calls) for e in episodes], dtype=np.float64)
    ran = sum(call.ok for e in episodes for call in e.calls)
    return {"num_turns/mean": float(turns.mean()), "num_turns/max": float(turns.max()),
            "num_turns/min": float(turns.min()), "tool_calls/mean": float(calls.mean()),
            "tool_calls/samples_with_call": float((calls > 0).mean()),
            "tool_calls/success_rate": ran / calls.sum() if calls.sum() else 0.0}


def rows_by_source(sources: list[str]) -> dict[str, list[int]]:
    """Each data source's episode rows."""
    rows: dict[str, list[int]] = defaultdict(list)
    for i, source in enumerate(sources):
        rows[source].append(i)
    return rows


def skewness(values: np.ndarray) -> float:
    """The sample's skewness (the third standardised moment); 0 for a sample with no spread."""
    centred = values - values.mean()
    spread = np.sqrt(np.mean(centred ** 2))
    return float(np.mean(centred ** 3) / spread ** 3) if spread > 0 else 0.0
