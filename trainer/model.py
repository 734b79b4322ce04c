"""A small GPT-2-shaped causal transformer, built locally, with a KV cache and an optional value head.

Parameter names and shapes follow Hugging Face's GPT-2 (``transformer.h.0.attn.c_attn`` ...), so
the policy can be exported as a ``GPT2LMHeadModel`` for the vLLM engine (see ``rollout/vllm_engine``).
Sequences are left-padded: ``key_valid`` marks real tokens, positions count real tokens only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class KVCache:
    """Keys and values of every layer, preallocated for ``max_len`` positions."""

    def __init__(self, model: GPT, batch: int, max_len: int) -> None:
        cfg, p = model.cfg, next(model.parameters())
        shape = (cfg.n_layer, batch, cfg.n_head, max_len, cfg.n_embd // cfg.n_head)
        self.k = torch.zeros(shape, device=p.device, dtype=p.dtype)
        self.v = torch.zeros(shape, device=p.device, dtype=p.dtype)
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def attention_mask(key_valid: torch.Tensor, q_start: int, q_len: int) -> torch.Tensor:
    """[B, 1, q_len, K] booleans: causal, real keys only; each query always sees itself (no empty rows)."""
    keys = torch.arange(key_valid.shape[1], device=key_valid.device)
    queries = torch.arange(q_start, q_start + q_len, device=key_valid.device)[:, None]
    allowed = (keys <= queries) & key_valid[:, None, None, :]
    return allowed | (keys == queries)


def positions_of(key_valid: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: the first real token is position 0."""
    return (key_valid.long().cumsum(-1) - 1).clamp(min=0)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2's gelu_new


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    """GPT-2's ``transformer`` submodule: embeddings, blocks and final norm, named as Hugging Face names them."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, block_size: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)


class GPT(nn.Module):
    """Token ids -> hidden states; ``logits()`` (tied embeddings) and ``values()`` (value head) on top."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, block_size: int, value_head: bool = False) -> None:
        super().__init__()
        self.cfg, self.vocab_size, self.block_size = cfg, vocab_size, block_size
        self.transformer = Transformer(cfg, vocab_size, block_size)
        self.value_head: nn.Linear | None = nn.Linear(cfg.n_embd, 1) if value_head else None
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        t = self.transformer
        x = t.wte(ids) + t.wpe(positions)
        for layer, block in enumerate(t.h):
            x = block(x, mask, cache, layer)
        if cache is not None:
            cache.length += ids.shape[1]
        return t.ln_f(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.transformer.wte.weight.T

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.value_head is None:
            raise TypeError("values() needs a model built with value_head=True")
        return self.value_head(hidden).squeeze(-1)
