"""verl's own PPO training loops, run on CPU fakes, so tests can see what verl's ``Tracking`` (or the one
swapped in for it) is handed and when: ``compose_verl_config``, ``run_fit``, ``FakeTaskRunner``, and a driver
(``python -m tests.verl_fit [--address A] [--dropin] [--in-process] -- <hydra overrides>``).

What runs for real (imported from the installed verl, never copied):
  - the config: verl's ``_generated_ppo_trainer.yaml``, composed by Hydra with the overrides;
  - ``trainer.use_v1=false``: ``RayPPOTrainer.__init__`` (its dataloaders, its ``ValidationGenerationsLogger``)
    and ``fit()`` with everything it calls on the driver: ``_validate``, ``_maybe_log_val_generations``,
    ``_balance_batch``, ``_compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_compute_values`` /
    ``_update_actor`` / ``_update_critic`` (the padding conversions around the worker calls),
    ``compute_advantage``, the rollout-correction and debug metrics, ``compute_data_metrics``,
    ``compute_timing_metrics``, ``compute_throughout_metrics``, ``compute_variance_proxy_metrics``; the
    rollout's batch is assembled by the agent loop's own ``_postprocess`` and ``_performance_metrics``;
  - ``trainer.use_v1=true``: the registered v1 trainer class (``PPOTrainerSync`` for ``trainer_mode=sync``)
    with its ``__init__``, ``fit()``, ``step()``/``_step_once`` (replay buffer included: verl's ``ReplayBuffer``
    with its DAPO group filter), ``_validate``, ``_maybe_log_val_generations``, ``_balance_batch``, the
    log-prob/advantage/update methods and ``_compute_metrics``; then ``TaskRunnerV1.run``'s
    ``finally: tracking.finish(exit_code=0 if succeeded else 1)``.

What is faked, and why (each needs GPUs, model weights, a data set or services a CPU test has not):
  - the tokenizer (a character vocabulary) and the data set (addition prompts shaped like verl's
    ``RLHFDataset`` rows; v1's ``create_rl_dataset`` is pointed at them for the run);
  - the rollout (vLLM/SGLang servers behind the agent loop): a deterministic "policy" whose answers get
    right more often as steps go on, scored by a rule as verl's reward loop would (``rm_scores``, ``acc``).
    v1 runs verl's ``AgentLoopWorkerTQ`` (``generate_sequences``, ``_run_prompt``, ``_agent_loop_postprocess``)
    in this process with only ``_run_agent_loop`` faked, and waits for it (a fast, synchronous rollout);
  - the worker groups (FSDP/Megatron engines): ``compute_log_prob``, ``compute_ref_log_prob``,
    ``update_actor``, ``infer_batch``, ``train_mini_batch`` return verl-shaped outputs computed from the tokens;
  - the checkpoint engine (``update_weights``, ``sleep_replicas``) and the checkpoint files:
    ``_save_checkpoint`` (and v0's ``_load_checkpoint``) write and read nothing; v1's ``_load_checkpoint``
    is verl's (``resume_mode=disable``);
  - v1 only: TransferQueue (a controller and storage units, Ray actors taking a CPU each) by an in-process
    store behind ``transfer_queue``'s ``kv_*`` functions, put back after the run; samples are split and
    columns packed by TransferQueue's own helpers. And one arbitrary choice of verl's replay buffer made
    repeatable (``submission_ordered``). With a critic (``algorithm.adv_estimator=gae``) v1's
    ``_compute_values`` calls ``ray.get`` on the critic's futures, which starts Ray when none is running.

Deterministic: with the same config two runs log the same values (also across processes), except the
time-dependent key families ``timing_s/*``, ``timing_per_token_ms/*``, ``perf/time_per_step`` and
``perf/throughput`` (v0 and v1; ``timing_s/agent_loop/*`` are fixed stand-ins here, time in a real run).
uids are ``uuid4`` as in verl; no logged value depends on them. v0's ``fit()`` never finishes its
``Tracking`` (verl's ``__del__`` does, whenever the object is collected); v1's is finished once by
``TaskRunnerV1.run``.

The driver exits with ``os._exit(0)`` as soon as ``run_ppo`` returns, with nothing finished or flushed:
as a verl driver returning and Ray tearing the actor down. ``--in-process`` ends as a script does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig

from tracklane.core.params import is_secret_key

# ------------------------------------------------------------------------------------------------ config

HARNESS_OVERRIDES = (
    # small sizes: 4 prompts a batch, 2 answers each, 4 steps; validation before training, every 2nd step
    # and at the last, with 2 generations logged each time
    "data.train_batch_size=4",
    "data.max_prompt_length=8",
    "data.max_response_length=6",
    "data.dataloader_num_workers=0",
    "data.seed=7",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.val_kwargs.n=2",
    "actor_rollout_ref.rollout.agent.num_workers=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "critic.ppo_mini_batch_size=2",
    "algorithm.adv_estimator=grpo",
    # v1's replay buffer filters groups whose answers all score the same (DAPO) and refills them, so verl's
    # dapo_filtered_reward_logger is called; v0's fit() has no such filter and ignores it
    "algorithm.filter_groups.enable=true",
    "trainer.total_training_steps=4",
    "trainer.test_freq=2",
    "trainer.log_val_generations=2",
    "trainer.val_before_train=true",
    "trainer.n_gpus_per_node=1",
    "trainer.device=cpu",
    "trainer.resume_mode=disable",
    "trainer.project_name=verl_fit",
    "trainer.experiment_name=cpu_fakes",
    "trainer.logger=[console]",
)
"""The harness's own overrides, applied before the caller's."""

VAL_PROMPTS = 6
"""Prompts in the validation set (one batch)."""
DP_SIZE = 2
"""Data-parallel ranks the fake actor claims (so verl's batch balancing has two partitions)."""


def verl_config_dir() -> Path:
    """verl's trainer config folder in the installed package."""
    import verl.trainer.config

    return Path(verl.trainer.config.__file__).parent


def compose_verl_config(overrides: Sequence[str] = ()) -> DictConfig:
    """verl's generated PPO config composed by Hydra with the harness's overrides, then the caller's."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    # verl's default_local_dir is relative to the working directory (tracklane keeps its spool there): a
    # fresh temporary folder per config instead, unless the caller names one
    named = any(o.lstrip("+").startswith("trainer.default_local_dir=") for o in overrides)
    local_dir = [] if named else [f"trainer.default_local_dir={tempfile.mkdtemp(prefix='verl_fit-')}"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            return compose(config_name="_generated_ppo_trainer",
                           overrides=[*HARNESS_OVERRIDES, *local_dir, *overrides])
    finally:
        GlobalHydra.instance().clear()  # so the next call (or the caller's own Hydra) starts clean


# ------------------------------------------------------------------------------------------------ data


class FakeTokenizer:
    """A character vocabulary: what verl's trainer asks of a tokenizer (decode, pad/eos ids)."""

    pad_token_id = 0
    eos_token_id = 1
    CHARS = "0123456789+-=? "

    def encode(self, text: str) -> list[int]:
        return [self.CHARS.index(c) + 2 for c in text]

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        specials = {self.pad_token_id, self.eos_token_id}
        return "".join(self.CHARS[i - 2] for i in ids if not (skip_special_tokens and i in specials))

    def batch_decode(self, rows: Any, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in rows]


def prompt_rows(count: int, seed: int, split: str) -> list[dict]:
    """``count`` rows shaped like verl's ``RLHFDataset.__getitem__`` output: one addition problem each."""
    rng = np.random.RandomState(seed)
    rows = []
    for index in range(count):
        a, b = (int(x) for x in rng.randint(0, 100, size=2))
        rows.append({
            "raw_prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "data_source": "fake_addition",
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index},
            "index": index,
            "tools_kwargs": {},
            "interaction_kwargs": {},
        })
    return rows


def train_rows(config: DictConfig) -> list[dict]:
    """One epoch of training prompts: as many batches as the run has steps."""
    steps = config.trainer.total_training_steps or 4
    return prompt_rows(config.data.train_batch_size * steps, seed=int(config.data.seed or 0), split="train")


def val_rows(config: DictConfig) -> list[dict]:
    return prompt_rows(VAL_PROMPTS, seed=int(config.data.seed or 0) + 1000, split="test")


# ------------------------------------------------------------------------------------------------ rollout


def answer(prompt: str, ground_truth: str, step: int, sample: int, validate: bool, seed: int) -> tuple[str, bool]:
    """The fake policy: right more often as steps go on, the same answer for the same (step, sample, prompt)."""
    rng = np.random.RandomState([seed, max(step, 0), sample, int(validate), sum(map(ord, prompt))])
    p_right = min(0.95, 0.3 + 0.15 * step) if validate else min(0.7, 0.4 + 0.1 * step)
    if rng.rand() < p_right:
        return ground_truth, True
    return str(int(ground_truth) + int(rng.randint(1, 12))), False


def generation(tokenizer: FakeTokenizer, rollout_cfg: DictConfig, kwargs: dict, step: int, sample: int,
               validate: bool, seed: int) -> dict:
    """One sample as the LLM server and the reward loop would give it: token ids, log-probs, score."""
    prompt = kwargs["raw_prompt"][-1]["content"]
    text, right = answer(prompt, kwargs["reward_model"]["ground_truth"], step, sample, validate, seed)
    response_ids = (tokenizer.encode(text) + [tokenizer.eos_token_id])[:rollout_cfg.response_length]
    return {
        "prompt_ids": tokenizer.encode(prompt)[-rollout_cfg.prompt_length:],
        "response_ids": response_ids,
        "response_logprobs": ([-0.05 - 0.1 * ((t * 7 + step) % 5) for t in response_ids]
                              if rollout_cfg.calculate_log_probs else None),
        "reward_score": float(right),
        "num_turns": 2,
        "extra_fields": {"reward_extra_info": {"acc": float(right)}},
    }


def engine_metrics(response_ids: list[int]) -> Any:
    """Fixed stand-ins for the engine's durations (verl logs them under ``timing_s/agent_loop/*``)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics

    return AgentLoopMetrics(generate_sequences=0.01 * len(response_ids), tool_calls=0.0, compute_score=0.001,
                            num_preempted=0)


def padded_agent_loop_output(tokenizer: FakeTokenizer, rollout_cfg: DictConfig, kwargs: dict, step: int,
                             sample: int, validate: bool, seed: int) -> Any:
    """What verl's ``AgentLoopWorker._agent_loop_postprocess`` returns for one sample (padded, scored)."""
    from verl.experimental.agent_loop.agent_loop import _InternalAgentLoopOutput
    from verl.utils.model import compute_position_id_with_mask

    gen = generation(tokenizer, rollout_cfg, kwargs, step, sample, validate, seed)
    prompt_ids, response_ids, logprobs = gen["prompt_ids"], gen["response_ids"], gen["response_logprobs"]
    p_pad, r_pad = rollout_cfg.prompt_length - len(prompt_ids), rollout_cfg.response_length - len(response_ids)
    prompt_t = torch.tensor([[0] * p_pad + prompt_ids])
    response_t = torch.tensor([response_ids + [0] * r_pad])
    attention = torch.tensor([[0] * p_pad + [1] * len(prompt_ids) + [1] * len(response_ids) + [0] * r_pad])
    return _InternalAgentLoopOutput(
        prompt_ids=prompt_t, response_ids=response_t, input_ids=torch.cat([prompt_t, response_t], dim=1),
        position_ids=compute_position_id_with_mask(attention), attention_mask=attention,
        response_mask=torch.tensor([[1] * len(response_ids) + [0] * r_pad]),
        response_logprobs=torch.tensor([logprobs + [0.0] * r_pad]) if logprobs is not None else None,
        multi_modal_inputs={}, reward_score=gen["reward_score"], num_turns=gen["num_turns"],
        metrics=engine_metrics(response_ids),
        extra_fields={**gen["extra_fields"], "raw_prompt": kwargs["raw_prompt"],
                      "min_global_steps": step, "max_global_steps": step},
    )


class FakeRollout:
    """Stands in for verl's ``AgentLoopManager`` (LLM servers + reward loop): ``generate_sequences``."""

    def __init__(self, config: DictConfig, tokenizer: FakeTokenizer) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.seed = int(config.data.seed or 0)

    def outputs(self, non_tensor: dict, step: int, validate: bool) -> list:
        rows = len(non_tensor["raw_prompt"])
        return [padded_agent_loop_output(self.tokenizer, self.config.actor_rollout_ref.rollout,
                                         {k: v[i] for k, v in non_tensor.items()}, step, i, validate, self.seed)
                for i in range(rows)]

    def generate_sequences(self, prompts: Any) -> Any:
        """A ``DataProto`` as verl's agent loop returns it, assembled by the agent loop's own code."""
        from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker

        step = int(prompts.meta_info.get("global_steps", -1))
        validate = bool(prompts.meta_info.get("validate", False))
        outputs = self.outputs(prompts.non_tensor_batch, step, validate)
        # reward_loop_worker_handles set: the reward was computed in the loop (verl's default path)
        worker = SimpleNamespace(reward_loop_worker_handles=[])
        output = AgentLoopWorker._postprocess(worker, outputs, prompts.non_tensor_batch, validate=validate)
        metrics = [output.meta_info.pop("metrics")]
        timing = AgentLoopManager._performance_metrics(None, metrics, output)
        output.meta_info = {"timing": timing, **output.meta_info}
        return output


# ------------------------------------------------------------------------------------------------ workers


def _nested(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(values, offsets=like.offsets())


class _Done:
    """What a non-blocking worker-group call returns: ``.get()``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class FakeWorkerGroup:
    """The actor/ref/critic worker groups (FSDP engines on GPUs): verl-shaped outputs from the tokens."""

    def __init__(self, dp_size: int = DP_SIZE) -> None:
        self._dispatch_info = {"actor": list(range(dp_size))}
        self.actor_updates = 0
        self.critic_updates = 0

    def _query_dispatch_info(self, role: str) -> list[int]:
        return self._dispatch_info["actor"]

    def compute_log_prob(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        ids = data["input_ids"]
        tokens = ids.values().float()
        log_probs = -0.05 - 0.1 * torch.remainder(tokens * 7 + self.actor_updates, 5)
        entropy = 0.2 + 0.05 * torch.remainder(tokens, 3)
        return tu.get_tensordict({"log_probs": _nested(log_probs, ids), "entropy": _nested(entropy, ids)},
                                 non_tensor_dict={"metrics": {"mfu": 0.0}})

    def compute_ref_log_prob(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        ids = data["input_ids"]
        log_probs = -0.07 - 0.1 * torch.remainder(ids.values().float() * 7, 5)
        return tu.get_tensordict({"log_probs": _nested(log_probs, ids)})

    def update_actor(self, data: Any) -> Any:
        """Metrics as verl's engine worker returns them: lists over mini-batches, plus lr and mfu."""
        from verl.utils import tensordict_utils as tu

        self.actor_updates += 1
        k = self.actor_updates
        pg = self.pg_loss(data["advantages"], data["response_mask"])
        metrics = {"pg_loss": [pg, pg * 0.5], "pg_clipfrac": [0.01 * k, 0.02], "ppo_kl": [1e-3 * k, 2e-3],
                   "pg_clipfrac_lower": [0.0, 0.0], "grad_norm": [1.0 / k, 0.5 / k], "lr": 1e-6, "mfu": 0.0}
        return tu.get_tensordict({}, non_tensor_dict={"metrics": metrics})

    def pg_loss(self, advantages: torch.Tensor, response_mask: torch.Tensor) -> float:
        """A stand-in loss from the batch: the mean |advantage| over response tokens, scaled by the update count."""
        adv = advantages.values() if advantages.is_nested else advantages[response_mask.bool()]
        return float(-adv.abs().mean()) * 0.1 / self.actor_updates

    def infer_batch(self, data: Any) -> _Done:
        from verl.utils import tensordict_utils as tu

        ids = data["input_ids"]
        values = 0.1 * torch.remainder(ids.values().float(), 4) + 0.01 * self.critic_updates
        return _Done(tu.get_tensordict({"values": _nested(values, ids)}))

    def train_mini_batch(self, data: Any) -> _Done:
        from verl.utils import tensordict_utils as tu

        self.critic_updates += 1
        k = self.critic_updates
        metrics = {"vf_loss": [0.5 / k, 0.4 / k], "vf_clipfrac": [0.0, 0.01], "vpred_mean": [0.1 * k, 0.1],
                   "grad_norm": [2.0 / k, 1.0 / k], "lr": 1e-5, "mfu": 0.0}
        return _Done(tu.get_tensordict({}, non_tensor_dict={"metrics": metrics}))


class FakeCheckpointManager:
    """The checkpoint engine that moves weights from trainer to rollout replicas."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    def update_weights(self, global_steps: Any = None) -> None:
        self.updates.append(global_steps)

    @property
    def version(self) -> int:
        """The step whose weights the rollout replicas hold."""
        return next((int(s) for s in reversed(self.updates) if s is not None), 0)

    def sleep_replicas(self) -> None:
        pass


class FakeResourcePool:
    """verl's ``ResourcePoolManager`` as fit() asks it: how many GPUs (for the throughput figures)."""

    def __init__(self, config: DictConfig) -> None:
        self.n_gpus = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)

    def get_n_gpus(self) -> int:
        return self.n_gpus


def current_generations_logger(trainer: Any, config: DictConfig) -> Any:
    """verl's trainer builds its ``ValidationGenerationsLogger`` from ``verl.utils.tracking`` as it is now."""
    import verl.utils.tracking

    cls = verl.utils.tracking.ValidationGenerationsLogger
    existing = getattr(trainer, "validation_generations_logger", None)
    if isinstance(existing, cls):
        return existing
    return cls(project_name=config.trainer.project_name, experiment_name=config.trainer.experiment_name)


def seed_everything(config: DictConfig) -> None:
    seed = int(config.data.seed or 0)
    torch.manual_seed(seed)
    np.random.seed(seed)


# ------------------------------------------------------------------------------------------------ v0


def v0_trainer(config: DictConfig) -> Any:
    """verl's ``RayPPOTrainer`` built by its own ``__init__`` (CPU only), then given the fakes that
    ``init_workers()`` would have built on GPUs."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role

    class CpuPPOTrainer(RayPPOTrainer):
        # checkpoints would read and write model shards: none here
        def _load_checkpoint(self) -> int:
            return 0

        def _save_checkpoint(self) -> None:
            self.saved_steps.append(self.global_steps)

    tokenizer = FakeTokenizer()
    trainer = CpuPPOTrainer(config=config, tokenizer=tokenizer, role_worker_mapping={Role.ActorRollout: object},
                            resource_pool_manager=FakeResourcePool(config), train_dataset=train_rows(config),
                            val_dataset=val_rows(config))
    trainer.validation_generations_logger = current_generations_logger(trainer, config)
    workers = FakeWorkerGroup()
    trainer.saved_steps = []
    trainer.actor_rollout_wg = trainer.ref_policy_wg = trainer.critic_wg = workers
    trainer.reward_loop_manager = trainer.teacher_model_manager = trainer.llm_server_manager = None
    trainer.distillation_config = None
    trainer.async_rollout_mode = True
    trainer.async_rollout_manager = FakeRollout(config, tokenizer)
    trainer.checkpoint_manager = FakeCheckpointManager()
    return trainer


def run_v0(config: DictConfig) -> None:
    """verl's v0 ``RayPPOTrainer.fit()``: it makes its own ``Tracking`` and never finishes it."""
    seed_everything(config)
    v0_trainer(config).fit()


# ------------------------------------------------------------------------------------------------ v1


class FakeTransferQueue:
    """TransferQueue's ``kv_*`` API in this process. The real one is a controller and storage units as Ray
    actors (a CPU each); here samples live in a dict by partition and key, tags are merged as TQ merges them,
    samples are split and columns packed by TQ's own helpers (jagged nested tensors, ``NonTensorStack``)."""

    API = ("init", "close", "kv_put", "kv_batch_put", "kv_batch_get", "kv_list", "kv_clear",
           "async_kv_put", "async_kv_batch_put", "async_kv_batch_get", "async_kv_list", "async_kv_clear")

    def __init__(self) -> None:
        from collections import defaultdict

        self.tags: dict[str, dict[str, dict]] = defaultdict(dict)
        self.values: dict[str, dict[str, dict]] = defaultdict(dict)

    def init(self, conf: Any = None) -> Any:
        return conf

    def close(self) -> None:
        self.tags.clear()
        self.values.clear()

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: list | None = None,
                     data_parser: Any = None) -> Any:
        from transfer_queue import KVBatchMeta
        from transfer_queue.storage.managers.base import KVStorageManager

        stored_tags, stored = self.tags[partition_id], self.values[partition_id]
        for i, key in enumerate(keys):
            stored_tags.setdefault(key, {}).update(tags[i] if tags is not None else {})
            stored.setdefault(key, {})
        if fields is not None:
            names, flat = sorted(fields.keys()), KVStorageManager._generate_values(fields)
            for j, name in enumerate(names):
                for i, key in enumerate(keys):
                    stored[key][name] = flat[j * len(keys) + i]
        return KVBatchMeta(keys=list(keys), tags=[dict(stored_tags[k]) for k in keys], partition_id=partition_id,
                           fields=sorted(set().union(*(stored[k] for k in keys))))

    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: dict | None = None,
               data_parser: Any = None) -> Any:
        from verl.utils import tensordict_utils as tu

        batch = tu.list_of_dict_to_tensordict([fields]) if fields else None
        return self.kv_batch_put([key], partition_id, batch, [tag or {}])

    def kv_batch_get(self, keys: list[str] | str, partition_id: str, select_fields: Any = None) -> Any:
        from tensordict import TensorDict
        from transfer_queue.storage.managers.simple_storage_manager import AsyncSimpleStorageManager

        keys = [keys] if isinstance(keys, str) else list(keys)
        rows = [self.values[partition_id][key] for key in keys]
        present = set.intersection(*(set(row) for row in rows))
        wanted = [select_fields] if isinstance(select_fields, str) else select_fields
        names = sorted(present) if wanted is None else [name for name in wanted if name in present]
        if wanted is not None and any(name in row for row in rows for name in set(wanted) - present):
            raise ValueError("Some fields are not ready in all the requested keys!")  # as TQ says it
        return TensorDict({name: AsyncSimpleStorageManager._pack_field_values([row[name] for row in rows])
                           for name in names}, batch_size=[len(keys)])

    def kv_list(self, partition_id: str | None = None) -> dict:
        parts = [partition_id] if partition_id is not None else list(self.tags)
        return {p: {k: dict(t) for k, t in self.tags[p].items()} for p in parts if self.tags.get(p)}

    def kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            self.tags[partition_id].pop(key, None)
            self.values[partition_id].pop(key, None)

    async def async_kv_put(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_put(*args, **kwargs)

    async def async_kv_batch_put(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_batch_put(*args, **kwargs)

    async def async_kv_batch_get(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_batch_get(*args, **kwargs)

    async def async_kv_list(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_list(*args, **kwargs)

    async def async_kv_clear(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_clear(*args, **kwargs)


class FakeTQWorkerGroup(FakeWorkerGroup):
    """The v1 worker groups: they take a ``KVBatchMeta``, read their inputs from TransferQueue and write
    their outputs back to it, as verl's engine workers do in v1."""

    def _tokens(self, batch: Any) -> torch.Tensor:
        import transfer_queue as tq

        return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])[
            "input_ids"]

    def _put(self, batch: Any, fields: dict) -> Any:
        import transfer_queue as tq
        from tensordict import TensorDict

        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                               fields=TensorDict(fields, batch_size=[len(batch)]))

    def compute_log_prob(self, batch: Any) -> Any:
        ids = self._tokens(batch)
        tokens = ids.values().float()
        log_probs = -0.05 - 0.1 * torch.remainder(tokens * 7 + self.actor_updates, 5)
        entropy = 0.2 + 0.05 * torch.remainder(tokens, 3)
        return self._put(batch, {"log_probs": _nested(log_probs, ids), "entropy": _nested(entropy, ids)})

    def compute_ref_log_prob(self, batch: Any) -> Any:
        ids = self._tokens(batch)
        return self._put(batch, {"log_probs": _nested(-0.07 - 0.1 * torch.remainder(ids.values().float() * 7, 5),
                                                      ids)})

    def update_actor(self, batch: Any) -> Any:
        import transfer_queue as tq
        from verl.utils import tensordict_utils as tu

        self.actor_updates += 1
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["advantages", "response_mask"])
        k = self.actor_updates
        pg = self.pg_loss(data["advantages"], data["response_mask"])
        metrics = {"pg_loss": [pg, pg * 0.5], "pg_clipfrac": [0.01 * k, 0.02], "ppo_kl": [1e-3 * k, 2e-3],
                   "pg_clipfrac_lower": [0.0, 0.0], "grad_norm": [1.0 / k, 0.5 / k], "lr": 1e-6, "mfu": 0.0}
        return tu.get_tensordict({}, non_tensor_dict={"metrics": metrics})

    def infer_batch(self, batch: Any) -> Any:
        ids = self._tokens(batch)
        self._put(batch, {"values": _nested(0.1 * torch.remainder(ids.values().float(), 4), ids)})
        return SimpleNamespace(futures=[])  # verl ray.get()s these: nothing is in flight here



async def _fake_agent_loop(worker: Any, sampling_params: dict, trajectory: dict, *, agent_name: str,
                           trace: bool = True, **kwargs: Any) -> None:
    """``AgentLoopWorker._run_agent_loop`` with the LLM server faked; verl's TQ post-processing stores it."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    version = worker.weights.version  # the weights the rollout replicas hold now
    sample = int(kwargs["index"]) * 16 + int(kwargs["session_id"])
    gen = generation(worker.tokenizer, worker.config.actor_rollout_ref.rollout, kwargs, int(kwargs["global_steps"]),
                     sample, trajectory["validate"], int(worker.config.data.seed or 0))
    output = AgentLoopOutput(
        prompt_ids=gen["prompt_ids"], response_ids=gen["response_ids"], response_mask=[1] * len(gen["response_ids"]),
        response_logprobs=gen["response_logprobs"], reward_score=gen["reward_score"], num_turns=gen["num_turns"],
        metrics=engine_metrics(gen["response_ids"]),
        extra_fields={**gen["extra_fields"], "min_global_steps": version, "max_global_steps": version})
    await worker._agent_loop_postprocess(output, trajectory["validate"], **kwargs)


class FakeAgentLoopManagerTQ:
    """verl's ``AgentLoopManagerTQ`` with one in-process ``AgentLoopWorkerTQ`` (verl's class, built without
    its Ray/LLM ``__init__``): verl's own ``generate_sequences``/``_run_prompt``/``_agent_loop_postprocess``
    put the samples and their status into TransferQueue; the manager waits for them (a fast rollout)."""

    def __init__(self, config: DictConfig, checkpoint_manager: FakeCheckpointManager) -> None:
        import types

        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

        cls = AgentLoopWorkerTQ.__ray_actor_class__
        worker = cls.__new__(cls)
        worker.config, worker.tokenizer, worker.processor = config, FakeTokenizer(), None
        worker.rollout_config = config.actor_rollout_ref.rollout
        worker.reward_loop_worker_handles = []  # the reward came with the sample: verl skips its reward call
        worker.distillation_enabled = False
        worker.background_tasks = set()
        worker.weights = checkpoint_manager
        worker._run_agent_loop = types.MethodType(_fake_agent_loop, worker)
        self.worker = worker

    def generate_sequences(self, prompts: Any) -> None:
        import asyncio

        asyncio.run(self._generate(prompts))

    async def _generate(self, prompts: Any) -> None:
        import asyncio

        await self.worker.generate_sequences(prompts)
        while self.worker.background_tasks:
            await asyncio.gather(*list(self.worker.background_tasks))


class FakeLLMServerManager:
    def get_client(self) -> None:
        return None

    def get_replicas(self) -> list:
        return []


def submission_ordered(base: type) -> type:
    """verl's replay buffer, its one arbitrary choice made repeatable: which of the equally old finished
    groups a batch takes (verl sorts a set of uuid strings, whose order follows the per-process hash seed;
    here ties go by submission order), so two runs log the same values."""

    class SubmissionOrderedReplayBuffer(base):
        def _select_prompt_uids(self, partition_id: str, sampleable_keys: set[str], batch_size: int) -> Any:
            submitted = [key for key in self.prompt_global_steps[partition_id] if key in sampleable_keys]
            return super()._select_prompt_uids(partition_id, submitted, batch_size)

    return SubmissionOrderedReplayBuffer


def cpu_trainer_class(base: type) -> type:
    """verl's registered v1 trainer with the GPU half of ``_setup`` (worker groups, LLM servers, reward
    workers, checkpoint engine) replaced by the fakes; dataloaders, dump executor and ``_load_checkpoint``
    are verl's."""

    class CpuTrainer(base):
        def _setup(self) -> None:
            self.tokenizer, self.processor = FakeTokenizer(), None
            self._init_dataloader()
            self._init_dump_executor()
            self.resource_pool_manager = FakeResourcePool(self.config)
            self.ref_in_actor = False
            self.actor_rollout_wg = self.ref_policy_wg = self.critic_wg = FakeTQWorkerGroup()
            self.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])
            self.teacher_model_manager = self.distillation_config = None
            self.llm_server_manager = FakeLLMServerManager()
            self.checkpoint_manager = FakeCheckpointManager()
            self.saved_steps: list[int] = []
            self.checkpoint_manager.sleep_replicas()
            self._load_checkpoint()

        def _save_checkpoint(self) -> None:
            self.saved_steps.append(self.global_steps)

        def _build_replay_buffer(self) -> Any:
            buffer = super()._build_replay_buffer()
            buffer.__class__ = submission_ordered(type(buffer))
            return buffer

    CpuTrainer.__name__ = CpuTrainer.__qualname__ = f"Cpu{base.__name__}"
    return CpuTrainer


@contextlib.contextmanager
def v1_fakes(config: DictConfig) -> Iterator[None]:
    """For one v1 run: TransferQueue's API in this process, the data set, and the CPU trainer registered
    under the configured mode; all put back after."""
    import transfer_queue
    from verl.trainer.ppo.v1 import trainer_base

    store = FakeTransferQueue()
    mode = config.trainer.v1.trainer_mode
    saved = {name: getattr(transfer_queue, name) for name in FakeTransferQueue.API}
    saved_dataset, saved_cls = trainer_base.create_rl_dataset, trainer_base.TRAINER_REGISTRY[mode]

    def create_rl_dataset(data_paths: Any, data_config: Any, tokenizer: Any, processor: Any, is_train: bool = True,
                          max_samples: int = -1) -> list[dict]:
        return train_rows(config) if is_train else val_rows(config)

    try:
        for name in FakeTransferQueue.API:
            setattr(transfer_queue, name, getattr(store, name))
        trainer_base.create_rl_dataset = create_rl_dataset
        trainer_base.TRAINER_REGISTRY[mode] = cpu_trainer_class(saved_cls)
        yield
    finally:
        for name, value in saved.items():
            setattr(transfer_queue, name, value)
        trainer_base.create_rl_dataset = saved_dataset
        trainer_base.TRAINER_REGISTRY[mode] = saved_cls


def run_v1(config: DictConfig) -> None:
    """verl's ``TaskRunnerV1.run`` (its class, without Ray): the v1 trainer's ``fit()``, then
    ``finally: tracking.finish(exit_code=0 if succeeded else 1)`` and ``tq.close()``."""
    from verl.trainer.main_ppo import TaskRunnerV1

    seed_everything(config)
    runner = TaskRunnerV1.__ray_actor_class__()

    def init_agent_loop_manager() -> None:  # verl's builds AgentLoopManagerTQ with LLM servers
        runner.agent_loop_manager = FakeAgentLoopManagerTQ(runner.config, runner.trainer.checkpoint_manager)

    runner.init_agent_loop_manager = init_agent_loop_manager
    with v1_fakes(config):
        runner.run(config)


# ------------------------------------------------------------------------------------------------ entry


def run_fit(config: DictConfig) -> None:
    """Run verl's real fit loop (v0 or v1 by ``trainer.use_v1``) against the CPU fakes, in this process."""
    if config.trainer.use_v1:
        run_v1(config)
    else:
        run_v0(config)


# ------------------------------------------------------------------------------------------------ Ray


@ray.remote(num_cpus=0)
class FakeTaskRunner:
    """verl's ``TaskRunner`` / ``TaskRunnerV1`` for ``run_ppo(config, task_runner_class=FakeTaskRunner)``:
    the fit loop (v1: with ``TaskRunnerV1.run``'s ``finally: finish``) runs inside this actor."""

    def run(self, config: DictConfig) -> None:
        run_fit(config)


DROPIN_HOOK = "tracklane.verl.install"
"""Ray's ``worker_process_setup_hook`` that puts tracklane's classes in place of verl's in a worker."""
TRACKER_ENV_PREFIXES = ("WANDB_", "MLFLOW_", "SWANLAB_", "TENSORBOARD_", "VERL_FILE_LOGGER_", "TRACKIO_",
                        "CLEARML_", "TRACKLANE_", "HF_HOME")
"""Not HOME: a Ray worker reads the cluster's auth token under $HOME/.ray and dies at start without it."""


def tracker_env() -> dict[str, str]:
    """The trackers' settings of this process (folders, offline modes), never a credential: what the actor
    must see when it runs in a cluster whose workers were started with another environment."""
    return {name: value for name, value in os.environ.items()
            if name.startswith(TRACKER_ENV_PREFIXES) and not is_secret_key(name)}


def driver_overrides(args: argparse.Namespace) -> list[str]:
    """verl's own ``ray_kwargs.ray_init`` keys for the Ray that ``run_ppo`` starts (none when joining one)."""
    if args.in_process or args.address:
        return []
    extra = ["ray_kwargs.ray_init.num_cpus=1", "+ray_kwargs.ray_init.include_dashboard=false"]
    if args.dropin:
        extra.append(f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={DROPIN_HOOK}")
    return extra


def joined_runtime_env(dropin: bool) -> dict[str, Any]:
    """The job runtime_env for a driver joining a cluster whose workers were started with another
    environment: this process's tracker settings, and the drop-in hook (Ray runs it in each of the job's
    workers before any actor code)."""
    runtime_env: dict[str, Any] = {"env_vars": tracker_env()}
    if dropin:
        runtime_env["worker_process_setup_hook"] = DROPIN_HOOK
    return runtime_env


def joined_task_runner(dropin: bool = False) -> Any:
    """``FakeTaskRunner`` for a process already in a Ray session (a test's): the tracker settings and the
    drop-in hook in the actor's own runtime_env. Ray 2.60 ignores ``worker_process_setup_hook`` in an
    actor's runtime_env (only ``ray.init`` turns it into the variable its workers read at start), so the
    hook goes in as that variable."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    env_vars = tracker_env()
    if dropin:
        env_vars[WORKER_PROCESS_SETUP_HOOK_ENV_VAR] = DROPIN_HOOK
    return FakeTaskRunner.options(runtime_env={"env_vars": env_vars})


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.verl_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="join this Ray cluster instead of letting run_ppo start one")
    parser.add_argument("--dropin", action="store_true", help="tracklane's Tracking in place of verl's")
    parser.add_argument("--in-process", action="store_true", help="run_fit here, no Ray actor")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """The driver: compose, run (here or in a FakeTaskRunner through verl's run_ppo), and exit at once."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray binds 127.0.0.1
    config = compose_verl_config([*driver_overrides(args), *args.overrides])
    if args.in_process:
        if args.dropin:
            from tracklane.verl.dropin import install

            install()
        run_fit(config)
        return  # an in-process trainer ends as a script does: the interpreter exits normally
    from verl.trainer.main_ppo import run_ppo

    if args.address:  # then run_ppo leaves Ray as it is
        ray.init(address=args.address, runtime_env=joined_runtime_env(args.dropin), log_to_driver=True)
    run_ppo(config, task_runner_class=FakeTaskRunner)
    # as a verl driver returning: Ray tears the actor down, nothing is finished or flushed here
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    from tests import verl_fit  # the actor class must be tests.verl_fit's (importable in workers), not __main__'s

    verl_fit.main()
