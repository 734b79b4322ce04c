"""Supervised warm-up on the task's correct answers, so RL starts from a policy that earns some reward."""

from __future__ import annotations

import torch

from .batch import Batch, log_probs
from .config import WarmupConfig
from .model import GPT
from .rollout import Rollout, left_pad
from .rollout.base import response_mask
from .task import AdditionTask


def teacher_batch(task: AdditionTask, count: int, device: torch.device) -> Batch:
    """Sampled problems with their exact answers as responses."""
    problems = task.sample(count)
    tok = task.tokenizer
    prompts, prompt_valid = left_pad([task.prompt_ids(p) for p in problems], tok.PAD, device)
    answers = [task.answer_ids(p) for p in problems]
    width = max(map(len, answers))
    responses = torch.tensor([a + [tok.PAD] * (width - len(a)) for a in answers], device=device)
    rollout = Rollout(prompts=prompts, prompt_valid=prompt_valid, responses=responses,
                      response_mask=response_mask(responses, tok.EOS), logprobs=torch.zeros_like(responses, dtype=torch.float),
                      n=1)
    return Batch.from_rollout(rollout)


def warm_up(model: GPT, task: AdditionTask, cfg: WarmupConfig, device: torch.device) -> list[float]:
    """``cfg.steps`` AdamW steps of cross-entropy on the answers; returns the loss curve."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(cfg.steps):
        batch = teacher_batch(task, cfg.batch_size, device)
        logp, _ = log_probs(model, batch, temperature=1.0)
        loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses
