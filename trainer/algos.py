"""The RL maths, as plain functions on tensors (verl's core_algos, in small)."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps)


def grpo_advantages(scores: torch.Tensor, n: int, mask: torch.Tensor, norm_by_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """Each score against its group of ``n`` samples of the same prompt, broadcast over the response tokens."""
    groups = scores.view(-1, n)
    centred = groups - groups.mean(-1, keepdim=True)
    if norm_by_std and n > 1:
        centred = centred / (groups.std(-1, keepdim=True) + eps)
    return centred.reshape(-1, 1) * mask


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens; returns (whitened advantages, returns).

    Padding only follows a response, so masked values make every padded delta zero.
    """
    values = values * mask
    last = torch.zeros_like(token_rewards[:, 0])
    advantages = torch.zeros_like(token_rewards)
    width = token_rewards.shape[1]
    for t in reversed(range(width)):
        next_value = values[:, t + 1] if t + 1 < width else torch.zeros_like(last)
        last = token_rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * last
        advantages[:, t] = last
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask) * mask, returns


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip: float, clip_c: float) -> dict[str, torch.Tensor]:
    """PPO's clipped surrogate with dual clip for negative advantages, token-mean aggregated."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + clip)
    losses = torch.maximum(unclipped, clipped)
    lower = (advantages < 0) & (losses > -advantages * clip_c)  # dual clip
    losses = torch.where(lower, -advantages * clip_c, losses)
    return {
        "pg_loss": masked_mean(losses, mask),
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask),
        "pg_clipfrac_lower": masked_mean(lower.float(), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference), clamped as verl does."""
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)


def value_loss(vpred: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (0.5 * the larger squared error) and the fraction of tokens clipped."""
    clipped = old_values + (vpred - old_values).clamp(-cliprange, cliprange)
    unclipped_err, clipped_err = (vpred - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * masked_mean(torch.maximum(unclipped_err, clipped_err), mask), \
        masked_mean((clipped_err > unclipped_err).float(), mask)
