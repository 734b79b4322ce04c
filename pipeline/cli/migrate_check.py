"""``tracklane migrate``'s last step: each target read back with its source reader and compared, key by key.

What the source gave is collected as ``Holdings`` (every scalar point per key, the steps of the rich records per
kind and name) while it is spooled; each target with a source reader (``Source.of_target``) is read back into the
same shape and compared: point counts, first and last step and value, and every point (NaN equals NaN; values as
the target stores them: float32 for TensorBoard, +-Inf as +-DBL_MAX for MLflow); rich records by the steps that hold
one, per name. ``comparison_table`` prints it.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracklane.core.records import Generations, Metrics, Record, Reduction, RunSpec, Trajectories
from tracklane.core.report import PipelineReport

if TYPE_CHECKING:
    from tracklane.host.source import Source

log = logging.getLogger("tracklane")


class Holdings:
    """What one run holds, for comparing: every scalar point per key, the steps of the rich records per
    (kind, name)."""

    def __init__(self) -> None:
        self.scalars: dict[str, tuple[array, array]] = {}  # key -> (steps int64, values float64)
        self.rich: dict[tuple[str, str], list[int]] = {}
        self.records = 0

    @property
    def points(self) -> int:
        return sum(len(steps) for steps, _ in self.scalars.values())

    def add(self, record: Record) -> None:
        if isinstance(record, Reduction):  # the reduce lane's, never a tracker's: its points are plain metrics
            return
        self.records += 1
        if isinstance(record, Metrics):
            for key, value in record.values.items():
                steps, values = self.scalars.setdefault(key, (array("q"), array("d")))
                steps.append(record.step)
                values.append(float(value))
            return
        name = record.key if isinstance(record, (Generations, Trajectories)) else record.name
        self.rich.setdefault((record.kind, name), []).append(record.step)


@dataclass(slots=True, kw_only=True)
class TargetCheck:
    """One target read back and compared with the source."""

    note: str = ""
    """How values were compared, or why the target was not verified / could not be read."""
    verified: bool = True
    scalars: dict[str, str] = field(default_factory=dict)
    """Source key -> "ok" or what differs (keys the target merges share their verdict)."""
    rich: dict[tuple[str, str], str] = field(default_factory=dict)
    """Source (kind, name) -> "ok", "not stored" (its sink counted the kind unsupported), "not verified" (its reader
    does not read the kind back) or what differs."""
    extra: list[str] = field(default_factory=list)
    """Keys the target holds that the source did not."""
    mismatches: int = 0


def compare_targets(held: Holdings, run: RunSpec, settings: Mapping[str, Mapping[str, Any]],
                    report: PipelineReport) -> dict[str, TargetCheck]:
    """Each target read back with its source class (where there is one) and compared with ``held``."""
    from tracklane.host.registry import SOURCES, source_class

    checks = {}
    for name, target_settings in settings.items():
        if name not in SOURCES:
            checks[name] = TargetCheck(verified=False, note="not verified (no reader for this tracker)")
            continue
        lane = report.lanes.get(name)
        checks[name] = _check(held, source_class(name), target_settings, run, lane.unsupported if lane else {})
    return checks


def _check(held: Holdings, cls: type[Source], settings: Mapping[str, Any], run: RunSpec,
           unsupported: Mapping[str, int]) -> TargetCheck:
    try:
        back = _read_back(cls, settings, run)
    except NotImplementedError:
        return TargetCheck(verified=False, note="not verified (no reader for this tracker)")
    except Exception as exc:  # whatever the tracker's reader raises: this target is reported, the others still checked
        log.warning("tracklane: migrate: cannot read the %s target back", cls.name, exc_info=True)
        return TargetCheck(note=f"unreadable: {type(exc).__name__}: {exc}", mismatches=max(1, len(held.scalars)),
                           scalars={key: "unreadable" for key in held.scalars})
    check = TargetCheck(note=cls.value_note)
    _check_scalars(check, held, back, cls)
    _check_rich(check, held, back, cls, unsupported)
    return check


def _read_back(cls: type[Source], settings: Mapping[str, Any], run: RunSpec) -> Holdings:
    back = Holdings()
    with cls.of_target(settings, run) as reader:
        for record in reader.records():
            back.add(record)
    return back


def _check_scalars(check: TargetCheck, held: Holdings, back: Holdings, cls: type[Source]) -> None:
    for stored, keys in _groups(held.scalars, cls.stored_key).items():
        steps, values = array("q"), array("d")
        for key in keys:  # source keys that the target stores under one name are compared together
            steps.extend(held.scalars[key][0])
            values.extend(held.scalars[key][1])
        _record(check, check.scalars, keys, _same_points(steps, values, *back.scalars.get(stored, _EMPTY), cls))
    check.extra = sorted(set(back.scalars) - {cls.stored_key(key) for key in held.scalars})


def _check_rich(check: TargetCheck, held: Holdings, back: Holdings, cls: type[Source], unsupported: Mapping[str, int]) -> None:
    kept = {}
    for kind, name in held.rich:
        if kind in unsupported:
            check.rich[(kind, name)] = "not stored"
        elif cls.stored_as(kind) is None:
            check.rich[(kind, name)] = "not verified"
        else:
            kept[(kind, name)] = held.rich[(kind, name)]
    for stored, members in _groups(kept, lambda pair: (cls.stored_as(pair[0]), cls.stored_name(*pair))).items():
        steps = [step for member in members for step in held.rich[member]]
        _record(check, check.rich, members, _same_steps(steps, back.rich.get(stored, [])))


_EMPTY = (array("q"), array("d"))


def _groups(items: Mapping[Any, Any], name_of: Any) -> dict[Any, list[Any]]:
    """The items' keys grouped by what the target names them."""
    out: dict[Any, list[Any]] = {}
    for key in items:
        out.setdefault(name_of(key), []).append(key)
    return out


def _record(check: TargetCheck, verdicts: dict[Any, str], members: list[Any], verdict: str) -> None:
    for member in members:
        verdicts[member] = verdict
    check.mismatches += verdict != "ok"


def _same_points(steps: array, values: array, back_steps: array, back_values: array, cls: type[Source]) -> str:
    """"ok" when both hold the same (step, value) points in any order within a step, else what differs."""
    if len(steps) != len(back_steps):
        return f"{len(back_steps)} points"
    ours = sorted(zip(steps, map(cls.stored_value, values), strict=True), key=_point_order)
    theirs = sorted(zip(back_steps, map(cls.stored_value, back_values), strict=True), key=_point_order)
    for (step, value), (back_step, back_value) in zip(ours, theirs, strict=True):
        if step != back_step or not (value == back_value or (math.isnan(value) and math.isnan(back_value))):
            return f"step {back_step}: {back_value!r} where the source has step {step}: {value!r}"
    return "ok"


def _point_order(point: tuple[int, float]) -> tuple[int, bool, float]:
    step, value = point
    return step, math.isnan(value), 0.0 if math.isnan(value) else value


def _same_steps(steps: list[int], back_steps: list[int]) -> str:
    ours, theirs = sorted(set(steps)), sorted(set(back_steps))
    if ours == theirs:
        return "ok"
    if not theirs:
        return "missing"
    missing = sorted(set(ours) - set(theirs))
    return f"{len(theirs)} steps" + (f", lacks step {missing[0]}" if missing else "")


# -- the table -------------------------------------------------------------------------------
def comparison_table(where: str, run: RunSpec, held: Holdings, checks: Mapping[str, TargetCheck]) -> str:
    """The per-key comparison, one column per target, and the verdict."""
    names = list(checks)
    lines = [f"tracklane migrate: {where} -> {', '.join(names)} as run {run.run_id} "
             f"(project {run.project!r}, experiment {run.experiment!r})"]
    notes = [f"{name}: {check.note}" for name, check in checks.items() if check.note]
    if notes:
        lines.append("  " + "; ".join(notes))
    rows = [["key", "points", "first", "last", *names]]
    for key, (steps, values) in sorted(held.scalars.items()):
        first, last = _ends(steps, values)
        rows.append([key, str(len(steps)), first, last, *[_cell(check, check.scalars.get(key)) for check in checks.values()]])
    lines += _aligned(rows)
    if held.rich:
        rows = [["kind", "name", "steps", "first", "last", *names]]
        for (kind, name), rich_steps in sorted(held.rich.items()):
            rows.append([kind, name, str(len(set(rich_steps))), str(min(rich_steps)), str(max(rich_steps)),
                         *[_cell(check, check.rich.get((kind, name))) for check in checks.values()]])
        lines += [""] + _aligned(rows)
    for name, check in checks.items():
        if check.extra:
            shown = ", ".join(check.extra[:10]) + (f" (+{len(check.extra) - 10})" if len(check.extra) > 10 else "")
            lines.append(f"  {name} also holds keys the source has not: {shown}")
    bad = {name: check.mismatches for name, check in checks.items() if check.mismatches}
    lines.append("result: MISMATCH in " + ", ".join(f"{n} ({k} difference(s))" for n, k in bad.items()) if bad
                 else "result: every verified target holds what the source held")
    return "\n".join(lines) + "\n"


def _cell(check: TargetCheck, verdict: str | None) -> str:
    if not check.verified:
        return "not verified"
    return verdict or "-"


def _ends(steps: array, values: array) -> tuple[str, str]:
    """"step: value" of the first point of the lowest step and the last of the highest."""
    low, high = min(steps), max(steps)
    first = next(i for i, step in enumerate(steps) if step == low)
    last = max(i for i, step in enumerate(steps) if step == high)
    return f"{low}: {values[first]:.6g}", f"{high}: {values[last]:.6g}"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
