"""Supervised warm-up on the task's teacher responses, so RL starts from a policy that earns some reward."""

from __future__ import annotations

import torch

from .batch import Batch, log_probs
from .config import WarmupConfig
from .model import GPT
from .rollout import Rollout, left_pad
from .task import Task


def teacher_batch(task: Task, count: int, tool_call_rate: float, device: torch.device) -> Batch:
    """Sampled problems with the teacher's responses; the loss sees the tokens the teacher marks (not a tool's)."""
    problems = task.sample(count)
    tok = task.tokenizer
    prompts, prompt_valid = left_pad([task.prompt_ids(p) for p in problems], tok.PAD, device)
    taught = [task.teacher(p, use_tool=bool(task.stop_ids) and task.rng.random() < tool_call_rate) for p in problems]
    width = max(len(ids) for ids, _ in taught)
    responses = torch.tensor([ids + [tok.PAD] * (width - len(ids)) for ids, _ in taught], device=device)
    mask = torch.tensor([[float(m) for m in seen] + [0.0] * (width - len(seen)) for _, seen in taught], device=device)
    rollout = Rollout(prompts=prompts, prompt_valid=prompt_valid, responses=responses, response_mask=mask,
                      logprobs=torch.zeros_like(mask), n=1)
    return Batch.from_rollout(rollout)


def warm_up(model: GPT, task: Task, cfg: WarmupConfig, device: torch.device) -> list[float]:
    """``cfg.steps`` AdamW steps of cross-entropy on the teacher's tokens; returns the loss curve."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(cfg.steps):
        batch = teacher_batch(task, cfg.batch_size, cfg.tool_call_rate, device)
        logp, _ = log_probs(model, batch, temperature=1.0)
        loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses
