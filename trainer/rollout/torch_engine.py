"""The default rollout engine: batched sampling from the policy itself, with a KV cache (CPU or CUDA)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..model import GPT, KVCache, attention_mask, positions_of
from .base import Rollout, left_pad, per_prompt, response_mask


class TorchRollout:
    def __init__(self, model: GPT, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def sync_weights(self) -> None:
        """Nothing to do: this engine samples from the training model's own parameters."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int | Sequence[int], temperature: float,
                 stop_ids: Sequence[int] = ()) -> Rollout:
        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        stops = torch.tensor([tok.EOS, *stop_ids], device=device)
        ids, valid = left_pad([p for p in prompts for _ in range(n)], tok.PAD, device)
        batch, width = ids.shape
        limits = torch.tensor([m for m in per_prompt(max_new_tokens, len(prompts)) for _ in range(n)], device=device)
        max_new_tokens = int(limits.max())
        was_training = model.training
        model.eval()
        cache = KVCache(model, batch, width + max_new_tokens)
        key_valid = torch.cat([valid, torch.ones(batch, max_new_tokens, dtype=torch.bool, device=device)], 1)
        positions = positions_of(valid)
        hidden = model(ids, positions, attention_mask(valid, 0, width), cache)
        next_pos = positions[:, -1:] + 1
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens, logprobs = [], []
        for t in range(max_new_tokens):
            token, logp = _sample(model.logits(hidden[:, -1]), temperature)
            token = token.masked_fill(done, tok.PAD)
            tokens.append(token)
            logprobs.append(logp.masked_fill(done, 0.0))
            done |= torch.isin(token, stops) | (t + 1 >= limits)
            if done.all() or t == max_new_tokens - 1:
                break
            mask = attention_mask(key_valid[:, :width + t + 1], width + t, 1)
            hidden = model(token[:, None], next_pos, mask, cache)
            next_pos = next_pos + (~done)[:, None]  # a finished row stays put: its position never passes the model's
        model.train(was_training)
        responses = torch.full((batch, max_new_tokens), tok.PAD, dtype=torch.long, device=device)
        responses[:, :len(tokens)] = torch.stack(tokens, 1)
        lp = torch.zeros(batch, max_new_tokens, device=device)
        lp[:, :len(tokens)] = torch.stack(logprobs, 1)
        mask = response_mask(responses, [tok.EOS, *stop_ids], limits)
        return Rollout(prompts=ids, prompt_valid=valid, responses=responses, response_mask=mask,
                       logprobs=lp * mask, n=n)


def _sample(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A token per row (greedy at temperature 0) and its log-probability under the scaled distribution."""
    if temperature == 0:
        logp = torch.log_softmax(logits.float(), -1)
        token = logp.argmax(-1)
    else:
        logp = torch.log_softmax(logits.float() / temperature, -1)
        token = torch.multinomial(logp.exp(), 1).squeeze(-1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)
