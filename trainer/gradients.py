"""Per-layer gradients and weights of a model, taken during an update for the histograms a step logs.

A layer is a block of the transformer (``h.0``, ``h.1``...), the embeddings (``wte``, ``wpe``), the
final norm (``ln_f``) or the value head: the names in ``<prefix>/gradients/<layer>``,
``<prefix>/weights/<layer>`` and ``<prefix>/grad_norm/<layer>``. ``capture()`` runs right after
``backward()`` of the step's first mini-batch (before clipping), copying each layer's gradient into one
flat float32 array: a few hundred microseconds for this model, measured as ``timing_s/gradient_capture``;
the binning happens on the pipeline's shipper thread.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch
from torch import nn


def layer_of(parameter: str) -> str:
    """``transformer.h.0.attn.c_attn.weight`` -> ``h.0``; ``transformer.wte.weight`` -> ``wte``."""
    parts = parameter.split(".")
    if parts[0] == "transformer":
        parts = parts[1:]
    return ".".join(parts[:2]) if parts[0] == "h" else parts[0]


class GradientProbe:
    """One model's layers; ``capture`` takes the gradients once, ``figures`` hands them over with the weights."""

    def __init__(self, model: nn.Module, prefix: str) -> None:
        self.prefix = prefix
        self._layers: dict[str, list[tuple[str, nn.Parameter]]] = defaultdict(list)
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                self._layers[layer_of(name)].append((name, parameter))
        self._gradients: dict[str, np.ndarray] = {}
        self.seconds = 0.0

    @property
    def wanted(self) -> bool:
        """True until this step's gradients are taken."""
        return not self._gradients

    def capture(self) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            for layer, parameters in self._layers.items():
                grads = [p.grad.reshape(-1) for _, p in parameters if p.grad is not None]
                if grads:
                    self._gradients[layer] = torch.cat(grads).float().cpu().numpy()
        self.seconds += time.perf_counter() - started

    def figures(self) -> tuple[dict[str, np.ndarray], dict[str, float], float]:
        """Histograms (gradients as captured, weights as they are now), per-layer gradient norms, by key, and
        the seconds this step's capture and these figures took."""
        started = time.perf_counter()
        histograms, norms = {}, {}
        for layer, values in self._gradients.items():
            histograms[f"{self.prefix}/gradients/{layer}"] = values
            norms[f"{self.prefix}/grad_norm/{layer}"] = float(np.linalg.norm(values))
        with torch.no_grad():
            for layer, parameters in self._layers.items():
                weights = torch.cat([p.detach().reshape(-1) for _, p in parameters]).float().cpu().numpy()
                histograms[f"{self.prefix}/weights/{layer}"] = weights
        spent = self.seconds + time.perf_counter() - started
        self._gradients, self.seconds = {}, 0.0
        return histograms, norms, spent
