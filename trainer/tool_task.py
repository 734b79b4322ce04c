"""The default task: addition with a calculator tool, over several turns (verl's multi-turn tool use, in small).

The prompt is the same as the addition task's (``"<bos>37+48="``). In a turn the policy either
answers (``"85<eos>"``) or calls the calculator (``"<call>37+48</call>"``); the environment then
appends the tool's reply (``"<tool>85</tool>"``, or ``"<tool></tool>"`` for a call it cannot run)
and the policy takes its next turn, up to ``actor_rollout_ref.rollout.multi_turn.max_assistant_turns``.

The reward has three components, summed into the score the advantage is computed from:
``correct`` (the answer's partial credit, 0..1), ``tool`` (0.2 when a call ran) and ``format``
(0.1 when every turn is a well-formed call or a number ended by the end token). Problems mix one-
and two-digit operands (data sources ``tool_addition_1digit`` and ``tool_addition_2digit``): a tiny
model adds one-digit numbers in its head but needs the tool for two; the warm-up shows it the tool on
a quarter of its examples, and RL finds out how much the tool pays.
"""

from __future__ import annotations

import re

from .episode import Episode, ToolCall
from .task import AdditionTask, CharTokenizer, Problem, score

CALL, END_CALL, TOOL, END_TOOL = "<call>", "</call>", "<tool>", "</tool>"
TOOL_NAME = "calculator"
CORRECT, TOOL_USE, FORMAT = 1.0, 0.2, 0.1
"""Most each component pays."""
_EXPRESSION = re.compile(r"\d{1,12}(\+\d{1,12})*")


def calculator(expression: str) -> str | None:
    """The sum of ``"a+b[+c...]"`` as digits; None for anything else."""
    if not _EXPRESSION.fullmatch(expression):
        return None
    return str(sum(int(term) for term in expression.split("+")))


class ToolAdditionTask(AdditionTask):
    name = "tool_addition"
    components = ("correct", "tool", "format")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        tok = self.tokenizer
        self.stop_ids = (tok.id(END_CALL),)
        self._call, self._end_call = tok.id(CALL), tok.id(END_CALL)
        self._tool, self._end_tool = tok.id(TOOL), tok.id(END_TOOL)

    def _tokenizer(self) -> CharTokenizer:
        return CharTokenizer(markers=(CALL, END_CALL, TOOL, END_TOOL))

    def max_response_length(self) -> int:
        """A call, the reply, the answer with its end token, and room for one more call."""
        call = 2 + 2 * self.cfg.digits_up_to + 1
        reply = 2 + self.cfg.digits_up_to + 1
        return 2 * (call + reply) + self.cfg.digits_up_to + 2

    def teacher(self, problem: Problem, use_tool: bool = False) -> tuple[list[int], list[bool]]:
        """A direct answer, or (``use_tool``) a call, the tool's reply (left out of the loss) and the answer."""
        answer = self.answer_ids(problem)
        if not use_tool:
            return answer, [True] * len(answer)
        call = [self._call, *self.tokenizer.encode(f"{problem.a}+{problem.b}"), self._end_call]
        reply = self._reply(problem.answer)
        return [*call, *reply, *answer], [True] * len(call) + [False] * len(reply) + [True] * len(answer)

    def tool_reply(self, turn_ids: list[int]) -> tuple[ToolCall, list[int]]:
        """Run the call a turn ends with: the call as the trajectory shows it, and the reply's tokens."""
        text = self.tokenizer.decode(turn_ids)
        inner = text[len(CALL):-len(END_CALL)] if text.startswith(CALL) and text.endswith(END_CALL) else None
        result = calculator(inner) if inner is not None else None
        arguments = f'{{"expression": "{inner if inner is not None else text}"}}'
        if result is None:
            return ToolCall(TOOL_NAME, arguments, "error: expected <call>a+b</call>", ok=False), self._reply("")
        return ToolCall(TOOL_NAME, arguments, result, ok=True), self._reply(result)

    def _reply(self, result: str) -> list[int]:
        return [self._tool, *self.tokenizer.encode(result), self._end_tool]

    def rewards(self, problem: Problem, episode: Episode) -> dict[str, float]:
        answer = episode.answer(self.tokenizer)
        answered = answer is not None and episode.ended == "answer" and answer.isdigit()
        return {"correct": CORRECT * score(answer, problem.answer) if answer is not None else 0.0,
                "tool": TOOL_USE if any(call.ok for call in episode.calls) else 0.0,
                "format": FORMAT if answered and all(call.ok for call in episode.calls) else 0.0}
