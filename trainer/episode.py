"""One sample's multi-turn exchange: its turns, the tool calls it made, how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


@dataclass(slots=True)
class ToolCall:
    """One call the policy made and what the tool answered."""

    name: str
    arguments: str
    result: str
    ok: bool
    """The call parsed and the tool returned a result."""
    latency_s: float = 0.0


@dataclass(slots=True)
class Turn:
    role: str
    """"assistant" (sampled from the policy) or "tool" (written by the tool)."""
    ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    """The engine's log-probability of each sampled token (assistant turns only)."""
    is_call: bool = False
    """An assistant turn that ended in a tool call."""


@dataclass(slots=True)
class Episode:
    """One sample's whole exchange."""

    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    ended: str = ""
    """"answer" (an end token), "turns" (max_turns reached with a call open) or "length" (the budget)."""

    def response_ids(self) -> list[int]:
        return [i for turn in self.turns for i in turn.ids]

    def assistant_turns(self) -> list[Turn]:
        return [turn for turn in self.turns if turn.role == "assistant"]

    def answer(self, tokenizer: Decoder) -> str | None:
        """The text of the last assistant turn when it is not a tool call; None when the sample never answered."""
        turns = self.assistant_turns()
        if not turns or turns[-1].is_call:
            return None
        return tokenizer.decode(turns[-1].ids)
