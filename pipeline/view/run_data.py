"""A run's rollouts as the viewer shows them: read from a spool or the file tracker's folder, again when it changes.

Reading goes through the migration sources (``pipeline/host/source.py``: the file tracker's ``FileSource``, the
spool's ``SpoolSource``), so the viewer knows no storage format of its own and opens every file read-only. While
a run writes, ``snapshot()`` re-reads when a file under the run changed (sizes and modification times, looked at
most once a ``RECHECK_S``, or three times as long as the last read took); a read that fails meanwhile (a line
half written) keeps the last good snapshot and says why.
"""

from __future__ import annotations

import math
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import ConfigError
from pipeline.core.records import Generations, Metrics, Record, Trajectories, Trajectory
from pipeline.host.registry import source_class
from pipeline.spool.manifest import RunManifest

RECHECK_S = 1.0
SCORE_WORDS = ("score", "reward", "acc")  # a step's metrics shown beside its rollouts: keys holding one of these
MAX_STEP_METRICS = 16


@dataclass(slots=True)
class Snapshot:
    """What the run held when it was last read."""

    run: dict[str, Any]
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    """step -> its summary: trajectories, their scores, data sources, generations, score metrics."""
    trajectories: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    generations: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
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
        return [Path(self.path), *(base.with_name(base.name + suffix) for suffix in ("_rollouts", "_generations"))]

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
    """The viewer's view of ``records``: trajectories and generations by step, each step summarised."""
    snapshot = Snapshot(run={})
    metrics: dict[int, dict[str, float]] = {}
    for record in records:
        if isinstance(record, Trajectories):
            rows = snapshot.trajectories.setdefault(record.step, [])
            rows += [trajectory_row(len(rows) + i, t, record.key) for i, t in enumerate(record.trajectories)]
        elif isinstance(record, Generations):
            rows = snapshot.generations.setdefault(record.step, [])
            rows += [{"index": len(rows) + i, "input": str(s[0]), "output": str(s[1]), "score": _number(s[2])}
                     for i, s in enumerate(record.samples) if len(s) >= 3]
        elif isinstance(record, Metrics) and record.axis is None:
            chosen = {k: float(v) for k, v in record.values.items() if any(word in k for word in SCORE_WORDS)}
            metrics.setdefault(record.step, {}).update(chosen)
    for step in sorted(set(snapshot.trajectories) | set(snapshot.generations)):
        snapshot.steps[step] = step_summary(step, snapshot.trajectories.get(step, []),
                                            snapshot.generations.get(step, []), metrics.get(step, {}))
    return snapshot


def trajectory_row(index: int, trajectory: Trajectory, key: str) -> dict[str, Any]:
    """One trajectory as the page shows it: its turns, tool calls, rewards, per-turn tokens (no token ids)."""
    meta = {k: _plain(v) for k, v in trajectory.meta.items()}
    return {"index": index, "key": key, "score": _number(trajectory.score()),
            "rewards": {k: _number(v) for k, v in trajectory.rewards.items()},
            "data_source": str(meta.get("data_source", "")), "messages": trajectory.messages,
            "tool_calls": trajectory.tool_calls, "meta": meta, "tokens": int(len(trajectory.token_ids) // 4)}


def step_summary(step: int, trajectories: list[dict[str, Any]], generations: list[dict[str, Any]],
                 metrics: dict[str, float]) -> dict[str, Any]:
    scores = [row["score"] for row in trajectories if row["score"] is not None]
    return {"step": step, "trajectories": len(trajectories), "generations": len(generations),
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
