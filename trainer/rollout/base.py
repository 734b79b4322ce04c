"""What every rollout engine returns, and the small protocol it implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class RolloutUnavailable(RuntimeError):
    """The engine cannot run here (a missing package or device); the message says what to do."""


@dataclass(kw_only=True)
class Rollout:
    """``n`` responses per prompt, grouped: row ``i * n + j`` is sample ``j`` of prompt ``i``."""

    prompts: torch.Tensor
    """[N, P] prompt ids, left-padded."""
    prompt_valid: torch.Tensor
    """[N, P] True on real prompt tokens."""
    responses: torch.Tensor
    """[N, R] sampled ids, padded after the end token."""
    response_mask: torch.Tensor
    """[N, R] 1.0 on response tokens up to and including the end token."""
    logprobs: torch.Tensor
    """[N, R] log-probabilities of the sampled tokens under the engine (0 on padding)."""
    n: int

    @property
    def prompt_lengths(self) -> torch.Tensor:
        return self.prompt_valid.sum(-1)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float) -> Rollout:
        """Sample ``n`` responses for each prompt; temperature 0 is greedy."""

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights."""


def left_pad(sequences: list[list[int]], pad: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[N, max_len] ids padded on the left, and the mask of real tokens."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
    return ids.to(device), (ids != pad).to(device)


def response_mask(responses: torch.Tensor, eos: int) -> torch.Tensor:
    """1.0 on tokens up to and including the first end token (all of them when there is none)."""
    is_eos = (responses == eos).long()
    before_or_at = (is_eos.cumsum(-1) - is_eos) == 0
    return before_or_at.float()
