"""How far the rollout engine's token probabilities are from the trainer's (verl's rollout_corr and
rollout_probs_diff families). With the torch engine they agree to float precision; a vLLM engine in
bf16 is where they drift, and these are the figures that show it."""

from __future__ import annotations

import torch

SAFETY_BOUND = 20.0  # clamp on log importance ratios before exp, so one wild token cannot overflow


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def mismatch_metrics(rollout_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Per-token probability gaps, perplexities, KL estimators and chi-squared of the importance weights."""
    mask = mask.float()
    valid = mask.bool()
    rollout_p, train_p = rollout_logp.exp()[valid], old_logp.exp()[valid]
    diff = (rollout_p - train_p).abs()
    metrics = {"training/rollout_probs_diff_max": float(diff.max()),
               "training/rollout_probs_diff_mean": float(diff.mean()),
               "training/rollout_probs_diff_std": float(diff.std()) if diff.numel() > 1 else 0.0,
               "training/rollout_actor_probs_pearson_corr": _pearson(rollout_p, train_p)}

    seq_train, seq_rollout = _masked_mean(old_logp, mask, -1), _masked_mean(rollout_logp, mask, -1)
    log_ppl_diff = seq_rollout - seq_train  # = log(training ppl / rollout ppl) per sequence
    log_ratio = old_logp - rollout_logp  # log importance weight pi_train / pi_rollout per token
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    seq_log_ratio = (log_ratio * mask).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    corr = {"training_ppl": (-seq_train).exp().mean(), "training_log_ppl": (-seq_train).mean(),
            "rollout_ppl": (-seq_rollout).exp().mean(), "rollout_log_ppl": (-seq_rollout).mean(),
            "kl": _masked_mean(rollout_logp - old_logp, mask),
            "k3_kl": _masked_mean(log_ratio.exp() - log_ratio - 1, mask),
            "log_ppl_diff": log_ppl_diff.mean(), "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
            "log_ppl_diff_max": log_ppl_diff.max(), "log_ppl_diff_min": log_ppl_diff.min(),
            "ppl_ratio": log_ppl_diff.exp().mean(),
            "chi2_token": _masked_mean(rho.square(), mask) - 1.0,
            "chi2_seq": (2.0 * seq_log_ratio).exp().mean() - 1.0}
    metrics.update({f"rollout_corr/{name}": float(value) for name, value in corr.items()})
    return metrics


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Correlation of two flat tensors; NaN when either is constant (verl logs NaN there too)."""
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denominator = (a.square().sum() * b.square().sum()).sqrt()
    return float((a * b).sum() / denominator) if float(denominator) > 0 else float("nan")
