"""The per-token KL heatmap: samples x token positions, actor against the reference, as an RGB image.

Each cell is one response token of one sample, coloured by the k3 estimate of KL(actor || reference)
at that token (viridis on a square-root scale, as per-token KL is heavy-tailed: 0 at the dark end,
the image's largest value at the yellow end; the scale bar along the bottom runs over the same range,
and ``actor/kl_heatmap/max`` logs that largest value).
Tokens a tool wrote are grey (the policy did not choose them), padding is white. The trainer hands
the uint8 array to ``log_image``; the PNG encoding happens on the pipeline's shipper thread.
"""

from __future__ import annotations

import numpy as np
import torch

from .algos import low_var_kl

# viridis at 0, 1/4, 1/2, 3/4 and 1 (its published anchor colours), interpolated linearly between them
_ANCHORS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)
TOOL_GREY = (170, 170, 170)
PAD_WHITE = (255, 255, 255)


def colormap(fraction: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> uint8 RGB, shape (..., 3)."""
    scaled = np.clip(fraction, 0.0, 1.0) * (len(_ANCHORS) - 1)
    low = np.minimum(scaled.astype(np.int64), len(_ANCHORS) - 2)
    weight = (scaled - low)[..., None]
    return np.rint(_ANCHORS[low] * (1 - weight) + _ANCHORS[low + 1] * weight).astype(np.uint8)


def kl_heatmap(kl: np.ndarray, policy: np.ndarray, valid: np.ndarray, cell: int = 12, bar: int = 8
               ) -> tuple[np.ndarray, float]:
    """``kl``, ``policy`` (the policy's tokens) and ``valid`` (every real token) are [samples, positions].

    Returns the image (rows of ``cell`` pixels per sample, then a gap and the scale bar) and the value the
    bright end stands for."""
    kl = np.asarray(kl, dtype=np.float64)
    policy, valid = np.asarray(policy, dtype=bool), np.asarray(valid, dtype=bool)
    finite = policy & np.isfinite(kl)
    top = float(kl[finite].max()) if finite.any() else 0.0
    scale = top if top > 0 else 1.0
    cells = np.empty((*kl.shape, 3), dtype=np.uint8)
    cells[:] = PAD_WHITE
    cells[valid & ~policy] = TOOL_GREY
    cells[finite] = colormap(np.sqrt(np.maximum(kl[finite], 0.0) / scale))
    image = np.repeat(np.repeat(cells, cell, axis=0), cell, axis=1)
    width = image.shape[1]
    ramp = colormap(np.sqrt(np.linspace(0.0, 1.0, width)))[None, :, :].repeat(bar, axis=0)
    gap = np.full((max(1, cell // 3), width, 3), 255, dtype=np.uint8)
    return np.concatenate([image, gap, ramp], axis=0), top


def batch_kl_heatmap(old_logp: torch.Tensor, ref_logp: torch.Tensor, policy: torch.Tensor, valid: torch.Tensor,
                     samples: int = 16) -> tuple[np.ndarray, float]:
    """The heatmap of ``samples`` rows spread evenly over a step's batch (rows of one prompt sit together)."""
    rows = np.unique(np.linspace(0, policy.shape[0] - 1, num=min(samples, policy.shape[0])).round().astype(int))
    kl = low_var_kl(old_logp[rows], ref_logp[rows])
    return kl_heatmap(kl.double().cpu().numpy(), policy[rows].bool().cpu().numpy(), valid[rows].cpu().numpy())
