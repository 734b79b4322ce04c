"""Where lane actors run: pinned to the trainer's node by default, anywhere a placement says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tests.conftest import same_value, verl_metrics
from tracklane import ConfigError
from tracklane.config.placement import lane_actor_options, lane_env
from tracklane.workers.testing.readers.file_reader import file_lines
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

ROOT = Path(__file__).resolve().parents[2]
ENV = {"WANDB_MODE": "offline", "WANDB_API_KEY": "sk-secret"}
TRAINER_NODE, OTHER_NODE = "ab" * 28, "cd" * 28  # Ray node ids are 28 bytes, in hex


def test_lanes_stay_on_the_trainers_node_unless_placed():
    """No placement: a hard pin to the trainer's node. resources, label_selector or node_id: no pin to it."""
    plain = lane_actor_options({}, 3, TRAINER_NODE)
    assert isinstance(plain["scheduling_strategy"], NodeAffinitySchedulingStrategy)
    assert (plain["scheduling_strategy"].node_id, plain["scheduling_strategy"].soft) == (TRAINER_NODE, False)
    assert (plain["num_cpus"], plain["max_restarts"], plain["max_task_retries"]) == (0, 3, 0)
    assert "runtime_env" not in plain  # Ray starts such an actor through setup_worker: a second interpreter
    assert lane_env({}, ENV) == {"WANDB_MODE": "offline"}  # in the opening; the API key is not forwarded

    for placement in ({"resources": {"logging_node": 0.01}}, {"label_selector": {"role": "logging"}}):
        options = lane_actor_options(placement, 3, TRAINER_NODE)
        assert "scheduling_strategy" not in options and set(placement) <= set(options)
    by_id = lane_actor_options({"node_id": OTHER_NODE, "num_cpus": 0.5}, 3, TRAINER_NODE)
    assert (by_id["scheduling_strategy"].node_id, by_id["num_cpus"]) == (OTHER_NODE, 0.5) and "node_id" not in by_id
    with pytest.raises(ConfigError, match="node_id: Invalid node_id 'node-7'"):
        lane_actor_options({"node_id": "node-7"}, 3, TRAINER_NODE)


def test_a_users_runtime_env_passes_and_wins_and_secrets_are_refused():
    """A placement's runtime_env passes through, and its env_vars win over the forwarded tracker settings; a
    secret in it, or tracklane's own restart options, are refused with a clear error."""
    user = {"runtime_env": {"env_vars": {"WANDB_MODE": "disabled", "X": "1"}, "pip": ["a"]}}
    options = lane_actor_options(user, 3, TRAINER_NODE)
    assert options["runtime_env"] == {"env_vars": {"WANDB_MODE": "disabled", "X": "1"}, "pip": ["a"]}
    assert lane_env(user, {**ENV, "MLFLOW_RUN_ID": "r1"}) == {"MLFLOW_RUN_ID": "r1"}
    with pytest.raises(ConfigError, match="WANDB_API_KEY.*environment of the Ray nodes"):
        lane_actor_options({"runtime_env": {"env_vars": {"WANDB_API_KEY": "sk-secret"}}}, 3, TRAINER_NODE)
    with pytest.raises(ConfigError, match="max_task_retries is tracklane's own"):
        lane_actor_options({"max_task_retries": 2}, 3, TRAINER_NODE)


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_lanes_placed_on_a_second_node_deliver_every_record(offline_trackers, tmp_path):
    """A 2-node Ray cluster on this machine; the lanes go to the node offering `logging_node`: each lane ran
    there (its node id), its "where" says it is not the trainer's node, and TensorBoard and the file hold every
    point exactly once."""
    steps = 200
    # Ray >= 2.60 turns token auth on for a new local cluster by setting RAY_AUTH_MODE=token in the process
    # that started it (this suite's shared session), with the token under that moment's HOME. The child's own
    # cluster must not inherit that mode without the token: its GCS would abort at start.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    done = subprocess.run([sys.executable, "-m", "tests.two_node_run", str(tmp_path), str(steps)], cwd=ROOT,
                          capture_output=True, text=True, timeout=540, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["complete"], result["summary"]
    assert result["logging_node"] != result["trainer_node"]
    assert result["lanes"] == {"tensorboard": result["logging_node"], "file": result["logging_node"]}
    assert all("not the trainer's" in where for where in result["where"].values()), result["where"]

    logged = {step: {k: float(v) for k, v in verl_metrics(step, keys=20).items()} for step in range(steps)}
    board = read_tensorboard_dir(offline_trackers["tensorboard"])
    lines = file_lines(offline_trackers["file"])
    file_points = [(line["step"], key, value) for line in lines if line["step"] is not None
                   for key, value in line["data"].items()]
    for points, stored in ((board.points, lambda v: float(np.float32(v))), (file_points, float)):
        mine = [(s, k, v) for s, k, v in points if not k.startswith("tracklane/")]
        assert len(mine) == len({(s, k) for s, k, _ in mine}) == sum(len(v) for v in logged.values())
        assert all(same_value(v, stored(logged[s][k])) for s, k, v in mine)  # TensorBoard keeps float32
