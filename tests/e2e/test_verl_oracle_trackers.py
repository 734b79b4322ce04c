"""verl 0.9.1's own ``Tracking`` as the oracle for wandb (history and config), SwanLab, trackio and ClearML, for any
numeric ``log()`` calls (hypothesis); test_verl_oracle.py does the same for MLflow and TensorBoard.

verl's ``Tracking(default_backend=[tracker])`` and tracklane's (synchronous, and through the lanes) get the same
generated calls: the keys and numbers of test_verl_oracle.py (float with NaN and +-Inf, int, bool, numpy
float64/float32/int64), steps in any order and often repeated, several calls a step. Each store is read back through
its reader (workers/testing/readers) and compared point for point, a multiset of (step, key, value) with NaN equal
to NaN. Where verl's store loses or changes a value, tracklane's documented behaviour is expected instead:

wandb    verl calls ``wandb.log(data, step=step)``. wandb ignores a call whose step is below its newest (a warning)
         and merges the calls of one step into one row, the later value winning, even across a call it ignored.
         tracklane keeps every call: a row per run of consecutive calls of one step (later value wins, as in
         wandb's row), each charted against its step metric (``tracklane/step``). A bool: verl's wandb stores JSON
         true/false (no number to chart; the reader skips it), tracklane 1/0 (its values are numbers). A key
         starting with "_" is hidden, as wandb's own (``_step``...): the reader skips it in both runs.
         Config: verl's, except an Enum (verl's wandb keeps its name, tracklane its value, as in MLflow's params)
         and a tuple (verl's wandb: a list; tracklane: its str, as MLflow shows it). tracklane makes the config
         plain on the trainer side (pipeline/core/params.py), so its wandb sink never sees the Enum or the tuple.
SwanLab  the same store: swanlab trims a key's leading and trailing " ./" (the later of two keys trimmed alike in a
         call wins) and keeps a key's first value at a step (a later one is "duplicate or too old").
trackio  the same rows' values: verl's trackio stores a row per call, every value kept (keys trackio reserves,
         "__x", get "__" in front, by trackio and by tracklane alike).
ClearML  verl splits a key at its first "/" into title and series (a key without one makes verl raise ValueError:
         verl gets only the keys with a "/", tracklane all, each of those its own title and series). ClearML stores
         NaN and +-Inf as 0.0 (verl); tracklane skips them (counted). Compared as ClearML's server keeps scalars,
         one per (iteration, title, series), the last reported: the offline session is the queue of reports and
         tracklane reports one value per key and step of a batch (the later), verl every call's.

The first verl wandb run read back empty now and then: ``wandb.finish()`` returns once wandb-core has handled the
run's exit, but wandb-core keeps the run file's last 32 KiB block in memory until it closes the run, in the
background after ``finish()``; a short run is then a 7-byte header on disk (seen here 2 times in 8 runs read at
once). verl's process ends there and wandb's teardown at exit waits for that close; here ``wandb.teardown()`` does.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.verl_inputs import configs as verl_configs
from tests.verl_inputs import keys, numbers, param_values
from tracklane import Tracking

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl 0.9.1 is not installed (.ci/run installs it)", allow_module_level=True)
for _sdk in ("wandb", "swanlab", "trackio", "clearml"):
    pytest.importorskip(_sdk)

steps = st.one_of(st.integers(0, 3), st.integers(0, 10_000))  # small steps repeat: the calls of one step meet
dicts = st.dictionaries(keys, numbers, min_size=1, max_size=6)
calls = st.lists(st.tuples(dicts, steps), min_size=1, max_size=6)
_runs = itertools.count()
SYNC = {"trainer": {"log_async": False}}
Point = tuple[int, str, Any]


def _stored(points: list[Point]) -> Counter:
    """A multiset of (step, key, value) with NaN made comparable (NaN != NaN)."""
    return Counter((int(step), key, "nan" if math.isnan(value) else value) for step, key, value in points
                   if not key.startswith("tracklane/"))


def _number(value: Any) -> float | int:
    """A logged number as a Python number (numpy scalars as ``item()`` gives them); a bool stays one."""
    return value.item() if isinstance(value, np.generic) else value


def _runs_of_a_step(logged: list[tuple[dict, int]]) -> list[tuple[int, dict]]:
    """Each run of consecutive calls of one step, merged (later value wins)."""
    out = []
    for step, group in itertools.groupby(logged, key=lambda call: call[1]):
        merged: dict = {}
        for data, _ in group:
            merged.update(data)
        out.append((step, merged))
    return out


# -- running both -------------------------------------------------------------------------------------------------

def _verl(tracker: str, project: str, logged: list[tuple[dict, int]], config: dict | None = None) -> str:
    """verl's own Tracking with ``tracker`` alone; returns the run's id where the store names runs by one. It gets
    the config tracklane's gets (verl's ClearML raises on none, its wandb reads the trainer section)."""
    from verl.utils.tracking import Tracking as VerlTracking

    if tracker == "trackio":
        _point_trackio_here()
    if tracker == "clearml":
        import clearml

        # ClearML's reporter in a forked process took ~12 s per close here; tracklane's sink turns it to threads
        # for the whole process at its first open (workers/sinks/clearml.py): the same events, at once.
        clearml.Task._report_subprocess_enabled = False
        clearml.Task.set_offline(True)  # ClearML reads CLEARML_OFFLINE_MODE once, at import (before the fixture)
        logged = [({key: value for key, value in data.items() if "/" in key}, step) for data, step in logged]
    tracking = VerlTracking(project, "oracle", default_backend=[tracker], config=config or SYNC)
    run_id = tracking.logger["wandb"].run.id if tracker == "wandb" else ""
    for data, step in logged:
        if data:  # (ClearML: none of the call's keys had a "/")
            tracking.log(data, step=step)
    tracking.finish()
    if tracker == "wandb":
        import wandb

        wandb.teardown()  # the run file complete on disk, as at verl's exit (module docstring)
    return run_id


def _tracklane(trackers: list[str], project: str, logged: list[tuple[dict, int]], log_async: bool,
               config: dict | None = None) -> str:
    tracking = Tracking(project, "oracle", trackers, config={**(config or {}), "trainer": {"log_async": log_async}})
    for data, step in logged:
        tracking.log(data, step=step)
    report = tracking.finish()
    assert report.complete, report
    return tracking.run_id


def _point_trackio_here() -> None:
    from tracklane.workers.sinks.trackio import point_trackio_at

    point_trackio_at(os.environ["TRACKIO_DIR"])  # trackio reads TRACKIO_DIR once, at import


def _read(tracker: str, project: str, run_id: str) -> Any:
    """The run of ``project`` (``run_id`` for wandb) as the tracker's reader gives it back."""
    if tracker == "wandb":
        from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

        return read_wandb_run(os.environ["WANDB_DIR"], run_id)
    if tracker == "swanlab":
        from tracklane.workers.testing.readers.swanlab_reader import list_swanlab_runs, read_swanlab_run

        logdir = os.environ["SWANLAB_LOG_DIR"]
        [found] = {run.run_id for run in list_swanlab_runs(logdir) if run.project == project}
        return read_swanlab_run(logdir, run_id=found)
    if tracker == "trackio":
        from tracklane.workers.testing.readers.trackio_reader import read_trackio_run

        return read_trackio_run(os.environ["TRACKIO_DIR"], project, name="oracle")
    from tracklane.workers.testing.readers.clearml_reader import clearml_sessions, read_clearml_session

    [found] = [folder for folder in clearml_sessions(os.environ["CLEARML_CACHE_DIR"])
               if json.loads((folder / "task.json").read_bytes()).get("project_name") == project]
    return read_clearml_session(found)


# -- what each store holds, as verl's and as tracklane's ----------------------------------------------------------

def _wandb_verl(logged: list[tuple[dict, int]]) -> Counter:
    """verl's wandb: a call below the newest step is ignored, the calls of a step are one row (later value wins)."""
    rows: list[tuple[int, dict]] = []
    for data, step in logged:
        if rows and step < rows[-1][0]:
            continue
        if not rows or step != rows[-1][0]:
            rows.append((step, {}))
        rows[-1][1].update(data)
    return _stored([(step, key, _number(value)) for step, row in rows for key, value in row.items()
                    if not isinstance(value, (bool, np.bool_)) and not key.startswith("_")])


def _wandb_tracklane(logged: list[tuple[dict, int]]) -> Counter:
    return _stored([(step, key, int(value) if isinstance(value, bool) else _number(value))
                    for step, row in _runs_of_a_step(logged) for key, value in row.items() if not key.startswith("_")])


def _swanlab_key(key: str) -> str:
    """swanlab's ``validate_key``: leading and trailing whitespace, "." and "/" trimmed (swanlab/sdk/internal/run/fmt.py)."""
    return key.strip(" \t\n\r./")


def _swanlab(logged: list[tuple[dict, int]]) -> Counter:
    """swanlab.log, call by call: keys trimmed (the later of two alike wins in a call), a key's first value at a step."""
    kept: dict[tuple[int, str], Any] = {}
    for data, step in logged:
        row = {_swanlab_key(key): value for key, value in data.items() if _swanlab_key(key)}
        for key, value in row.items():
            kept.setdefault((step, key), float(_number(value)))
    return _stored([(step, key, value) for (step, key), value in kept.items()])


def _trackio_key(key: str) -> str:
    from trackio.utils import RESERVED_KEYS

    return f"__{key}" if key in RESERVED_KEYS or key.startswith("__") else key


def _trackio(logged: list[tuple[dict, int]]) -> Counter:
    """trackio.log: a row per call, every value kept."""
    return _stored([(step, _trackio_key(key), _number(value)) for data, step in logged for key, value in data.items()])


def _clearml_names(key: str) -> tuple[str, str]:
    """verl's split at the first "/"; tracklane's for a key without one (verl raises): the key as title and series."""
    title, _, series = key.partition("/")
    return (title, series) if "/" in key else (key, key)


def _clearml_verl(logged: list[tuple[dict, int]]) -> dict[tuple[int, str, str], float]:
    """What ClearML's server keeps of verl's reports: the last per (iteration, title, series); NaN and +-Inf as 0.0."""
    out = {}
    for data, step in logged:
        for key, value in data.items():
            if "/" in key:
                out[(step, *_clearml_names(key))] = float(value) if math.isfinite(value) else 0.0
    return out


def _clearml_tracklane(logged: list[tuple[dict, int]]) -> dict[tuple[int, str, str], float]:
    """tracklane's: non-finite values skipped, the last finite one per (iteration, title, series)."""
    return {(step, *_clearml_names(key)): float(value) for data, step in logged for key, value in data.items()
            if math.isfinite(value)}


def _clearml_view(run: Any) -> dict[tuple[int, str, str], float]:
    return {(event.iteration, event.title, event.series): event.value for event in run.scalar_events
            if event.title != "tracklane"}  # tracklane's own figures (lag, queue bytes...) on the asynchronous path


def _clearml_clash(logged: list[tuple[dict, int]]) -> bool:
    """A key without "/" and another that ClearML would show on the same graph line ("x" and "x/x"): tracklane keeps
    the first and counts the other (test_clearml_sink.py); not what this test is about."""
    names = {key for data, _ in logged for key in data}
    return any(_clearml_names(key) == _clearml_names(other) for key in names for other in names if key != other)


# -- the tests ----------------------------------------------------------------------------------------------------

def _same_as_verl(tracker: str, logged: list[tuple[dict, int]], log_async: bool) -> None:
    n = next(_runs)
    theirs, ours = f"verl-{tracker}-{n}", f"tracklane-{tracker}-{n}"
    verl_run = _read(tracker, theirs, _verl(tracker, theirs, logged))
    our_run = _read(tracker, ours, _tracklane([tracker], ours, logged, log_async))
    CHECKS[tracker](logged, verl_run, our_run)


def _check_wandb(logged: list[tuple[dict, int]], verl_run: Any, our_run: Any) -> None:
    verl, expected = _stored(verl_run.points), _wandb_verl(logged)
    assert verl == expected  # the oracle is what this file says it is (not empty: see the module docstring)
    lost = _wandb_tracklane(logged) - expected  # calls wandb ignored, values a later call overwrote, bools
    assert _stored(our_run.points) == verl + lost
    if all(a[1] <= b[1] for a, b in itertools.pairwise(logged)) and not any(
            isinstance(v, (bool, np.bool_)) for data, _ in logged for v in data.values()):
        assert not lost


def _check_swanlab(logged: list[tuple[dict, int]], verl_run: Any, our_run: Any) -> None:
    verl = _stored(verl_run.points)
    assert verl == _swanlab(logged)
    assert _stored(our_run.points) == verl


def _check_trackio(logged: list[tuple[dict, int]], verl_run: Any, our_run: Any) -> None:
    verl = _stored(verl_run.points)
    assert verl == _trackio(logged)
    assert _stored(our_run.points) == verl


def _check_clearml(logged: list[tuple[dict, int]], verl_run: Any, our_run: Any) -> None:
    verl, ours = _clearml_view(verl_run), _clearml_view(our_run)
    assert verl == _clearml_verl(logged)
    assert ours == _clearml_tracklane(logged)
    # Where the last value logged of a (step, key with "/") is finite, the two hold it.
    last = {(step, *_clearml_names(key)): value for data, step in logged for key, value in data.items()}
    same = {name: value for name, value in verl.items() if math.isfinite(last[name])}
    assert {name: ours.get(name) for name in same} == same


CHECKS: dict[str, Callable[[list[tuple[dict, int]], Any, Any], None]] = {
    "wandb": _check_wandb, "swanlab": _check_swanlab, "trackio": _check_trackio, "clearml": _check_clearml}


# Seconds an example here (2 shared cores): wandb ~1.0, SwanLab ~0.6, wandb's config ~0.75, ClearML ~0.12, trackio
# ~0.1 (the five tests ~50 s); through the lanes ~5 (~45 s).
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(FAST, max_examples=20)
@given(logged=calls)
@example(logged=[({"a/b": 1.0}, 5), ({"a/b": 2.0, "c": True}, 3), ({"a/b": 3.0, "_h": 1.0}, 5)])  # a step below
def test_wandb_holds_what_verls_holds(offline_trackers, logged):
    _same_as_verl("wandb", logged, log_async=False)


@settings(FAST, max_examples=20)
@given(logged=calls)
@example(logged=[({"a/b": 1.0, "x.": 2.0, "x": 3.0}, 1), ({"a/b": 4.0, ".x": 5.0, " ": 6.0}, 1)])  # trimmed keys
def test_swanlab_holds_what_verls_holds(offline_trackers, logged):
    _same_as_verl("swanlab", logged, log_async=False)


@settings(FAST, max_examples=50)
@given(logged=calls)
@example(logged=[({"a/b": 1.0, "__x": 2.0}, 1), ({"a/b": 4.0}, 1)])  # reserved, and one key twice at a step
def test_trackio_holds_what_verls_holds(offline_trackers, logged):
    _same_as_verl("trackio", logged, log_async=False)


@settings(FAST, max_examples=40)
@given(logged=calls.filter(lambda logged: not _clearml_clash(logged)))
@example(logged=[({"a/b": 1.0, "c": 2.0}, 1), ({"a/b": math.nan, "a/c": math.inf}, 1)])  # no "/"; NaN after 1.0
def test_clearml_holds_what_verls_holds(offline_trackers, logged):
    _same_as_verl("clearml", logged, log_async=False)


@pytest.mark.slow
@settings(FAST, max_examples=8)
@given(logged=st.lists(calls, min_size=3, max_size=3).map(lambda parts: [call for part in parts for call in part])
       .filter(lambda logged: not _clearml_clash(logged)))
# What the lanes' batches found, each stored as verl's store holds it now: a key twice at a step (trackio kept the
# later value only, SwanLab the later instead of the first), keys swanlab trims alike in a call (its flush waited
# 5 s), a NaN after a finite value at a step (ClearML stored nothing for it, or the finite value, by batching).
@example(logged=[({":": 0.0, "a/b": 1.0}, 0), ({":": 1.0, "a/b": math.nan}, 0), ({"x/y": 2.0, "x.": 3.0, "x": 4.0}, 1),
                 ({"x/y": 5.0}, 1)])
def test_trackers_hold_what_verls_hold_through_the_lanes(ray_session, offline_trackers, logged):
    """The same through the pipeline: Ray, one lane actor per tracker, the four in one run (a run's worth of calls
    an example, ~5 s); verl's Tracking runs each tracker alone (its ClearML would raise for the others' keys)."""
    n = next(_runs)
    ours = f"tracklane-lanes-{n}"
    run_id = _tracklane(list(CHECKS), ours, logged, log_async=True)
    for tracker, check in CHECKS.items():
        theirs = f"verl-{tracker}-{n}"
        check(logged, _read(tracker, theirs, _verl(tracker, theirs, logged)), _read(tracker, ours, run_id))


configs = verl_configs(st.one_of(param_values, st.tuples(st.integers(0, 9), st.floats(allow_nan=False, allow_infinity=False))))


def _as_tracklane_keeps(config: Any, stored: Any, top: bool = False) -> Any:
    """verl's stored config (``stored``, as wandb keeps ``config``) with tracklane's documented forms: an Enum's
    value where verl's wandb keeps its name, a tuple's str where it keeps a list. (wandb strips "-" from the ends of
    a top-level key, for both.)"""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    if isinstance(config, enum.Enum):
        assert stored == config.name
        return _as_tracklane_keeps(config.value, config.value)
    if isinstance(config, tuple):
        assert stored == list(config)
        return str(config)
    if isinstance(config, dict):
        names = {str(key): str(key).strip("-") if top else str(key) for key in config}
        assert isinstance(stored, dict) and stored.keys() == set(names.values())
        return {names[str(key)]: _as_tracklane_keeps(value, stored[names[str(key)]]) for key, value in config.items()}
    if isinstance(config, list):
        assert isinstance(stored, list) and len(stored) == len(config)
        return [_as_tracklane_keeps(value, item) for value, item in zip(config, stored, strict=True)]
    return stored


@settings(FAST, max_examples=12)
@given(config=configs.filter(lambda c: len({key.strip("-") for key in c}) == len(c)))
def test_wandb_config_is_verls_for_nested_configs(offline_trackers, config):
    """Nested dicts and lists, dataclasses, Enums, Paths, tuples: wandb's config of tracklane's run, read back from
    its run file, is verl's (verl's ``wandb.init(config=config)``) but for an Enum and a tuple (module docstring).
    (verl reads ``config["trainer"]``: both get tracklane's trainer section.)"""
    n = next(_runs)
    full = {**config, "trainer": {"log_async": False}}
    theirs, ours = f"verl-config-{n}", f"tracklane-config-{n}"
    verl = _read("wandb", theirs, _verl("wandb", theirs, [], config=full)).params
    mine = _read("wandb", ours, _tracklane(["wandb"], ours, [], log_async=False, config=config)).params
    assert mine == _as_tracklane_keeps(full, verl, top=True)
