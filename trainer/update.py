"""One PPO/GRPO update of the actor (and of the critic under GAE), in mini-batches; returns verl's metrics."""

from __future__ import annotations

from collections import defaultdict

import torch

from . import algos
from .batch import Batch, log_probs, values
from .config import ActorConfig, CriticConfig
from .gradients import GradientProbe
from .model import GPT


def update_actor(actor: GPT, optimizer: torch.optim.Optimizer, batch: Batch, old_logp: torch.Tensor,
                 ref_logp: torch.Tensor | None, advantages: torch.Tensor, cfg: ActorConfig, temperature: float,
                 rows_per_minibatch: int, probe: GradientProbe | None = None, poison: bool = False) -> dict[str, float]:
    """Clipped policy loss + KL loss to the reference - entropy bonus; grad clipping; AdamW. A ``probe`` takes the
    first mini-batch's gradients, before clipping. A mini-batch whose gradient is not finite is not stepped on
    (``actor/skipped_updates`` counts them): its NaN loss and grad norm are logged, the weights stay as they were.
    ``poison``: make every loss of this update NaN (``trainer.inject_nan_step``, to show the health rules)."""
    sums: dict[str, list[float]] = defaultdict(list)
    actor.train()
    for _ in range(cfg.ppo_epochs):
        for start in range(0, batch.input_ids.shape[0], rows_per_minibatch):
            rows = slice(start, start + rows_per_minibatch)
            mb, mask = batch.rows(rows), batch.response_mask[rows]
            logp, entropy = log_probs(actor, mb, temperature, with_entropy=True)
            terms = algos.policy_loss(logp, old_logp[rows], advantages[rows], mask, cfg.clip_ratio, cfg.clip_ratio_c)
            entropy_mean = algos.masked_mean(entropy, mask)
            if poison:
                terms["pg_loss"] = terms["pg_loss"] * float("nan")
            loss = terms["pg_loss"] - cfg.entropy_coeff * entropy_mean
            if cfg.use_kl_loss and ref_logp is not None:
                terms["kl_loss"] = algos.masked_mean(algos.low_var_kl(logp, ref_logp[rows]), mask)
                loss = loss + cfg.kl_loss_coef * terms["kl_loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if probe is not None and probe.wanted:
                probe.capture()
            grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), cfg.grad_clip)
            if torch.isfinite(grad_norm):
                optimizer.step()
            else:  # a NaN or Inf gradient would poison the weights for good
                optimizer.zero_grad(set_to_none=True)
                sums["skipped_updates"].append(1.0)
            for name, value in terms.items():
                sums[name].append(float(value.detach()))
            sums["entropy"].append(float(entropy_mean.detach()))
            sums["grad_norm"].append(float(grad_norm))
    metrics = {f"actor/{name}": sum(v) / len(v) for name, v in sums.items() if name != "skipped_updates"}
    metrics["actor/skipped_updates"] = float(len(sums["skipped_updates"]))
    metrics["actor/kl_coef"] = cfg.kl_loss_coef if cfg.use_kl_loss else 0.0
    metrics["actor/lr"] = optimizer.param_groups[0]["lr"]
    return metrics


def update_critic(critic: GPT, optimizer: torch.optim.Optimizer, batch: Batch, old_values: torch.Tensor,
                  returns: torch.Tensor, cfg: CriticConfig, grad_clip: float, rows_per_minibatch: int,
                  probe: GradientProbe | None = None) -> dict[str, float]:
    """Clipped value loss toward the GAE returns (a ``probe`` takes the first mini-batch's gradients)."""
    sums: dict[str, list[float]] = defaultdict(list)
    critic.train()
    for start in range(0, batch.input_ids.shape[0], rows_per_minibatch):
        rows = slice(start, start + rows_per_minibatch)
        mb, mask = batch.rows(rows), batch.response_mask[rows]
        vpred = values(critic, mb)
        loss, clipfrac = algos.value_loss(vpred, old_values[rows], returns[rows], mask, cfg.cliprange_value)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if probe is not None and probe.wanted:
            probe.capture()
        grad_norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip)
        optimizer.step()
        sums["vf_loss"].append(float(loss.detach()))
        sums["vf_clipfrac"].append(float(clipfrac))
        sums["vpred_mean"].append(float(algos.masked_mean(vpred.detach(), mask)))
        sums["grad_norm"].append(float(grad_norm))
    metrics = {f"critic/{name}": sum(v) / len(v) for name, v in sums.items()}
    metrics["critic/lr"] = optimizer.param_groups[0]["lr"]
    return metrics
