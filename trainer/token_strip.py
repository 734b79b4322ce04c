"""What a logged trajectory carries for ``tracklane view``'s per-token strip: each response token's text, its
log-probability and entropy under the policy that generated it, and the loss mask (1: the policy's token, trained
on; 0: a tool's reply, not).

The figures are those the step computed anyway for the update (``old_log_prob``: ``log_probs`` with entropy), taken
for the few trajectories logged (``trainer.log_rollouts``); nothing is computed again. A trajectory's meta holds
plain values only (the wire's rule), so the strip is one compact JSON string, ``meta["token_strip"]``, rounded to
3 decimals.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

STRIP_KEY = "token_strip"
"""The meta key the viewer reads (pipeline/view/static/app.js)."""


def token_strips(tokenizer: Any, responses: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor,
                 loss_mask: torch.Tensor, valid: torch.Tensor, rows: list[int]) -> dict[int, str]:
    """Row index -> its strip, for ``rows`` of the step's batch (one copy to the CPU for all of them)."""
    picked = torch.tensor(rows, dtype=torch.long, device=responses.device)
    ids, lp, ent, mask, ok = (t.index_select(0, picked).cpu().tolist()
                              for t in (responses, logp, entropy, loss_mask, valid))
    out = {}
    for k, row in enumerate(rows):
        keep = [j for j, v in enumerate(ok[k]) if v]
        out[row] = json.dumps({"tokens": [tokenizer.decode([ids[k][j]]) or "·" for j in keep],
                               "logprob": [_figure(lp[k][j]) for j in keep],
                               "entropy": [_figure(ent[k][j]) for j in keep],
                               "loss_mask": "".join("1" if mask[k][j] else "0" for j in keep)},
                              separators=(",", ":"), ensure_ascii=False)
    return out


def _figure(x: float) -> float | None:
    """Rounded for the page; a non-finite figure as null (strict JSON, which the page parses)."""
    return round(x, 3) if math.isfinite(x) else None
