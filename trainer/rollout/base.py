"""What every rollout engine returns, and the small protocol it implements."""

from __future__ import annotations

from collections.abc import Sequence
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
    """[N, R] 1.0 on the tokens the policy generated (up to and including each turn's stop token); 0 on padding
    and on what a tool put into the response (verl's response_mask: the loss sees the policy's tokens only)."""
    logprobs: torch.Tensor
    """[N, R] log-probabilities of the sampled tokens under the engine (0 on padding and tool tokens)."""
    n: int
    response_valid: torch.Tensor | None = None
    """[N, R] True on every real response token, the tools' included; None: the same as response_mask."""

    @property
    def prompt_lengths(self) -> torch.Tensor:
        return self.prompt_valid.sum(-1)

    @property
    def valid(self) -> torch.Tensor:
        """[N, R] True on every real response token: ``response_valid``, or the policy's tokens when there is none."""
        return self.response_valid if self.response_valid is not None else self.response_mask.bool()

    @property
    def response_lengths(self) -> torch.Tensor:
        """Real response tokens a row holds, the tools' included (verl's response_length)."""
        return self.valid.sum(-1)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int | Sequence[int], temperature: float,
                 stop_ids: Sequence[int] = ()) -> Rollout:
        """Sample ``n`` responses for each prompt, at most ``max_new_tokens`` tokens (one limit, or one per prompt);
        temperature 0 is greedy. A response ends at the end token or at any of ``stop_ids`` (a tool call's closing
        token), which it keeps."""

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights."""


def left_pad(sequences: list[list[int]], pad: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[N, max_len] ids padded on the left, and the mask of real tokens: by length, not by id (a pad id the policy
    sampled in an earlier turn is part of the next turn's context, as the trainer sees it)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    valid = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        valid[row, width - len(seq):] = True
    return ids.to(device), valid.to(device)


def per_prompt(max_new_tokens: int | Sequence[int], prompts: int) -> list[int]:
    """The token limit of each prompt."""
    limits = [max_new_tokens] * prompts if isinstance(max_new_tokens, int) else [int(m) for m in max_new_tokens]
    if len(limits) != prompts or min(limits, default=1) < 1:
        raise ValueError(f"max_new_tokens must be >= 1 for each of the {prompts} prompts, got {max_new_tokens!r}")
    return limits


def response_mask(responses: torch.Tensor, stop_ids: Sequence[int], limits: torch.Tensor | None = None) -> torch.Tensor:
    """1.0 on tokens up to and including the first stop token (all of them when there is none), within each
    row's limit."""
    is_stop = torch.isin(responses, torch.tensor(list(stop_ids), device=responses.device)).long()
    before_or_at = (is_stop.cumsum(-1) - is_stop) == 0
    if limits is not None:
        before_or_at &= torch.arange(responses.shape[1], device=responses.device) < limits[:, None]
    return before_or_at.float()
