"""``python -m tracklane.trainer``: GRPO (or PPO) on a built-in tool-use task, logged through ``tracklane.Tracking``.

Reads top to bottom like verl's ``RayPPOTrainer.fit`` on rank 0 (``_fit``: ``_setup``, then each step
``_train_step`` and ``_log_step``): config, models (a supervised warm-up, or a checkpoint), then each step multi-turn
rollout (the policy may call a calculator) -> reward by component -> old and reference log-probs (-> values) ->
advantages -> update -> log about 100 verl metric keys, a score histogram and a few rollout trajectories; validation
every ``trainer.test_freq`` steps.

    python -m tracklane.trainer [--print-config] [key=value ...]
    python -m tracklane.trainer trainer.logger=[console,tensorboard] trainer.total_steps=200 actor_rollout_ref.rollout.n=8
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from threadpoolctl import threadpool_limits

from tracklane import ConfigError, PipelineReport, Tracking, ValidationGenerationsLogger, plain_config

from . import algos
from .agent_loop import run_episodes
from .batch import Batch, log_probs, values
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import Config, TrainerConfig, load_config, to_yaml
from .environment import offline_environment, where_summary
from .gradients import GradientProbe
from .heatmap import batch_kl_heatmap
from .metrics import data_metrics, seqlen_balance_metrics, throughput_metrics, timer, timing_metrics
from .mismatch import mismatch_metrics
from .model import GPT
from .progress import Progress
from .rewards import Scored, episode_metrics, reward_metrics, score_episodes, skewness
from .rollout import RolloutUnavailable, close_engine, make_engine
from .sample_text import markdown_samples
from .state import Models, set_lr
from .task import Problem, Task
from .tasks import make_task
from .token_strip import STRIP_KEY, token_strips
from .update import update_actor, update_critic
from .validation import validate
from .warmup import warm_up

log = logging.getLogger("tracklane.trainer")


@dataclass
class FitResult:
    scores: dict[int, float] = field(default_factory=dict)
    """Step -> mean training score."""
    val_acc: dict[int, float] = field(default_factory=dict)
    """Step -> exact-match accuracy on the validation set."""
    step_s: dict[int, float] = field(default_factory=dict)
    """Step -> wall seconds of the step, logging calls included (what the benchmarks compare)."""
    first_step: int = 1
    report: PipelineReport | None = None


def fit(cfg: Config, tracking_class: Callable[..., Tracking] = Tracking) -> FitResult:
    """Train as ``cfg`` says. ``tracking_class``: what logs the run (Tracking's signature; the overhead
    benchmark passes its thread peer)."""
    threads = torch.get_num_threads()
    count = cfg.trainer.cpu_threads or max(1, (os.cpu_count() or 2) - 1)
    torch.set_num_threads(count)
    try:
        # numpy's BLAS too (gradient norms): its idle worker spun on the trackers' core, 11.7 ms of CPU a step
        with threadpool_limits(limits=count), ExitStack() as cleanup:
            return _fit(cfg, tracking_class, cleanup)
    finally:
        torch.set_num_threads(threads)


def _fit(cfg: Config, tracking_class: Callable[..., Tracking], cleanup: ExitStack) -> FitResult:
    """Set up, then each step: train (rollout, reward, log-probs, advantages, update) and log, as verl's fit does."""
    run = _setup(cfg, tracking_class, cleanup)
    t, tracking = cfg.trainer, run.tracking
    if run.start_step == 0:
        tracking.log_artifact(_write_config(cfg), name="config", type="config", step=0)
    val_logger = ValidationGenerationsLogger(t.project_name, t.experiment_name)
    progress = Progress(t.total_steps, t.progress)
    result = FitResult(first_step=run.start_step + 1)
    with tracking:  # an exception finishes the tracker runs as failed
        if run.start_step == 0 and t.val_before_train and t.test_freq > 0:
            val_metrics, rows = run.validate()
            tracking.log(val_metrics, step=0)
            val_logger.log(t.logger, rows, 0)
        for step in range(run.start_step + 1, t.total_steps + 1):
            step_started = time.perf_counter()
            done = _train_step(run, step)
            log_us = _log_step(run, step, done, val_logger)
            if done.val_acc is not None:
                result.val_acc[step] = done.val_acc
            result.scores[step] = float(done.scores.mean())
            result.step_s[step] = time.perf_counter() - step_started
            progress.update(step, result.scores[step], done.timings["step"], log_us, tracking.vitals(),
                            f"val acc {done.val_acc:.3f}" if done.val_acc is not None else "")
        progress.close()
    result.report = tracking.finish()
    return result


@dataclass
class _Run:
    """What every step uses: the config, the task, the models, the rollout engine and the tracker runs."""

    cfg: Config
    device: torch.device
    task: Task
    engine: Any
    models: Models
    tracking: Tracking
    probes: dict[str, GradientProbe]
    start_step: int
    max_prompt: int
    max_response: int

    def validate(self) -> tuple[dict[str, float], list]:
        arr = self.cfg.actor_rollout_ref
        return validate(self.engine, self.task, arr.rollout, self.max_response, self.cfg.trainer.log_val_generations,
                        self.device)


@dataclass
class _Step:
    """One step's results, as the updates left them, for its logging."""

    problems: list[Problem]
    episodes: Any
    batch: Batch
    scored: Scored
    token_rewards: torch.Tensor
    timings: dict[str, float]
    metrics: dict[str, float] = field(default_factory=dict)
    entropy: Any = None
    old_logp: Any = None
    ref_logp: Any = None
    old_values: Any = None
    advantages: Any = None
    returns: Any = None
    rows: list = field(default_factory=list)
    val_acc: float | None = None
    saved: str | None = None
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    heatmap: Any = None

    @property
    def scores(self) -> torch.Tensor:
        return self.scored.scores


def _setup(cfg: Config, tracking_class: Callable[..., Tracking], cleanup: ExitStack) -> _Run:
    """The task, the policy and its engine, the tracker runs; then the models from a checkpoint or a short
    supervised warm-up (RL starts from an SFT model). The tracker actors open in the background meanwhile; the
    first step never waits for them: what it logs waits in the spool for a tracker that is not up yet."""
    t, arr = cfg.trainer, cfg.actor_rollout_ref
    device = _device(t.device)
    torch.manual_seed(t.seed)
    task = make_task(cfg.task, t.seed)
    max_prompt, max_response = task.max_prompt_length(), arr.rollout.response_length or task.max_response_length()
    actor = GPT(arr.model, task.tokenizer.vocab_size, max_prompt + max_response).to(device)
    engine = make_engine(arr.rollout.name, actor, task.tokenizer, gpu_memory_utilization=arr.rollout.gpu_memory_utilization,
                         kv_cache_memory_bytes=arr.rollout.kv_cache_memory_bytes,
                         separate_process=arr.rollout.separate_process, seed=t.seed)  # vllm's options
    cleanup.callback(close_engine, engine)  # vLLM's engine and export folder, however the run ends
    checkpoint = _checkpoint_to_resume(t)
    state = load_checkpoint(checkpoint, device) if checkpoint is not None else None
    run_id = state.get("tracking_run_id") if state is not None else None
    # Started before the warm-up, so the tracker actors open while the model warms up; a resumed
    # run continues the tracker runs its checkpoint names (older checkpoints name none).
    tracking = tracking_class(t.project_name, t.experiment_name, list(t.logger), config=cfg.to_dict(),
                              run_id=run_id, resume=run_id is not None)
    try:
        models, start_step = _models(cfg, task, device, actor, state, checkpoint)
        engine.sync_weights()
    except BaseException:
        tracking.finish(exit_code=1)
        raise
    probes = {"actor": GradientProbe(models.actor, "actor")}
    if models.critic is not None:
        probes["critic"] = GradientProbe(models.critic, "critic")
    return _Run(cfg, device, task, engine, models, tracking, probes, start_step, max_prompt, max_response)


def _models(cfg: Config, task: Task, device: torch.device, actor: GPT, state: dict | None,
            checkpoint: str | None) -> tuple[Models, int]:
    if state is None:
        warm_up(actor, task, cfg.actor_rollout_ref.warmup, device)
    models = Models.build(cfg, task, device, actor)
    if state is None:
        return models, 0
    models.load_state_dict(state, task)
    log.info("resumed from %s at step %d", checkpoint, state["step"])
    return models, state["step"]


def _train_step(run: _Run, step: int) -> _Step:
    """Rollout -> reward -> old and reference log-probs (-> values) -> advantages -> update; then validation,
    checkpoint, gradients and the KL heatmap where due."""
    t, n = run.cfg.trainer, run.cfg.actor_rollout_ref.rollout.n
    timings: dict[str, float] = {}
    with timer("step", timings):
        problems = run.task.sample(run.cfg.data.train_batch_size)
        with timer("gen", timings):
            episodes = run_episodes(run.engine, run.task, problems, n, run.max_response,
                                    run.cfg.actor_rollout_ref.rollout.temperature,
                                    run.cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns, run.device)
        batch = Batch.from_rollout(episodes.rollout)
        with timer("reward", timings):
            scored = score_episodes(run.task, [p for p in problems for _ in range(n)], episodes.episodes, run.device)
            token_rewards = _at_last_token(scored.scores, batch.response_mask)  # the outcome reward: the last token
        done = _Step(problems, episodes, batch, scored, token_rewards, timings)
        gradients_due = t.log_gradients and _due(step, t.gradient_freq, t.total_steps)
        _old_and_advantages(run, done)
        _update(run, done, step, gradients_due)
        _after_update(run, done, step, gradients_due)
    return done


def _old_and_advantages(run: _Run, done: _Step) -> None:
    cfg, models, batch, timings = run.cfg, run.models, done.batch, done.timings
    temperature, mask = cfg.actor_rollout_ref.rollout.temperature, batch.response_mask
    with torch.no_grad():
        with timer("old_log_prob", timings):
            done.old_logp, done.entropy = log_probs(models.actor, batch, temperature, with_entropy=True)
        with timer("ref", timings):
            done.ref_logp, _ = log_probs(models.ref, batch, temperature)
        if models.critic is not None:
            with timer("values", timings):
                done.old_values = values(models.critic, batch)
    with timer("adv", timings):
        if models.critic is not None:
            done.advantages, done.returns = algos.gae_advantages(done.token_rewards, done.old_values, mask,
                                                                 cfg.algorithm.gamma, cfg.algorithm.lam)
        else:
            done.advantages = algos.grpo_advantages(done.scores, cfg.actor_rollout_ref.rollout.n, mask,
                                                    cfg.algorithm.norm_adv_by_std_in_grpo)
            done.returns = done.advantages


def _update(run: _Run, done: _Step, step: int, gradients_due: bool) -> None:
    cfg, models, arr, timings = run.cfg, run.models, run.cfg.actor_rollout_ref, done.timings
    rows_per_minibatch = arr.actor.ppo_mini_batch_size * arr.rollout.n
    if models.critic is not None:
        assert models.critic_optim is not None  # built together with the critic
        with timer("update_critic", timings):
            set_lr(models.critic_optim, cfg.critic.optim, step)
            done.metrics.update(update_critic(models.critic, models.critic_optim, done.batch, done.old_values,
                                              done.returns, cfg.critic, arr.actor.grad_clip, rows_per_minibatch,
                                              run.probes["critic"] if gradients_due else None))
    with timer("update_actor", timings):
        set_lr(models.actor_optim, arr.actor.optim, step)
        done.metrics.update(update_actor(models.actor, models.actor_optim, done.batch, done.old_logp, done.ref_logp,
                                         done.advantages, arr.actor, arr.rollout.temperature, rows_per_minibatch,
                                         run.probes["actor"] if gradients_due else None,
                                         poison=step == cfg.trainer.inject_nan_step))
    with timer("update_weights", timings):
        run.engine.sync_weights()


def _after_update(run: _Run, done: _Step, step: int, gradients_due: bool) -> None:
    t, timings, metrics = run.cfg.trainer, done.timings, done.metrics
    if _due(step, t.test_freq, t.total_steps):
        with timer("testing", timings):
            val_metrics, done.rows = run.validate()
        metrics.update(val_metrics)
        done.val_acc = val_metrics[f"val-core/{run.task.name}/acc/mean@1"]
    if _due(step, t.save_freq, t.total_steps):
        with timer("save_checkpoint", timings):
            done.saved = save_checkpoint(t.default_local_dir, step,
                                         {**run.models.state_dict(run.task), "tracking_run_id": run.tracking.run_id})
    if gradients_due:
        timings["gradient_capture"] = 0.0
        for probe in run.probes.values():  # the gradients were taken in the updates; the weights now
            layers, norms, spent = probe.figures()
            done.histograms.update(layers)
            metrics.update(norms)
            timings["gradient_capture"] += spent
    if _due(step, t.image_freq, t.total_steps):
        with timer("kl_heatmap", timings):
            done.heatmap, metrics["actor/kl_heatmap/max"] = batch_kl_heatmap(done.old_logp, done.ref_logp,
                                                                             done.batch.response_mask,
                                                                             done.batch.response_valid)


def _log_step(run: _Run, step: int, done: _Step, val_logger: ValidationGenerationsLogger) -> float:
    """Log the step on rank 0, as verl does; the microseconds ``log(metrics)`` took."""
    t, tracking, n = run.cfg.trainer, run.tracking, run.cfg.actor_rollout_ref.rollout.n
    metrics = _step_metrics(run, step, done)
    before = time.perf_counter()
    tracking.log(metrics, step=step)
    log_us = (time.perf_counter() - before) * 1e6
    tracking.log_histogram("critic/score_dist", done.scores.cpu().numpy(), step)
    for name, values_of_layer in done.histograms.items():
        tracking.log_histogram(name, values_of_layer, step)
    if done.heatmap is not None:
        tracking.log_image("actor/kl_heatmap", done.heatmap, step)
    if _due(step, t.text_freq, t.total_steps):
        tracking.log_text("rollout/samples", markdown_samples(run.task, step, done.problems, done.episodes.episodes,
                                                              done.scored, n), step)
    if done.saved is not None:  # versioned: one artifact name, a version per checkpoint
        tracking.log_artifact(done.saved, name="checkpoint", type="checkpoint", step=step)
    tracking.log_trajectories(_trajectories(run.task, done, n, t.log_rollouts, policy_version=step - 1), step)
    if done.rows:
        val_logger.log(t.logger, done.rows, step)
    return log_us


def _step_metrics(run: _Run, step: int, done: _Step) -> dict[str, float]:
    """verl's metric families of the step: the updates', the data's, the rollouts', the timings and throughput."""
    batch, mask, n = done.batch, done.batch.response_mask, run.cfg.actor_rollout_ref.rollout.n
    metrics = done.metrics
    metrics["actor/entropy_old"] = float(algos.masked_mean(done.entropy, mask))
    metrics.update(data_metrics(batch, done.scores, done.token_rewards, done.advantages, done.returns,
                                done.old_values if run.models.critic is not None else None, run.max_prompt,
                                run.max_response))
    metrics.update(mismatch_metrics(done.episodes.rollout.logprobs, done.old_logp, mask))
    metrics.update(_score_shape(done.scored, n))
    metrics.update(reward_metrics(done.scored))
    metrics.update(episode_metrics(done.episodes.episodes))
    metrics.update(seqlen_balance_metrics(batch, run.cfg.trainer.n_gpus_per_node))
    metrics.update(timing_metrics(done.timings, batch))
    metrics.update(throughput_metrics(done.timings, batch, run.device))
    metrics.update({"training/global_step": step, "training/epoch": 0})
    return metrics


# -- helpers, each one job -----------------------------------------------------------------------
def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu")
    return torch.device(name)


def _checkpoint_to_resume(t: TrainerConfig) -> str | None:
    if t.resume_from_path:
        if latest_checkpoint(t.resume_from_path) is None and not os.path.exists(t.resume_from_path):
            raise ConfigError(f"trainer.resume_from_path: nothing at {t.resume_from_path}")
        return latest_checkpoint(t.resume_from_path) or t.resume_from_path
    if not t.resume:
        return None
    found = latest_checkpoint(t.default_local_dir)
    if found is None:
        log.info("trainer.resume=true but no checkpoint in %s: starting fresh", t.default_local_dir)
    return found


def _due(step: int, every: int, last: int) -> bool:
    return every > 0 and (step % every == 0 or step == last)


def _write_config(cfg: Config) -> str:
    """The resolved config as YAML beside the checkpoints (kept there: trackers copy it before finish), with
    secret-looking values redacted as the trackers' params are."""
    os.makedirs(cfg.trainer.default_local_dir, exist_ok=True)
    path = os.path.join(cfg.trainer.default_local_dir, "config.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(OmegaConf.to_yaml(plain_config(cfg.to_dict())))
    return path


def _at_last_token(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The score on each row's last token the policy wrote (a tool's reply may sit between its turns)."""
    rewards = torch.zeros_like(mask)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (positions * (mask > 0)).max(-1).values
    rewards[torch.arange(len(scores)), last] = scores
    return rewards


def _score_shape(scored: Scored, n: int) -> dict[str, float]:
    """Exact answers, the score's skewness, and groups whose samples all scored alike (GRPO learns nothing
    from those)."""
    groups = scored.scores.view(-1, n)
    return {"critic/score/exact_match": float(np.mean(scored.exact)),
            "critic/score/skewness": skewness(scored.scores.double().cpu().numpy()),
            "critic/score/flat_group_ratio": float((groups.max(-1).values == groups.min(-1).values).float().mean())}


def _trajectories(task: Task, done: _Step, n: int, count: int, policy_version: int) -> list[dict]:
    """``count`` episodes, evenly spaced over the batch, as the pipeline's trajectory dicts: every message (user,
    assistant, tool), every tool call with its arguments and result, the reward by component, per-turn tokens, the
    per-token strip (token_strip.py), and the policy version that generated it (the updates applied before it: this
    trainer generates with the weights it then updates, so its rollouts are never stale)."""
    problems, episodes, scored, advantages = done.problems, done.episodes.episodes, done.scored, done.advantages
    mask, batch, total = done.batch.response_mask, done.batch, len(episodes)
    picks = sorted({round(i * (total - 1) / max(count - 1, 1)) for i in range(count)}) if count else []
    strips = token_strips(task.tokenizer, batch.responses, done.old_logp, done.entropy, mask, batch.response_valid,
                          picks) if picks else {}
    out = []
    for i in picks:
        episode, problem = episodes[i], problems[i // n]
        messages = [{"role": "user", "content": problem.prompt}]
        meta: dict = {"data_source": scored.sources[i], "sample_index": i // n, "rollout_index": i % n,
                      "answer": problem.answer, "num_turns": len(episode.assistant_turns()), "ended": episode.ended,
                      "advantage": float(advantages[i].sum() / max(float(mask[i].sum()), 1.0)),
                      STRIP_KEY: strips[i], "policy_version": policy_version}
        calls = iter(episode.calls)
        turn_number = 0
        for turn in episode.turns:
            if turn.role == "assistant":
                turn_number += 1
                messages.append({"role": "assistant", "content": task.tokenizer.decode(turn.ids)})
                meta[f"turn_{turn_number}_assistant_tokens"] = len(turn.ids)
            else:
                messages.append({"role": "tool", "content": next(calls).result})
                meta[f"turn_{turn_number}_tool_tokens"] = len(turn.ids)
        rewards = {"score": float(scored.scores[i]), **{name: v[i] for name, v in scored.components.items()}}
        out.append({"messages": messages, "rewards": rewards, "meta": meta,
                    "tool_calls": [{"name": c.name, "arguments": c.arguments, "result": c.result,
                                    "latency_s": c.latency_s} for c in episode.calls],
                    "token_ids": np.array(episode.prompt_ids + episode.response_ids(), dtype=np.int32)})
    return out


USAGE = __doc__.split("\n\n", 2)[2]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    flags = [a for a in argv if a.startswith("-")]
    if set(flags) - {"--print-config"}:
        print(f"unknown option(s) {' '.join(sorted(set(flags) - {'--print-config'}))}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        cfg = load_config([a for a in argv if not a.startswith("-")])
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if "--print-config" in flags or cfg.trainer.print_config:
        print(to_yaml(cfg), end="")
        return 0
    offline_environment(cfg.trainer.project_name, cfg.trainer.experiment_name)
    try:
        result = fit(cfg)
    except (RolloutUnavailable, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(_score_summary(result, cfg.trainer))
    report = result.report
    assert report is not None  # fit() sets it when it returns
    print(where_summary(report))
    return 0 if report.complete else 1


def _score_summary(result: FitResult, t: TrainerConfig) -> str:
    """Mean training score over the first and the last sixth of the steps run, and where checkpoints went."""
    steps = sorted(result.scores)
    if not steps:
        return "no training steps were run"
    k = max(1, len(steps) // 6)
    first, last = (sum(result.scores[s] for s in part) / len(part) for part in (steps[:k], steps[-k:]))
    line = (f"mean score {first:.3f} over steps {steps[0]}-{steps[k - 1]}, {last:.3f} over steps "
            f"{steps[-k]}-{steps[-1]}")
    if t.save_freq > 0:
        line += f"; checkpoints in {os.path.abspath(t.default_local_dir)} (continue with trainer.resume=true)"
    return line
