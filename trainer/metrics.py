"""verl's metric families for one step: data, timing, throughput (verl's trainer/ppo/metric_utils, in small)."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .batch import Batch

# Stages whose time is also reported per token, and which tokens they touch (verl's compute_timing_metrics).
PER_TOKEN_STAGES = {"gen": "response", "ref": "all", "values": "all", "adv": "all", "update_critic": "all",
                    "update_actor": "all"}


@contextmanager
def timer(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Adds the block's wall time to ``timings[name]`` (verl's marked_timer)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def data_metrics(batch: Batch, scores: torch.Tensor, token_rewards: torch.Tensor, advantages: torch.Tensor,
                 returns: torch.Tensor, values: torch.Tensor | None, max_prompt: int, max_response: int
                 ) -> dict[str, float]:
    """critic/score|rewards|advantages|returns|values, response_length, prompt_length."""
    mask = batch.response_mask.bool()
    metrics = {**_stats("critic/score", scores), **_stats("critic/rewards", token_rewards.sum(-1)),
               **_stats("critic/advantages", advantages[mask]), **_stats("critic/returns", returns[mask])}
    if values is not None:
        metrics.update(_stats("critic/values", values[mask]))
        residual = (returns - values)[mask]
        metrics["critic/vf_explained_var"] = float(1 - residual.var() / (returns[mask].var() + 1e-5))
    response_len = batch.response_valid.sum(-1)  # verl's response_length: tool replies included
    prompt_len = batch.key_valid[:, :batch.prompt_width].sum(-1)
    metrics.update(_stats("response_length", response_len))
    metrics["response_length/clip_ratio"] = float((response_len >= max_response).float().mean())
    # verl separates responses its engine aborted; this engine never aborts one, so both families agree
    metrics.update(_stats("response_length_non_aborted", response_len))
    metrics["response_length_non_aborted/clip_ratio"] = metrics["response_length/clip_ratio"]
    metrics["response/aborted_ratio"] = 0.0
    metrics.update(_stats("prompt_length", prompt_len))
    metrics["prompt_length/clip_ratio"] = float((prompt_len >= max_prompt).float().mean())
    return metrics


def seqlen_balance_metrics(batch: Batch, ranks: int) -> dict[str, float]:
    """verl's ``global_seqlen/*``: tokens per data-parallel rank when the batch is cut in order, against a
    length-balanced split (what verl's batch balancing achieves) over ``ranks`` ranks."""
    lengths = (batch.key_valid[:, :batch.prompt_width].sum(-1) + batch.response_valid.sum(-1)).long().tolist()
    ranks = max(1, min(ranks, len(lengths)))
    size = len(lengths) // ranks
    in_order = [sum(lengths[i * size:(i + 1) * size]) for i in range(ranks)]
    balanced = _balanced_loads(lengths[:size * ranks], ranks, size)
    return {"global_seqlen/min": min(in_order), "global_seqlen/max": max(in_order),
            "global_seqlen/minmax_diff": max(in_order) - min(in_order),
            "global_seqlen/balanced_min": min(balanced), "global_seqlen/balanced_max": max(balanced),
            "global_seqlen/mean": sum(in_order) / ranks}


def _balanced_loads(lengths: list[int], ranks: int, size: int) -> list[int]:
    """Longest first, each to the least-loaded rank with room: equal counts, near-equal token sums."""
    loads, counts = [0] * ranks, [0] * ranks
    for length in sorted(lengths, reverse=True):
        rank = min((r for r in range(ranks) if counts[r] < size), key=loads.__getitem__)
        loads[rank] += length
        counts[rank] += 1
    return loads


def timing_metrics(timings: dict[str, float], batch: Batch) -> dict[str, float]:
    """timing_s/<stage> and timing_per_token_ms/<stage>."""
    tokens = {"response": int(batch.response_valid.sum()), "all": batch.num_tokens}
    metrics = {f"timing_s/{name}": seconds for name, seconds in timings.items()}
    for name, which in PER_TOKEN_STAGES.items():
        if name in timings:
            metrics[f"timing_per_token_ms/{name}"] = timings[name] * 1000 / max(tokens[which], 1)
    return metrics


def throughput_metrics(timings: dict[str, float], batch: Batch, device: torch.device) -> dict[str, float]:
    """perf/*: tokens a second, step time, peak memory (CUDA's allocator; on CPU the process's peak RSS)."""
    step_s = timings["step"]
    metrics = {"perf/total_num_tokens": batch.num_tokens, "perf/time_per_step": step_s,
               "perf/throughput": batch.num_tokens / step_s}
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        metrics["perf/max_memory_allocated_gb"] = metrics["perf/max_memory_reserved_gb"] = peak / 2**30
    metrics["perf/cpu_memory_used_gb"] = _rss_bytes() / 2**30
    return metrics


def _rss_bytes() -> int:
    """The process's resident memory now (Linux /proc; 0 where it is not available)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
