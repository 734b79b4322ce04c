"""The built-in verifiable task: addition with exact-match reward and partial credit, answered directly.

A prompt is ``"<bos>12+345="``, the answer ``"357<eos>"``. The score is 1.0 for the exact
answer and otherwise the share of digits right in their place (aligned from the right, over
the longer of answer and response), so 356 for 357 earns 2/3; anything not a number earns 0.
``trainer/tool_task.py`` is the same problems with a calculator tool over several turns.

What a task gives the trainer (``Task``): problems, their prompt ids, the teacher's response for the
warm-up, the tool's reply to an assistant turn (none here), and the reward's components.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .config import TaskConfig

if TYPE_CHECKING:
    from .episode import Episode, ToolCall


class CharTokenizer:
    """Characters of the task, one token each, plus pad, begin and end tokens and the task's markers."""

    PAD, BOS, EOS = 0, 1, 2
    specials = ("<pad>", "<bos>", "<eos>")
    chars = "0123456789+="

    def __init__(self, markers: tuple[str, ...] = ()) -> None:
        self.vocab = [*self.specials, *self.chars, *markers]
        self._ids = {c: i for i, c in enumerate(self.vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def id(self, token: str) -> int:
        """The id of one character or marker."""
        return self._ids[token]

    def encode(self, text: str) -> list[int]:
        return [self._ids[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        """Text up to the first end token; pad and begin tokens are dropped, markers written out."""
        out = []
        for i in ids:
            if i == self.EOS:
                break
            if i > self.EOS:
                out.append(self.vocab[i])
        return "".join(out)


@dataclass(frozen=True, slots=True)
class Problem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def digits(self) -> int:
        """The longer operand's digit count: the problem's difficulty."""
        return max(len(str(self.a)), len(str(self.b)))


def score(response: str, answer: str) -> float:
    """1.0 for the exact answer, else the share of digits right in their place; 0 if not a number."""
    if response == answer:
        return 1.0
    if not response.isdigit():
        return 0.0
    right = sum(r == a for r, a in zip(reversed(response), reversed(answer), strict=False))
    return right / max(len(response), len(answer))


class Task(Protocol):
    """What the trainer, the agent loop, the warm-up and validation need of a task."""

    name: str
    tokenizer: CharTokenizer
    rng: np.random.Generator
    val_problems: list[Problem]
    stop_ids: tuple[int, ...]
    """Tokens besides the end token that end an assistant turn (a tool call's closing marker)."""
    components: tuple[str, ...]
    """The reward's components, in the order they are logged; the score is their sum."""

    def sample(self, count: int) -> list[Problem]: ...
    def data_source(self, problem: Problem) -> str: ...
    def prompt_ids(self, problem: Problem) -> list[int]: ...
    def max_prompt_length(self) -> int: ...
    def max_response_length(self) -> int: ...
    def teacher(self, problem: Problem, use_tool: bool = False) -> tuple[list[int], list[bool]]: ...
    def tool_reply(self, turn_ids: list[int]) -> tuple[ToolCall, list[int]]: ...
    def rewards(self, problem: Problem, episode: Episode) -> dict[str, float]: ...


class AdditionTask:
    """Samples problems from its own generator (its state goes into checkpoints) and scores answers."""

    name = "addition"
    stop_ids: tuple[int, ...] = ()
    components: tuple[str, ...] = ("correct",)

    def __init__(self, cfg: TaskConfig, seed: int) -> None:
        self.cfg = cfg
        self.tokenizer = self._tokenizer()
        self.rng = np.random.default_rng(seed)
        self.val_problems = self._draw(np.random.default_rng(seed + 1_000_003), cfg.val_size)

    def _tokenizer(self) -> CharTokenizer:
        return CharTokenizer()

    def sample(self, count: int) -> list[Problem]:
        return self._draw(self.rng, count)

    def _draw(self, rng: np.random.Generator, count: int) -> list[Problem]:
        problems = []
        for _ in range(count):
            a, b = (self._number(rng) for _ in range(2))
            problems.append(Problem(a, b))
        return problems

    def _number(self, rng: np.random.Generator) -> int:
        digits = int(rng.integers(self.cfg.min_digits, self.cfg.digits_up_to + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return int(rng.integers(low, 10 ** digits))

    def data_source(self, problem: Problem) -> str:
        """verl's data_source of a sample: its difficulty, e.g. ``addition_2digit``."""
        return f"{self.name}_{problem.digits}digit"

    def prompt_ids(self, problem: Problem) -> list[int]:
        return [CharTokenizer.BOS, *self.tokenizer.encode(problem.prompt)]

    def answer_ids(self, problem: Problem) -> list[int]:
        return [*self.tokenizer.encode(problem.answer), CharTokenizer.EOS]

    def max_prompt_length(self) -> int:
        return 1 + 2 * self.cfg.digits_up_to + 2

    def max_response_length(self) -> int:
        """The answer's digits, a carry and the end token, with two to spare."""
        return self.cfg.digits_up_to + 4

    def teacher(self, problem: Problem, use_tool: bool = False) -> tuple[list[int], list[bool]]:
        """The warm-up's response and which of its tokens the loss sees: the exact answer, all of it (no tool)."""
        ids = self.answer_ids(problem)
        return ids, [True] * len(ids)

    def tool_reply(self, turn_ids: list[int]) -> tuple[ToolCall, list[int]]:
        raise AssertionError("the addition task has no tool: no turn ends in a call")

    def rewards(self, problem: Problem, episode: Episode) -> dict[str, float]:
        """One component: the answer's partial credit (0 when the response has no answer)."""
        answer = episode.answer(self.tokenizer)
        return {"correct": score(answer, problem.answer) if answer is not None else 0.0}
