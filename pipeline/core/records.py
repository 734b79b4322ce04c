"""The typed records that travel from ``Tracking`` to the sinks.

Records hold only plain values (str, int, float, bool, bytes, lists and dicts of them)
so the codec can encode them with msgpack and never needs pickle. Every record has a
``step``, the wall-clock ``time`` of the call that made it, and ``only`` (the backends it
is for, from ``log(..., backend=...)``; None means all).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union, get_args

import numpy as np

from tracklane.core import reduction
from tracklane.core.errors import CodecError
from tracklane.core.histogram import HistogramFigures, histogram_figures

SYSTEM_AXIS = "system/elapsed_s"
"""The axis of the system metrics: seconds since the run started."""


@dataclass(slots=True, kw_only=True)
class Metrics:
    """Scalars logged for one step, keys flattened with ``/``."""

    step: int
    values: Mapping[str, float | int]
    """Metric name -> number; NaN and +-Inf are kept. A dict, except in a lane whose sink reads packed metrics
    (``PackedValues``, core/packed_values.py)."""
    time: float
    only: list[str] | None = None
    axis: str | None = None
    """What ``step`` counts when it is not the trainer's step: a producer's own axis (``rollout/step``,
    ``param_version``) or the system metrics' seconds (``system/elapsed_s``). Each tracker keeps it: wandb
    as the keys' step metric, MLflow and TensorBoard as their step, the file in the line."""
    verl_data: bytes | None = None
    """The ``log()`` call's dict as verl's ``FileLogger`` encodes it (orjson), where ``values`` would not encode the
    same (capture/verl_line.py: bools, numpy float32, strings, nested dicts, lists, an empty dict); the file tracker
    writes it as it is. None: ``values`` encode as verl's would."""

    kind = "metrics"


@dataclass(slots=True, kw_only=True)
class Generations:
    """Validation generations of one step, as verl's ``ValidationGenerationsLogger`` logs them."""

    step: int
    samples: list[list[Any]]
    """Rows of [input: str, output: str, score: float]."""
    time: float
    key: str = "val/generations"
    """Name of the table in the trackers."""
    only: list[str] | None = None

    kind = "generations"


@dataclass(slots=True, kw_only=True)
class Trajectory:
    """One rollout: the conversation, its tool calls, its rewards and where it came from."""

    messages: list[dict[str, str]] = field(default_factory=list)
    """[{"role": ..., "content": ...}, ...]"""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """[{"name": str, "arguments": str, "result": str, "latency_s": float}, ...]"""
    rewards: dict[str, float] = field(default_factory=dict)
    """Reward name -> value; "score" is the one summarised."""
    meta: dict[str, Any] = field(default_factory=dict)
    """{"sample_index": int, "rollout_index": int, "validation": bool, ...}"""
    token_ids: bytes = b""
    """Token ids packed as little-endian int32 (never a list of Python ints)."""

    def token_array(self) -> np.ndarray:
        return np.frombuffer(self.token_ids, dtype="<i4")

    def score(self) -> float:
        if "score" in self.rewards:
            return float(self.rewards["score"])
        return float(sum(self.rewards.values())) if self.rewards else float("nan")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (token ids as a list), for trackers that store JSON."""
        return {"messages": self.messages, "tool_calls": self.tool_calls, "rewards": self.rewards,
                "meta": self.meta, "token_ids": self.token_array().tolist()}


@dataclass(slots=True, kw_only=True)
class Trajectories:
    """Rollout trajectories of one step (a backend's sample of them, or a chunk of a dump)."""

    step: int
    trajectories: Sequence[Trajectory]
    """A list, or ``TrajectoryLines`` (trajectory_lines.py): the rows as the file tracker's JSON lines, which is how
    the pipeline carries them."""
    time: float
    key: str = "rollout/trajectories"
    only: list[str] | None = None

    kind = "trajectories"


@dataclass(slots=True, kw_only=True)
class Histogram:
    """A distribution (rewards, KL per token, ...) of one step."""

    step: int
    name: str
    values: bytes
    """float64 little-endian; use ``array()``. Empty when ``figures`` are carried, as the pipeline ships them."""
    time: float
    only: list[str] | None = None
    figures: HistogramFigures | None = None
    """Bins and summary of ``values``, computed once on the shipper side; use ``summary()``."""

    kind = "histogram"

    def array(self) -> np.ndarray:
        return np.frombuffer(self.values, dtype="<f8")

    def summary(self) -> HistogramFigures:
        """The carried figures (computed here only for a record built without them, as tests do)."""
        return self.figures if self.figures is not None else histogram_figures(self.array())


@dataclass(slots=True, kw_only=True)
class Text:
    """A piece of text of one step."""

    step: int
    name: str
    text: str
    time: float
    only: list[str] | None = None

    kind = "text"


@dataclass(slots=True, kw_only=True)
class Alert:
    """A health rule that fired (core/health_rules.py), at the step it fired on. Every tracker stores it as the
    text ``alert/<rule>``; one with an alert mechanism of its own (wandb, trackio, MLflow, ClearML) uses that too."""

    step: int
    rule: str
    text: str
    """What and why: one line per key the rule fired on."""
    time: float
    level: str = "WARN"
    """``INFO``, ``WARN`` or ``ERROR`` (wandb's and trackio's levels)."""
    only: list[str] | None = None

    kind = "alert"

    @property
    def name(self) -> str:
        """Its name as a text: an Alert reads as a ``Text`` (step, name, text, time, only), so a tracker stores it
        through its text hook, and a batch sent again is recognised record by record as any text is."""
        return f"alert/{self.rule}"


ALERT_LEVELS = ("INFO", "WARN", "ERROR")
ALERT_TITLE = "tracklane: "
"""An alert's title in a tracker's own alerts (wandb, trackio): this, then the rule's name."""


@dataclass(slots=True, kw_only=True)
class Image:
    """An image of one step, PNG-encoded."""

    step: int
    name: str
    png: bytes
    time: float
    only: list[str] | None = None

    kind = "image"


@dataclass(slots=True, kw_only=True)
class Artifact:
    """A file on the trainer's node (checkpoint, dataset, ...) to store with the run."""

    step: int
    path: str
    """Absolute path, readable by the lane actors (they run on the trainer's node)."""
    name: str
    type: str
    time: float
    only: list[str] | None = None

    kind = "artifact"


@dataclass(slots=True, kw_only=True)
class Trace:
    """One traced call of a rollout worker (verl's ``rollout_trace_op``: a tool, an agent loop, a generate call) or
    one span of verl's ``RLInsightLogger`` (``trace_state``, ``trace_span``): pipeline/verl/rollout_traces.py."""

    step: int
    """The trainer step it belongs to (verl's trace attribute ``step``)."""
    time: float
    """When it ended (wall clock)."""
    name: str
    """The op's qualified name (``ToolAgentLoop.run``) or the span's name."""
    start_ns: int
    end_ns: int
    """Wall-clock nanoseconds (``time.time_ns``)."""
    status: str
    """``success`` or ``error``."""
    attributes: dict[str, Any] = field(default_factory=dict)
    """Flat plain values: verl's ``sample_index``, ``step``, ``rollout_n``, ``validate``, ``experiment_name``; the
    worker that traced it (``worker``); a span's labels."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The call as a conversation, as verl renders it for trackio: [{"role": ..., "content": ...}, ...]."""
    metadata: str = "{}"
    """verl's trace metadata (op, inputs, output or exception, status, attributes) as one JSON object's text
    (nested values of any depth travel as text, parsed by the sinks that store them nested)."""
    key: str = "rollout_trace"
    """Where the trackers keep it: verl's trackio key ``rollout_trace/<op>``."""
    only: list[str] | None = None

    kind = "trace"

    def metadata_object(self) -> dict[str, Any]:
        """The metadata parsed (the wire checks only its braces: text that is no JSON object comes as
        ``{"unparsed": text}``)."""
        try:
            parsed = json.loads(self.metadata)
        except ValueError:
            parsed = None
        return parsed if isinstance(parsed, dict) else {"unparsed": self.metadata}


@dataclass(slots=True, kw_only=True)
class Reduction:
    """For the run's reduce lane only (``only``), never a tracker: a producer's values to reduce across producers
    (role ``part``: ``values`` keyed without the producer's prefix, reduced with ``op`` or ``ops[key]``), or one of
    rank 0's notices to the reducer (the roles in core/reduction.py)."""

    step: int
    time: float
    role: str
    values: dict[str, Any] = field(default_factory=dict)
    """part: key -> number; declare: producer name -> 0; ended: sender id -> its last batch; else empty."""
    op: str = ""
    ops: dict[str, str] = field(default_factory=dict)
    only: list[str] | None = field(default_factory=lambda: [reduction.LANE])

    kind = "reduction"


Record = Union[Metrics, Generations, Trajectories, Histogram, Text, Alert, Image, Artifact, Trace, Reduction]
"""Every record kind a sink may receive."""

BULK_KINDS = frozenset({Generations.kind, Trajectories.kind, Image.kind, Artifact.kind, Trace.kind})
"""Kinds that travel in a lane's bulk stream (rollout dumps, tables, media, rollout traces): small records (metrics, params, text,
histograms, the run's health keys) overtake them, and a full buffer never evicts a small record for them."""

RECORD_TYPES: dict[str, type] = {cls.kind: cls for cls in get_args(Record)}
"""Kind tag on the wire -> record class."""


@dataclass(slots=True, kw_only=True)
class Batch:
    """What the shipper sends down every lane: numbered records."""

    seq: int
    """1-based sequence number; lanes acknowledge up to it, in order."""
    created: float
    """Wall-clock time the shipper encoded the batch."""
    records: list[Record] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class RunSpec:
    """What every sink is told when it opens: the run's identity and hyper-parameters."""

    project: str
    experiment: str
    params: dict[str, Any] = field(default_factory=dict)
    """The run's config as nested plain values, secrets already redacted."""
    run_id: str = ""
    """A stable id for this run, shared by all sinks (wandb and SwanLab run id, MLflow tag ``tracklane.run_id``)."""
    resume: bool = False
    """This process continues an earlier run with the same ``run_id`` (training resumed from a
    checkpoint): each sink appends to that run where its tracker allows it."""

    def to_plain(self) -> dict[str, Any]:
        """Its fields as a msgpack-able map (a lane actor's opening, a spool's manifest); ``from_plain`` reads it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, data: Any) -> RunSpec:
        """``to_plain``'s map back; CodecError unless project, experiment and run_id are strings and params a map
        (``resume``, a bool, may be missing: a manifest written before it was kept reads as False)."""
        if not isinstance(data, dict):
            raise CodecError(f"a run must be a map, got {type(data).__name__}")
        for name, kind in (("project", str), ("experiment", str), ("params", dict), ("run_id", str), ("resume", bool)):
            value = data.get(name, False if name == "resume" else None)
            if not isinstance(value, kind):
                raise CodecError(f"a run's {name} must be a {kind.__name__}, got {type(value).__name__}")
        return cls(project=data["project"], experiment=data["experiment"], params=data["params"],
                   run_id=data["run_id"], resume=data.get("resume", False))
