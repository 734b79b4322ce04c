"""Validation on the task's fixed problem set: verl's ``val-core``/``val-aux`` metrics and sample rows."""

from __future__ import annotations

from collections import defaultdict

from .config import RolloutConfig
from .rollout import RolloutEngine
from .task import AdditionTask, score


def validate(engine: RolloutEngine, task: AdditionTask, cfg: RolloutConfig, samples: int
             ) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
    """One greedy (by default) answer per problem; returns the metrics and the first ``samples`` rows."""
    problems = task.val_problems
    rollout = engine.generate([task.prompt_ids(p) for p in problems], 1, cfg.response_length, cfg.val_temperature)
    texts = [task.tokenizer.decode(row.tolist()) for row in rollout.responses]
    scores = [score(text, p.answer) for text, p in zip(texts, problems)]
    exact = [float(text == p.answer) for text, p in zip(texts, problems)]
    name = task.name
    metrics = {f"val-core/{name}/acc/mean@1": sum(exact) / len(exact),
               f"val-aux/{name}/score/mean@1": sum(scores) / len(scores),
               f"val-aux/{name}/response_length/mean@1": float(rollout.response_lengths.float().mean())}
    by_digits: dict[int, list[float]] = defaultdict(list)
    for p, hit in zip(problems, exact):
        by_digits[p.digits].append(hit)
    for digits, hits in sorted(by_digits.items()):
        metrics[f"val-aux/{name}_{digits}digit/acc/mean@1"] = sum(hits) / len(hits)
    rows = [(p.prompt, text, s) for p, text, s in zip(problems[:samples], texts, scores)]
    return metrics, rows
