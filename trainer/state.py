"""The models and optimizers of a run, built from the config, and what a checkpoint holds of them."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .config import Config, OptimConfig
from .model import GPT
from .task import Task


def _adamw(model: GPT, cfg: OptimConfig) -> torch.optim.AdamW:
    b1, b2 = cfg.betas  # OptimConfig checks there are two
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(b1, b2))


def set_lr(optimizer: torch.optim.Optimizer, cfg: OptimConfig, step: int) -> None:
    """Linear warm-up over cfg.lr_warmup_steps RL steps (1-based), then constant."""
    scale = min(1.0, step / cfg.lr_warmup_steps) if cfg.lr_warmup_steps > 0 else 1.0
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr * scale


@dataclass
class Models:
    actor: GPT
    ref: GPT
    """The frozen reference policy (the warmed-up actor) for the KL loss."""
    critic: GPT | None
    actor_optim: torch.optim.Optimizer
    critic_optim: torch.optim.Optimizer | None

    @classmethod
    def build(cls, cfg: Config, task: Task, device: torch.device, warmed_up: GPT) -> Models:
        """Reference and critic start from the warmed-up actor (the critic with a fresh value head)."""
        critic = None
        if cfg.algorithm.adv_estimator == "gae":
            critic = GPT(cfg.actor_rollout_ref.model, warmed_up.vocab_size, warmed_up.block_size, value_head=True)
            critic.load_state_dict(warmed_up.state_dict(), strict=False)
            critic.to(device)
        ref = copy.deepcopy(warmed_up).requires_grad_(False).eval()
        return cls(actor=warmed_up, ref=ref, critic=critic, actor_optim=_adamw(warmed_up, cfg.actor_rollout_ref.actor.optim),
                   critic_optim=_adamw(critic, cfg.critic.optim) if critic is not None else None)

    def state_dict(self, task: Task) -> dict[str, Any]:
        state = {"actor": self.actor.state_dict(), "ref": self.ref.state_dict(),
                 "actor_optim": self.actor_optim.state_dict(), "task_rng": task.rng.bit_generator.state,
                 "torch_rng": torch.get_rng_state()}
        if self.critic is not None:
            assert self.critic_optim is not None  # built together with the critic
            state.update(critic=self.critic.state_dict(), critic_optim=self.critic_optim.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any], task: Task) -> None:
        self.actor.load_state_dict(state["actor"])
        self.ref.load_state_dict(state["ref"])
        self.actor_optim.load_state_dict(state["actor_optim"])
        if self.critic is not None:
            if "critic" not in state:
                raise ValueError("the checkpoint has no critic: it was saved with algorithm.adv_estimator=grpo")
            self.critic.load_state_dict(state["critic"])
            assert self.critic_optim is not None  # built together with the critic
            self.critic_optim.load_state_dict(state["critic_optim"])
        task.rng.bit_generator.state = state["task_rng"]
        torch.set_rng_state(state["torch_rng"].cpu())
