"""What a benchmark step logs: verl-shaped scalars, rollout trajectories, validation generations.

Built fresh each step (as verl builds its metrics dict) so every mode pays the same cost to
make them; only the logging calls differ between modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TRAJECTORY_TOKENS = 512
_STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step", "testing")


def verl_scalars(step: int) -> dict[str, float | int]:
    """~100 keys named and typed as verl's ``compute_data_metrics`` / timing metrics name them."""
    x = step * 1e-3
    m: dict[str, float | int] = {}
    for name in ("pg_loss", "entropy", "kl_loss", "kl_coef", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl",
                 "grad_norm", "lr"):
        m[f"actor/{name}"] = 0.1 + x * len(name)
    for name in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr"):
        m[f"critic/{name}"] = 0.2 + x
    for family in ("score", "rewards", "advantages", "returns", "values"):
        for stat in ("mean", "max", "min"):
            m[f"critic/{family}/{stat}"] = np.float32(x + len(stat))  # verl hands numpy scalars too
    for family in ("response_length", "prompt_length"):
        for stat in ("mean", "max", "min", "clip_ratio"):
            m[f"{family}/{stat}"] = 100.0 + step
    for stage in _STAGES:
        m[f"timing_s/{stage}"] = 0.01 * len(stage)
        m[f"timing_per_token_ms/{stage}"] = 1e-3 * len(stage)
    for task in ("gsm8k", "math", "aime", "amc"):
        for k in (1, 4, 8, 16):
            m[f"val-core/{task}/acc/mean@{k}"] = min(1.0, x * k)
    m.update({"perf/total_num_tokens": 32768, "perf/time_per_step": 0.05, "perf/throughput": 1234.5,
              "perf/max_memory_allocated_gb": 12.5, "perf/max_memory_reserved_gb": 14.0, "perf/cpu_memory_used_gb": 30.0,
              "training/global_step": step, "training/epoch": 0})
    return m


_POOL = 509  # a prime: steps and indices do not line up with it


@lru_cache(maxsize=8)
def _text_pool(chars: int) -> tuple[str, ...]:
    """Word-like random text that compresses about as much as model output (~2x, not 100x like "aaaa")."""
    rng = np.random.default_rng(chars)
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkqjxz     ", dtype=np.uint8)
    return tuple(rng.choice(letters, chars).tobytes().decode() for _ in range(_POOL))


@lru_cache(maxsize=8)
def _token_pool(tokens: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(tokens)
    return tuple(rng.integers(0, 150_000, tokens, dtype=np.int32) for _ in range(_POOL))


def trajectories(count: int, step: int, chars: int = 2000, tokens: int = TRAJECTORY_TOKENS) -> list[dict]:
    """``count`` agentic rollouts of ~``chars`` characters of text plus ``tokens`` int32 token ids each.

    Texts and token arrays come from a precomputed pool, so building a step costs little and the
    same for every mode; the pool varies with the step, so consecutive steps differ.
    """
    texts, ids = _text_pool(chars), _token_pool(tokens)
    cut = chars // 4
    out = []
    for i in range(count):
        k = (step * 31 + i) % _POOL
        text = texts[k]
        out.append({"messages": [{"role": "user", "content": text[:cut]}, {"role": "assistant", "content": text[cut:]}],
                    "tool_calls": [{"name": "python", "arguments": "print(1)", "result": "1", "latency_s": 0.01}],
                    "rewards": {"score": float(i % 2)},
                    "meta": {"sample_index": i, "rollout_index": i % 8, "validation": False},
                    "token_ids": ids[k]})
    return out


def trajectory_bytes(chars: int = 2000, tokens: int = TRAJECTORY_TOKENS) -> int:
    """Raw size of one trajectory: its text plus its token ids."""
    return chars + 4 * tokens


def generations(count: int, step: int) -> list[tuple[str, str, float]]:
    """Validation samples ``(input, output, score)`` as verl's ValidationGenerationsLogger gets them."""
    return [(f"Q{step}.{i}: what is {i} + {step}? " * 4, f"The answer is {i + step}. " * 8, float(i % 2))
            for i in range(count)]


@dataclass(frozen=True, slots=True)
class Workload:
    """What each step logs."""

    name: str
    trajectories: int = 0
    """Trajectories logged every step (0: none)."""
    generations_every: int = 0
    """Validation generations every this many steps (0: never)."""
    generations: int = 16
    """Samples per validation."""

    def raw_bytes_per_step(self) -> int:
        return 100 * 16 + self.trajectories * trajectory_bytes()


WORKLOADS = {
    "scalars": Workload("scalars"),
    "trajectories": Workload("trajectories", trajectories=256),
    "full": Workload("full", trajectories=256, generations_every=10),
}
