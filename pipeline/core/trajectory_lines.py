"""Rollout trajectories as JSON lines: how a rollout dump travels and how the file tracker stores it.

A rollout dump is the biggest thing a step logs (hundreds of MB in a large job). Its rows are rendered once,
on the shipper thread, as the JSON lines the file tracker writes (``{**Trajectory.as_dict(), "step": N}``,
encoded by orjson like verl's ``FileLogger``: compact, NaN and +-Inf as ``null``). The file tracker appends
those bytes as they are, so its lane decodes no object at all (measured on 16,384 trajectories of 4,000
characters: msgpack's decode of the objects alone cost 0.30 s, more than orjson's whole encoding, 0.26 s).
Any other tracker iterates ``TrajectoryLines`` like a list of ``Trajectory``: each line is parsed and checked
when it is read.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import orjson

from tracklane.core.errors import CodecError
from tracklane.core.records import Trajectory

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_PLAIN = (str, int, float, bool, type(None))


def trajectory_line(trajectory: Trajectory, step: int) -> bytes:
    """One row of the file tracker's ``<name>_rollouts/<step>.jsonl``, newline included."""
    row = {"messages": trajectory.messages, "tool_calls": trajectory.tool_calls, "rewards": trajectory.rewards,
           "meta": trajectory.meta, "token_ids": np.frombuffer(trajectory.token_ids, dtype="<i4"), "step": step}
    try:
        return orjson.dumps(row, option=_OPTIONS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # a lone surrogate (an os.fsdecode'd name, say) has no UTF-8: written as "?"
        return orjson.dumps(_utf8(row), option=_OPTIONS | orjson.OPT_APPEND_NEWLINE)


def _utf8(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    return value


class TrajectoryLines(Sequence[Trajectory]):
    """Trajectories of one step held as their JSON lines (``lines``): a ``Sequence[Trajectory]`` parsed on demand."""

    __slots__ = ("lines", "rows", "step")

    def __init__(self, lines: bytes | memoryview, rows: int, step: int) -> None:
        """``lines``: ``rows`` JSON objects, each ending with a newline, each with ``"step": step`` (a lane's are a
        view of the batch it decoded: never copied)."""
        self.lines = lines
        self.rows = rows
        self.step = step

    @classmethod
    def render(cls, trajectories: Sequence[Trajectory], step: int) -> TrajectoryLines:
        return cls(b"".join(trajectory_line(t, step) for t in trajectories), len(trajectories), step)

    def check(self) -> None:
        """Cheap checks of lines that came from elsewhere (CodecError): UTF-8, a JSON object first and last, each
        line ended. Each row's fields are checked when it is parsed; the file tracker appends the bytes as they are
        (counting their lines too cost more than appending them: 0.6 ms/MB)."""
        lines = self.lines
        if self.rows < 0 or (self.rows == 0) != (not len(lines)):
            raise CodecError("malformed batch: trajectory lines and their count disagree")
        if len(lines) and (bytes(lines[:1]) != b"{" or bytes(lines[-2:]) != b"}\n"):
            raise CodecError("malformed batch: trajectory lines are not JSON objects, one a line")
        if len(lines) and np.frombuffer(lines, dtype=np.uint8).max() >= 0x80:  # ASCII answers in ~0.1 ms/MB
            try:
                codecs.utf_8_decode(lines, "strict", True)
            except UnicodeDecodeError as exc:
                raise CodecError(f"malformed batch: trajectory lines are not UTF-8: {exc}") from None

    def __len__(self) -> int:
        return self.rows

    @overload
    def __getitem__(self, index: int) -> Trajectory: ...

    @overload
    def __getitem__(self, index: slice) -> list[Trajectory]: ...

    def __getitem__(self, index: int | slice) -> Trajectory | list[Trajectory]:
        return list(self)[index]

    def __iter__(self) -> Iterator[Trajectory]:
        for line in bytes(self.lines).splitlines():
            yield parse_line(line)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TrajectoryLines):
            return bytes(self.lines) == bytes(other.lines)
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"TrajectoryLines({self.rows} rows, {len(self.lines)} bytes, step {self.step})"


def parse_line(line: bytes) -> Trajectory:
    """One JSON line back as a ``Trajectory`` (null rewards as NaN); CodecError for anything malformed."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"malformed trajectory line: {exc}") from None
    if not isinstance(row, dict):
        raise CodecError("malformed trajectory line: not an object")
    messages, calls, rewards, meta, tokens = (row.get(name) for name in
                                              ("messages", "tool_calls", "rewards", "meta", "token_ids"))
    if not (isinstance(messages, list) and all(_str_map(m, (str,)) for m in messages)
            and isinstance(calls, list) and all(_str_map(c, _PLAIN) for c in calls)
            and _str_map(rewards, (int, float, type(None))) and _str_map(meta, _PLAIN)
            and isinstance(tokens, list) and all(type(t) is int and -2**31 <= t < 2**31 for t in tokens)):
        raise CodecError("malformed trajectory line: a field has the wrong shape")
    assert isinstance(meta, dict) and isinstance(rewards, dict)  # checked above
    return Trajectory(messages=messages, tool_calls=calls, meta=meta,
                      rewards={k: math.nan if v is None else float(v) for k, v in rewards.items()},
                      token_ids=np.asarray(tokens, dtype="<i4").tobytes())


def _str_map(value: Any, kinds: tuple[type, ...]) -> bool:
    return type(value) is dict and all(type(k) is str and type(v) in kinds for k, v in value.items())
