"""A step's sample as Markdown: the conversation turn by turn, the tool calls, and the reward by component."""

from __future__ import annotations

from .episode import Episode
from .rewards import Scored
from .task import Problem, Task


def _code(text: str) -> str:
    """Inline code (a text with a backtick gets the double fence that holds one)."""
    if not text:
        return "*(empty)*"
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def markdown_sample(task: Task, step: int, problem: Problem, episode: Episode, scored: Scored, row: int,
                    title: str) -> str:
    """``row`` is the episode's row in the step's batch (its rewards in ``scored``)."""
    lines = [f"### Step {step}: {title} ({scored.sources[row]}, {len(episode.assistant_turns())} turn(s), "
             f"ended: {episode.ended})", "", f"**user**: {_code(problem.prompt)}", ""]
    calls = iter(episode.calls)
    for turn in episode.turns:
        if turn.role == "assistant":
            lines += [f"**assistant** ({len(turn.ids)} tokens): {_code(task.tokenizer.decode(turn.ids))}", ""]
        else:
            call = next(calls)
            lines += [f"**tool** `{call.name}({call.arguments})` -> {_code(call.result)}", ""]
    lines += [f"Expected answer: {_code(problem.answer)}", "", "| reward | value |", "|---|---|"]
    lines += [f"| {name} | {values[row]:.2f} |" for name, values in scored.components.items()]
    lines.append(f"| **score** | **{float(scored.scores[row]):.2f}** |")
    return "\n".join(lines) + "\n"


def markdown_samples(task: Task, step: int, problems: list[Problem], episodes: list[Episode], scored: Scored,
                     n: int) -> str:
    """The step's best- and worst-scoring samples (``problems[i // n]`` is episode ``i``'s problem)."""
    best, worst = int(scored.scores.argmax()), int(scored.scores.argmin())
    return "\n".join(markdown_sample(task, step, problems[row // n], episodes[row], scored, row, title)
                     for row, title in ((best, "best sample"), (worst, "worst sample")))
