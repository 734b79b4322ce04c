"""A simulated verl-shaped loop: each step sleeps ``trainer.step_s`` and logs ~100 synthetic verl keys.

The real trainer is ``trainer.main`` (``python -m trainer``); this stays for the benchmarks, which
use ``step_metrics`` as a fixed synthetic load. Run it with ``python -m trainer.demo [overrides]``.
"""

from __future__ import annotations

import logging
import sys
import time

from omegaconf import OmegaConf

from pipeline import Tracking

from trainer.environment import offline_environment

DEFAULTS = {
    "trainer": {
        "project_name": "tracklane_demo",
        "experiment_name": "grpo_sim",
        "logger": ["console", "tensorboard", "mlflow", "wandb", "swanlab", "file"],
        "log_async": True,
        "total_steps": 100,
        "step_s": 0.05,
        "async_log": {},
    },
}


def step_metrics(step: int, started: float) -> dict:
    """About 100 keys named as verl names them."""
    progress = step / 100
    metrics = {f"actor/{k}": v for k, v in {
        "pg_loss": 0.5 - 0.3 * progress, "entropy": 1.2 - 0.5 * progress, "kl_loss": 0.01 * progress,
        "pg_clipfrac": 0.1, "ppo_kl": 0.002, "grad_norm": 1.0 + 0.1 * (step % 3), "lr": 1e-6}.items()}
    for family in ("score", "rewards", "advantages", "returns"):
        for stat, value in (("mean", progress), ("max", 1.0), ("min", -1.0 + progress)):
            metrics[f"critic/{family}/{stat}"] = value
    for name in ("response_length", "prompt_length"):
        for stat, value in (("mean", 120 + step), ("max", 256), ("min", 8), ("clip_ratio", 0.01)):
            metrics[f"{name}/{stat}"] = value
    for stage in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step", "testing"):
        metrics[f"timing_s/{stage}"] = 0.01 * (1 + len(stage))
        metrics[f"timing_per_token_ms/{stage}"] = 0.001 * len(stage)
    for task in ("gsm8k", "math", "aime"):
        for k in (1, 4, 8):
            metrics[f"val-core/{task}/acc/mean@{k}"] = min(1.0, progress * k / 8)
            metrics[f"val-aux/{task}/reward/std@{k}"] = 0.1
    while len(metrics) < 96:
        metrics[f"actor/extra_{len(metrics)}"] = float(step)
    metrics.update({"perf/throughput": 1000.0, "perf/time_per_step": time.time() - started,
                    "perf/max_memory_allocated_gb": 1.5, "training/global_step": step, "training/epoch": 0})
    return metrics


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_dotlist(argv))
    trainer = config.trainer
    offline_environment(trainer.project_name, trainer.experiment_name)
    tracking = Tracking(trainer.project_name, trainer.experiment_name, list(trainer.logger), config=config)
    costs = []
    for step in range(1, trainer.total_steps + 1):
        started = time.time()
        time.sleep(trainer.step_s)  # the "GPU" step: the CPU stays free
        metrics = step_metrics(step, started)
        before = time.perf_counter()
        tracking.log(metrics, step=step)
        costs.append(time.perf_counter() - before)
    report = tracking.finish()
    costs.sort()
    print(f"\nlog() on the trainer's thread ({'async' if trainer.log_async else 'sync'}, {len(metrics)} keys): "
          f"p50 {costs[len(costs) // 2] * 1e6:.0f} us, p99 {costs[int(len(costs) * 0.99)] * 1e6:.0f} us")
    print("Where each tracker wrote:")
    for lane in report.lanes.values():
        print(f"  {lane.where or lane.name}")
    return 0 if report.complete else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
