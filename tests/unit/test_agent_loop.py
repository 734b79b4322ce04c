"""The tool-use task and the multi-turn agent loop: calls, replies, masks, budgets and rewards."""

from __future__ import annotations

import torch

from tracklane.trainer.agent_loop import run_episodes
from tracklane.trainer.config import load_config
from tracklane.trainer.model import GPT
from tracklane.trainer.rewards import episode_metrics, reward_metrics, score_episodes, skewness
from tracklane.trainer.rollout import Rollout, make_engine
from tracklane.trainer.task import Problem
from tracklane.trainer.tool_task import ToolAdditionTask, calculator

CPU = torch.device("cpu")


def _task(*overrides: str) -> ToolAdditionTask:
    return ToolAdditionTask(load_config(list(overrides)).task, seed=0)


class Scripted:
    """A rollout engine that answers each turn from a script: turn k of every sample is ``script[k]``."""

    def __init__(self, task: ToolAdditionTask, script: list[str]) -> None:
        self.task, self.script, self.turn, self.limits = task, script, 0, []

    def generate(self, prompts, n, max_new_tokens, temperature, stop_ids=()):
        text = self.script[self.turn]
        self.turn += 1
        self.limits.append(list(max_new_tokens))
        ids = _encode(self.task, text)
        rows = len(prompts) * n
        responses = torch.tensor([ids] * rows)
        stops = [self.task.tokenizer.EOS, *stop_ids]
        first_stop = next((i for i, t in enumerate(ids) if t in stops), len(ids) - 1)
        mask = torch.zeros(rows, len(ids))
        mask[:, :first_stop + 1] = 1.0
        return Rollout(prompts=torch.zeros(rows, 1, dtype=torch.long), prompt_valid=torch.ones(rows, 1, dtype=torch.bool),
                       responses=responses, response_mask=mask, logprobs=-0.5 * mask, n=n)


def _encode(task: ToolAdditionTask, text: str) -> list[int]:
    """Text with markers and "<eos>" written out, as ids."""
    tok, ids, i = task.tokenizer, [], 0
    while i < len(text):
        marker = next((m for m in ("<call>", "</call>", "<tool>", "</tool>", "<eos>") if text.startswith(m, i)), None)
        if marker is not None:
            ids.append(tok.EOS if marker == "<eos>" else tok.id(marker))
            i += len(marker)
        else:
            ids.append(tok.id(text[i]))
            i += 1
    return ids


def test_calculator_adds_and_refuses_anything_else():
    """The tool sums a+b[+c]; anything that is not that is refused (None), never evaluated."""
    assert calculator("37+48") == "85" and calculator("1+2+3") == "6"
    assert calculator("3*4") is None and calculator("") is None and calculator("+1") is None
    assert calculator("__import__('os')") is None


def test_a_call_then_an_answer_is_two_turns_with_the_tool_reply_masked_out_of_the_loss():
    """Turn 1 calls, the tool's reply is appended, turn 2 answers: the response holds all three in order,
    response_mask is 1 on the policy's tokens only, response_valid on all, and the rewards are full."""
    task = _task()
    problem = Problem(37, 48)
    engine = Scripted(task, ["<call>37+48</call>", "85<eos>"])
    out = run_episodes(engine, task, [problem], 1, 28, 1.0, 3, CPU)
    [episode] = out.episodes
    assert [turn.role for turn in episode.turns] == ["assistant", "tool", "assistant"] and episode.ended == "answer"
    assert [(c.arguments, c.result, c.ok) for c in episode.calls] == [('{"expression": "37+48"}', "85", True)]
    call, reply, answer = (_encode(task, t) for t in ("<call>37+48</call>", "<tool>85</tool>", "85<eos>"))
    assert out.rollout.responses[0].tolist() == call + reply + answer
    assert out.rollout.response_mask[0].tolist() == [1.0] * len(call) + [0.0] * len(reply) + [1.0] * len(answer)
    assert out.rollout.response_valid[0].all()
    assert out.rollout.logprobs[0].tolist() == [-0.5] * len(call) + [0.0] * len(reply) + [-0.5] * len(answer)
    assert engine.limits == [[28], [28 - len(call) - len(reply)]]  # the second turn gets what the first left
    scored = score_episodes(task, [problem], out.episodes, CPU)
    assert scored.components == {"correct": [1.0], "tool": [0.2], "format": [0.1]} and scored.exact == [True]
    assert abs(float(scored.scores[0]) - 1.3) < 1e-6


def test_a_bad_call_gets_an_empty_reply_and_no_tool_or_format_reward():
    """A call the calculator cannot run is answered with an empty reply and an error result."""
    task = _task()
    out = run_episodes(Scripted(task, ["<call>3=4</call>", "85<eos>"]), task, [Problem(37, 48)], 1, 28, 1.0, 3, CPU)
    [episode] = out.episodes
    assert episode.calls[0].ok is False and episode.calls[0].result.startswith("error")
    assert episode.turns[1].ids == _encode(task, "<tool></tool>")
    scored = score_episodes(task, [Problem(37, 48)], out.episodes, CPU)
    assert scored.components == {"correct": [1.0], "tool": [0.0], "format": [0.0]}


def test_the_last_turn_ending_in_a_call_has_no_answer():
    """A call in the last allowed turn ends the episode with no answer: no correctness, no format reward."""
    task = _task()
    out = run_episodes(Scripted(task, ["<call>1+1</call>", "<call>2+2</call>"]), task, [Problem(1, 1)], 2, 28, 1.0,
                       2, CPU)
    assert all(e.ended == "turns" and len(e.calls) == 2 for e in out.episodes)
    scored = score_episodes(task, [Problem(1, 1)] * 2, out.episodes, CPU)
    assert scored.components == {"correct": [0.0, 0.0], "tool": [0.2, 0.2], "format": [0.0, 0.0]}
    assert episode_metrics(out.episodes)["num_turns/mean"] == 2.0


def test_a_direct_answer_is_one_turn_and_the_torch_engine_keeps_each_rows_budget():
    """With the real engine, every sample stays within its budget and its positions within the model."""
    task = _task()
    cfg = load_config([])
    budget = task.max_response_length()
    model = GPT(cfg.actor_rollout_ref.model, task.tokenizer.vocab_size, task.max_prompt_length() + budget)
    problems = task.sample(16)
    out = run_episodes(make_engine("torch", model, task.tokenizer), task, problems, 4, budget, 1.0, 3, CPU)
    lengths = [len(e.response_ids()) for e in out.episodes]
    assert max(lengths) <= budget and out.rollout.responses.shape == (64, max(lengths))
    assert all(len(e.assistant_turns()) <= 3 for e in out.episodes)
    assert (out.rollout.response_mask.bool() <= out.rollout.response_valid).all()


def test_reward_metrics_by_component_and_data_source():
    """reward/<component>/mean over the batch and reward/<source>/<component>/mean per data source."""
    task = _task()
    problems = [Problem(3, 4), Problem(37, 48)]
    episodes = run_episodes(Scripted(task, ["7<eos>"]), task, problems, 1, 28, 1.0, 3, CPU).episodes
    metrics = reward_metrics(score_episodes(task, problems, episodes, CPU))
    assert metrics["reward/correct/mean"] == 0.5 and metrics["reward/tool/mean"] == 0.0
    assert metrics["reward/tool_addition_1digit/correct/mean"] == 1.0
    assert metrics["reward/tool_addition_2digit/correct/mean"] == 0.0
    assert abs(metrics["reward/tool_addition_1digit/score/mean"] - 1.1) < 1e-6


def test_skewness_of_a_known_sample():
    """The third standardised moment: 0 for a symmetric sample, positive for a long right tail."""
    import numpy as np

    assert skewness(np.array([1.0, 2.0, 3.0])) == 0.0 and skewness(np.array([2.0, 2.0])) == 0.0
    assert abs(skewness(np.array([0.0, 0.0, 0.0, 1.0])) - 1.1547005) < 1e-6
