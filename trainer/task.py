"""The built-in verifiable task: multi-digit addition with exact-match reward and partial credit.

A prompt is ``"<bos>12+345="``, the answer ``"357<eos>"``. The score is 1.0 for the exact
answer and otherwise the share of digits right in their place (aligned from the right, over
the longer of answer and response), so 356 for 357 earns 2/3; anything not a number earns 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import TaskConfig


class CharTokenizer:
    """Characters of the task, one token each, plus pad, begin and end tokens."""

    PAD, BOS, EOS = 0, 1, 2
    specials = ("<pad>", "<bos>", "<eos>")
    chars = "0123456789+="

    def __init__(self) -> None:
        self.vocab = [*self.specials, *self.chars]
        self._ids = {c: i for i, c in enumerate(self.vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        return [self._ids[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        """Text up to the first end token; pad and begin tokens are dropped."""
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
    right = sum(r == a for r, a in zip(reversed(response), reversed(answer)))
    return right / max(len(response), len(answer))


class AdditionTask:
    """Samples problems from its own generator (its state goes into checkpoints) and scores answers."""

    name = "addition"

    def __init__(self, cfg: TaskConfig, seed: int) -> None:
        self.cfg = cfg
        self.tokenizer = CharTokenizer()
        self.rng = np.random.default_rng(seed)
        self.val_problems = self._draw(np.random.default_rng(seed + 1_000_003), cfg.val_size)

    def sample(self, count: int) -> list[Problem]:
        return self._draw(self.rng, count)

    def _draw(self, rng: np.random.Generator, count: int) -> list[Problem]:
        problems = []
        for _ in range(count):
            a, b = (self._number(rng) for _ in range(2))
            problems.append(Problem(a, b))
        return problems

    def _number(self, rng: np.random.Generator) -> int:
        digits = int(rng.integers(self.cfg.min_digits, self.cfg.max_digits + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return int(rng.integers(low, 10 ** digits))

    def prompt_ids(self, problem: Problem) -> list[int]:
        return [CharTokenizer.BOS, *self.tokenizer.encode(problem.prompt)]

    def answer_ids(self, problem: Problem) -> list[int]:
        return [*self.tokenizer.encode(problem.answer), CharTokenizer.EOS]

    def max_prompt_length(self) -> int:
        return 1 + 2 * self.cfg.max_digits + 2

    def max_answer_length(self) -> int:
        return self.cfg.max_digits + 2  # digits, a carry, the end token
