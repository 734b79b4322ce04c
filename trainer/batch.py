"""A rollout as one training batch: prompt + response sequences, and the model passes over them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

import torch

from .model import GPT, attention_mask, positions_of
from .rollout import Rollout


@dataclass(kw_only=True)
class Batch:
    input_ids: torch.Tensor
    """[N, P + R] left-padded prompt then response."""
    key_valid: torch.Tensor
    positions: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    """[N, R] 1.0 on the policy's tokens (what the losses see)."""
    response_valid: torch.Tensor
    """[N, R] True on every real response token, tool replies included."""
    prompt_width: int

    @classmethod
    def from_rollout(cls, rollout: Rollout) -> Batch:
        key_valid = torch.cat([rollout.prompt_valid, torch.ones_like(rollout.responses, dtype=torch.bool)], 1)
        return cls(input_ids=torch.cat([rollout.prompts, rollout.responses], 1), key_valid=key_valid,
                   positions=positions_of(key_valid), responses=rollout.responses,
                   response_mask=rollout.response_mask, response_valid=rollout.valid, prompt_width=rollout.prompts.shape[1])

    def rows(self, index: slice | torch.Tensor) -> Batch:
        return Batch(input_ids=self.input_ids[index], key_valid=self.key_valid[index], positions=self.positions[index],
                     responses=self.responses[index], response_mask=self.response_mask[index],
                     response_valid=self.response_valid[index], prompt_width=self.prompt_width)

    @property
    def num_tokens(self) -> int:
        return int(self.key_valid[:, :self.prompt_width].sum() + self.response_valid.sum())


def response_hidden(model: GPT, batch: Batch) -> torch.Tensor:
    """[N, R, C]: the hidden state that predicts each response token (the position before it)."""
    mask = attention_mask(batch.key_valid, 0, batch.input_ids.shape[1])
    hidden = model(batch.input_ids, batch.positions, mask)
    return hidden[:, batch.prompt_width - 1:-1]


@overload
def log_probs(model: GPT, batch: Batch, temperature: float, with_entropy: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]:
    ...


@overload
def log_probs(model: GPT, batch: Batch, temperature: float, with_entropy: Literal[False] = ...) -> tuple[torch.Tensor, None]:
    ...


def log_probs(model: GPT, batch: Batch, temperature: float, with_entropy: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens (and per-token entropy) at the sampling temperature."""
    logits = model.logits(response_hidden(model, batch)).float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, batch.responses[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


def values(critic: GPT, batch: Batch) -> torch.Tensor:
    """[N, R] the critic's value of the state before each response token."""
    return critic.values(response_hidden(critic, batch))
