"""A run's rollouts as the viewer shows them: read from a spool or the file tracker's folder, again when it changes.

Reading goes through the migration sources (``pipeline/host/source.py``: the file tracker's ``FileSource``, the
spool's ``SpoolSource``), so the viewer knows no storage format of its own and opens every file read-only. While
a run writes, ``snapshot()`` re-reads when a file under the run changed (sizes and modification times, looked at
most once a ``RECHECK_S``, or three times as long as the last read took); a read that fails meanwhile (a line
half written) keeps the last good snapshot and says why.

A step's rollout traces (``Trace``: verl's traced agent loops, tool and generate calls, and spans) come with its
rollouts: each with its start relative to the step's first, its duration, status, attributes, messages and parsed
metadata, every string cut to ``TRACE_TEXT_CHARS`` and every list to ``TRACE_LIST_ITEMS`` for the page (``cut``
counts what was cut), and the rollout it belongs to when a trajectory's meta has the same sample and rollout index.
"""

from __future__ import annotations

import json
import math
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklane.core.errors import ConfigError
from tracklane.core.records import Alert, Generations, Metrics, Record, Text, Trace, Trajectories, Trajectory
from tracklane.host.registry import source_class
from tracklane.spool.manifest import RunManifest

RECHECK_S = 1.0
SCORE_WORDS = ("score", "reward", "acc")  # a step's metrics shown beside its rollouts: keys holding one of these
MAX_STEP_METRICS = 16
TRACE_TEXT_CHARS = 2000  # a trace's strings on the page (a generate call's prompt can be the whole conversation)
TRACE_LIST_ITEMS = 64  # a trace's lists on the page (a generate call's output holds every token id)
CHART_KEYS = ("critic/score/mean", "actor/kl_loss", "actor/entropy", "response_length/mean")
"""The step metrics charted on the page (every step that logged them), with the run's alerts marked."""
ALERT_POINT = "tracklane/alert/"  # the point an alert leaves in every tracker (core/alerts.py)
ALERT_TEXTS = ("alert/", "alert_")  # its text's name: as logged, and as the file tracker's media names it


@dataclass(slots=True)
class Snapshot:
    """What the run held when it was last read."""

    run: dict[str, Any]
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    """step -> its summary: trajectories, their scores, data sources, generations, traces, score metrics."""
    trajectories: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    generations: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    traces: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """The health alerts the run holds, by step: rule, step, level, text (why)."""
    charts: dict[str, list[list[float]]] = field(default_factory=dict)
    """CHART_KEYS -> [[step, value], ...] in step order."""
    read_at: float = 0.0
    error: str = ""
    skipped: dict[str, int] = field(default_factory=dict)


def resolve(path: str) -> tuple[str, str]:
    """(source name, what it opens) for PATH: a spool folder, a file tracker's ``.jsonl``, or the folder holding
    one (``VERL_FILE_LOGGER_ROOT/<project>``; ConfigError when it holds none or several)."""
    target = Path(path)
    if target.is_file():
        if target.suffix != ".jsonl":
            raise ConfigError(f"{path} is no file tracker's .jsonl and no folder")
        return "file", str(target.resolve())
    if not target.is_dir():
        raise ConfigError(f"no such file or folder: {path}")
    try:
        RunManifest.load(str(target))
        return "spool", str(target.resolve())
    except ConfigError:
        pass
    found = sorted(target.glob("*.jsonl")) or sorted(target.glob("*/*.jsonl"))
    if len(found) != 1:
        what = "no spool and no .jsonl" if not found else f"{len(found)} runs: {', '.join(map(str, found[:6]))}"
        raise ConfigError(f"{path} holds {what}; name a run's .jsonl or spool folder")
    return "file", str(found[0].resolve())


class RunData:
    """One run, read on demand; thread-safe (the server answers requests on several threads)."""

    def __init__(self, path: str) -> None:
        self.kind, self.path = resolve(path)
        self._lock = threading.Lock()
        self._signature: tuple[Any, ...] | None = None
        self._next_check = 0.0
        self._snapshot = Snapshot(run={"where": self.path})

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = time.monotonic()
            if now >= self._next_check or self._signature is None:
                signature = self._files_signature()
                if signature != self._signature:
                    self._read(signature)
                # A big run takes a while to read: looking again only after 3x that keeps the viewer under a
                # quarter of a core beside a training job (200 steps x 64 rollouts, 85 MB: 0.65 s a read here).
                self._next_check = time.monotonic() + max(RECHECK_S, 3 * (time.monotonic() - now))
            return self._snapshot

    def _watched(self) -> list[Path]:
        if self.kind == "spool":
            return [Path(self.path)]
        base = Path(self.path).with_suffix("")
        suffixes = ("_rollouts", "_generations", "_traces", "_media")  # _media: the alerts' texts
        return [Path(self.path), *(base.with_name(base.name + suffix) for suffix in suffixes)]

    def _files_signature(self) -> tuple[Any, ...]:
        seen = []
        for root in self._watched():
            files = [root] if root.is_file() else sorted(root.rglob("*"))  # rglob of a missing folder: nothing
            for file in files:
                try:
                    info = file.stat()
                except OSError:  # gone between the listing and the look: the next check sees it
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    seen.append((str(file), info.st_size, info.st_mtime_ns))
        return tuple(seen)

    def _read(self, signature: tuple[Any, ...]) -> None:
        options = {"path": self.path} if self.kind == "file" else {"spool": self.path}
        try:
            source = source_class(self.kind).from_options(options, {})
            run = source.run()
            snapshot = build_snapshot(source.records())
        except Exception as exc:  # a run being written: a half line now, whole at the next look
            self._snapshot.error = f"{type(exc).__name__}: {exc}"
            return
        snapshot.run = {"project": run.project, "experiment": run.experiment, "run_id": run.run_id,
                        "where": run.where, "kind": self.kind}
        snapshot.skipped = dict(source.skipped)
        snapshot.read_at = time.time()
        self._snapshot, self._signature = snapshot, signature


def build_snapshot(records: Iterable[Record]) -> Snapshot:
    """The viewer's view of ``records``: trajectories, generations and traces by step, each step summarised."""
    snapshot = Snapshot(run={})
    metrics: dict[int, dict[str, float]] = {}
    traces: dict[int, list[Trace]] = {}
    signals = RunSignals()
    for record in records:
        if signals.take(record):
            continue
        if isinstance(record, Trajectories):
            rows = snapshot.trajectories.setdefault(record.step, [])
            rows += [trajectory_row(len(rows) + i, t, record.key) for i, t in enumerate(record.trajectories)]
        elif isinstance(record, Generations):
            rows = snapshot.generations.setdefault(record.step, [])
            rows += [{"index": len(rows) + i, "input": str(s[0]), "output": str(s[1]), "score": _number(s[2])}
                     for i, s in enumerate(record.samples) if len(s) >= 3]
        elif isinstance(record, Trace):
            traces.setdefault(record.step, []).append(record)
        elif isinstance(record, Metrics) and record.axis is None:
            chosen = {k: float(v) for k, v in record.values.items() if any(word in k for word in SCORE_WORDS)}
            metrics.setdefault(record.step, {}).update(chosen)
    snapshot.alerts, snapshot.charts = signals.alerts(), signals.charts()
    for step, records in traces.items():
        snapshot.traces[step] = trace_rows(records, snapshot.trajectories.get(step, []))
    for step in sorted(set(snapshot.trajectories) | set(snapshot.generations) | set(snapshot.traces)):
        snapshot.steps[step] = step_summary(step, snapshot.trajectories.get(step, []),
                                            snapshot.generations.get(step, []), metrics.get(step, {}),
                                            snapshot.traces.get(step, []))
    return snapshot


class RunSignals:
    """What the page charts and flags: the CHART_KEYS' points and the health alerts (an ``Alert`` record where the
    source keeps it; else the point ``tracklane/alert/<rule>`` and the text ``alert/<rule>`` every tracker holds)."""

    def __init__(self) -> None:
        self._points: dict[str, dict[int, float]] = {key: {} for key in CHART_KEYS}
        self._alerts: dict[tuple[str, int], dict[str, Any]] = {}

    def take(self, record: Record) -> bool:
        """Note what ``record`` says; True when it is an alert's own record (nothing else reads it)."""
        if isinstance(record, Alert):
            self._alert(record.rule, record.step).update(level=record.level, text=record.text)
            return True
        if isinstance(record, Text):
            rule = next((record.name[len(p):] for p in ALERT_TEXTS if record.name.startswith(p)), None)
            if rule:
                alert = self._alert(rule, record.step)
                alert["text"] = alert["text"] or record.text
                return True
        elif isinstance(record, Metrics) and record.axis is None:
            for key, value in record.values.items():
                if key in self._points:
                    self._points[key][record.step] = float(value)
                elif key.startswith(ALERT_POINT):
                    self._alert(key[len(ALERT_POINT):], record.step)
        return False

    def _alert(self, rule: str, step: int) -> dict[str, Any]:
        return self._alerts.setdefault((rule, step), {"rule": rule, "step": step, "level": "", "text": ""})

    def alerts(self) -> list[dict[str, Any]]:
        return sorted(self._alerts.values(), key=lambda a: (a["step"], a["rule"]))

    def charts(self) -> dict[str, list[list[float]]]:
        return {key: [[step, points[step]] for step in sorted(points)] for key, points in self._points.items() if points}


def trajectory_row(index: int, trajectory: Trajectory, key: str) -> dict[str, Any]:
    """One trajectory as the page shows it: its turns, tool calls, rewards, per-turn tokens (no token ids)."""
    meta = {k: _plain(v) for k, v in trajectory.meta.items()}
    return {"index": index, "key": key, "score": _number(trajectory.score()),
            "rewards": {k: _number(v) for k, v in trajectory.rewards.items()},
            "data_source": str(meta.get("data_source", "")), "messages": trajectory.messages,
            "tool_calls": trajectory.tool_calls, "meta": meta, "tokens": int(len(trajectory.token_ids) // 4)}


def trace_rows(traces: list[Trace], trajectories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A step's traces as the page shows them, in the order they started; each with the index of its rollout
    (``trajectory``: the trajectory whose meta has its sample_index and rollout index, and validation flag) or None."""
    rollouts: dict[tuple[str, str, bool], int] = {}
    for row in trajectories:
        meta = row["meta"]
        if "sample_index" in meta and "rollout_index" in meta:
            rollouts.setdefault(_rollout_key(meta["sample_index"], meta["rollout_index"], meta.get("validation")), row["index"])
    first = min(trace.start_ns for trace in traces)
    rows = []
    for index, trace in enumerate(sorted(traces, key=lambda t: (t.start_ns, t.end_ns))):
        row = trace_row(index, trace, first)
        row["trajectory"] = rollouts.get(_rollout_key(row["sample_index"], row["rollout_n"], trace.attributes.get("validate")))
        rows.append(row)
    return rows


def trace_row(index: int, trace: Trace, first_ns: int) -> dict[str, Any]:
    """One trace: times in ms (``offset_ms`` from the step's first start), verl's metadata parsed into inputs,
    output, exception_type and the rest, every long string and list cut (``cut``: how many)."""
    cut = [0]
    metadata = trace.metadata_object()
    inputs, output = metadata.pop("inputs", None), metadata.pop("output", None)
    exception_type = metadata.pop("exception_type", None)
    attributes = {k: _plain(v) for k, v in trace.attributes.items()}
    return {"index": index, "name": trace.name, "key": trace.key, "status": trace.status,
            "error": trace.status == "error", "start_s": trace.start_ns / 1e9,
            "offset_ms": (trace.start_ns - first_ns) / 1e6, "duration_ms": max(0, trace.end_ns - trace.start_ns) / 1e6,
            "sample_index": attributes.get("sample_index"), "rollout_n": attributes.get("rollout_n"),
            "attributes": attributes, "exception_type": exception_type,
            "messages": [{"role": m.get("role", ""), "content": _bounded(m.get("content", ""), cut)}
                         for m in trace.messages],
            "inputs": _bounded(inputs, cut), "output": _bounded(output, cut), "metadata": _bounded(metadata, cut), "cut": cut[0]}


def _rollout_key(sample: Any, rollout: Any, validation: Any) -> tuple[str, str, bool]:
    """Traces say ``rollout_n``/``validate``, trajectories ``rollout_index``/``validation``: compared as text."""
    return str(sample), str(rollout), bool(validation)


def _bounded(value: Any, cut: list[int], depth: int = 0) -> Any:
    """``value`` with strings cut to TRACE_TEXT_CHARS and lists to TRACE_LIST_ITEMS (each cut counted in ``cut``),
    nesting deeper than 16 levels as text."""
    if isinstance(value, str):
        if len(value) <= TRACE_TEXT_CHARS:
            return value
        cut[0] += 1
        return f"{value[:TRACE_TEXT_CHARS]}… [{len(value) - TRACE_TEXT_CHARS} more characters]"
    if depth >= 16 and isinstance(value, (dict, list)):
        return _bounded(json.dumps(value), cut)
    if isinstance(value, dict):
        return {str(k): _bounded(v, cut, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > TRACE_LIST_ITEMS:
            cut[0] += 1
            value = [*value[:TRACE_LIST_ITEMS], f"… [{len(value) - TRACE_LIST_ITEMS} more items]"]
        return [_bounded(v, cut, depth + 1) for v in value]
    return _plain(value)


def step_summary(step: int, trajectories: list[dict[str, Any]], generations: list[dict[str, Any]],
                 metrics: dict[str, float], traces: list[dict[str, Any]]) -> dict[str, Any]:
    scores = [row["score"] for row in trajectories if row["score"] is not None]
    return {"step": step, "trajectories": len(trajectories), "generations": len(generations),
            "traces": len(traces), "trace_errors": sum(row["error"] for row in traces),
            "score_mean": sum(scores) / len(scores) if scores else None,
            "score_min": min(scores) if scores else None, "score_max": max(scores) if scores else None,
            "data_sources": sorted({row["data_source"] for row in trajectories if row["data_source"]}),
            "metrics": dict(sorted(metrics.items())[:MAX_STEP_METRICS])}


def _number(value: Any) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _plain(value: Any) -> Any:
    """A meta value JSON can carry (NaN becomes null where the server answers: ``finite_or_none``)."""
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
