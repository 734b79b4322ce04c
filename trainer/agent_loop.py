"""Multi-turn rollouts (verl's agent loop, in small): the policy speaks, a tool answers, the policy goes on.

Each sample starts from its prompt. A turn is sampled until the end token, a tool call's closing
marker (``task.stop_ids``) or the response budget. A turn that ends in a call gets the tool's reply
appended (``task.tool_reply``), and the sample goes on to its next turn, up to ``max_turns``
assistant turns. The samples are then laid out as one ``Rollout``: the response holds every turn
and every tool reply in order, ``response_mask`` is 1 on the policy's tokens only (the loss never
trains on what the tool wrote) and ``response_valid`` on both.

A task without a tool (``addition``) ends every sample after its first turn: the same path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .episode import Episode, Turn
from .rollout import Rollout, RolloutEngine, left_pad
from .task import CharTokenizer, Problem, Task


@dataclass(slots=True)
class Episodes:
    rollout: Rollout
    episodes: list[Episode]


def run_episodes(engine: RolloutEngine, task: Task, problems: list[Problem], n: int, max_response: int,
                 temperature: float, max_turns: int, device: torch.device) -> Episodes:
    """``n`` episodes per problem (row ``i * n + j`` is sample ``j`` of problem ``i``), as one rollout."""
    episodes = [Episode(task.prompt_ids(p)) for p in problems for _ in range(n)]
    contexts = [list(e.prompt_ids) for e in episodes]
    used = [0] * len(episodes)
    open_rows = list(range(len(episodes)))
    for turn in range(max_turns):
        if not open_rows:
            break
        budgets = [max_response - used[i] for i in open_rows]
        out = engine.generate([contexts[i] for i in open_rows], 1, budgets, temperature, task.stop_ids)
        # whole tensors to lists once: row by row, tensor slicing cost more than the model's forward passes
        lengths, responses, logprobs = out.response_mask.sum(-1).long().tolist(), out.responses.tolist(), \
            out.logprobs.tolist()
        still_open = []
        for row, i in enumerate(open_rows):
            ids = responses[row][:lengths[row]]
            if _take_turn(task, episodes[i], contexts[i], ids, logprobs[row][:len(ids)], budgets[row],
                          turn + 1 == max_turns):
                still_open.append(i)
            used[i] = sum(len(t.ids) for t in episodes[i].turns)
        open_rows = still_open
    return Episodes(rollout=_as_rollout(episodes, n, task.tokenizer.PAD, device), episodes=episodes)


def _take_turn(task: Task, episode: Episode, context: list[int], ids: list[int], logprobs: list[float], budget: int,
               last_turn: bool) -> bool:
    """Add one sampled turn (and the tool's reply to a call) to the episode; True when it goes on."""
    stopped = bool(ids) and ids[-1] in task.stop_ids
    episode.turns.append(Turn("assistant", ids, logprobs, is_call=stopped))
    context.extend(ids)
    if not stopped:
        episode.ended = "answer" if ids and ids[-1] == CharTokenizer.EOS else "length"
        return False
    started = time.perf_counter()
    call, reply = task.tool_reply(ids)
    call.latency_s = time.perf_counter() - started
    episode.calls.append(call)
    reply = reply[:max(budget - len(ids), 0)]
    if reply:
        episode.turns.append(Turn("tool", reply))
        context.extend(reply)
    if last_turn or len(ids) + len(reply) >= budget:
        episode.ended = "turns" if last_turn else "length"
        return False
    return True


def _as_rollout(episodes: list[Episode], n: int, pad: int, device: torch.device) -> Rollout:
    """The episodes as one batch: prompts left-padded, responses (turns and tool replies) right-padded."""
    prompts, prompt_valid = left_pad([e.prompt_ids for e in episodes], pad, device)
    width = max(1, max(len(e.response_ids()) for e in episodes))
    responses, mask, valid, logprobs = [], [], [], []
    for episode in episodes:  # plain lists, one tensor each at the end
        ids, policy, lp = [], [], []
        for turn in episode.turns:
            ids += turn.ids
            policy += [turn.role == "assistant"] * len(turn.ids)
            lp += turn.logprobs if turn.role == "assistant" else [0.0] * len(turn.ids)
        fill = width - len(ids)
        responses.append(ids + [pad] * fill)
        mask.append(policy + [False] * fill)
        valid.append([True] * len(ids) + [False] * fill)
        logprobs.append(lp + [0.0] * fill)
    return Rollout(prompts=prompts, prompt_valid=prompt_valid, responses=torch.tensor(responses, device=device),
                   response_mask=torch.tensor(mask, dtype=torch.float32, device=device),
                   logprobs=torch.tensor(logprobs, dtype=torch.float32, device=device), n=n,
                   response_valid=torch.tensor(valid, device=device))
