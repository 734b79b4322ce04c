"""A reward for the tiny random model's GSM8K-shaped rows that is not always 0 (verl's gsm8k scorer is, for it):
``reward.custom_reward_function.path`` names this file, ``name`` ``compute_score`` (verl's signature)."""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None,
                  **_kwargs: Any) -> float:
    """1 for the answer after ``####``; otherwise the share of the answer's digits the response holds, halved, so
    a random model's scores spread between 0 and 0.5 and GRPO's groups are rarely flat."""
    if f"#### {ground_truth}" in solution_str:
        return 1.0
    digits = [d for d in ground_truth if d.isdigit()]
    if not digits:
        return 0.0
    return 0.5 * sum(d in solution_str for d in digits) / len(digits)
