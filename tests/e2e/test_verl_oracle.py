"""verl 0.9.1's own ``Tracking`` as the oracle for MLflow and TensorBoard, for any numeric ``log()`` calls (hypothesis).

verl's ``Tracking(default_backend=["mlflow", "tensorboard"])`` and tracklane's (synchronous: the same sinks the lanes
host) get the same generated calls: keys with characters MLflow refuses (verl sanitises them: ``@`` -> ``_at_``,
``//`` -> ``/``, the rest -> ``_``), every number type users pass (float with NaN and +-Inf, int, bool, numpy
float64/float32/int64 scalars, torch 0-d tensors of float32/float64/bfloat16/int32), steps in any order, several
calls a step. Both stores are read back through the tracker's own reader (``MlflowClient`` on sqlite; TensorBoard's
``EventAccumulator``) and must hold the same points, multiset for multiset; where verl's MLflow loses a call (a name
MLflow reads as a path out of the run's folder), tracklane's holds it under its renamed names. The file tracker's
bytes: test_verl_file_bytes.py. What verl crashes on (a string or a dict value: MLflow refuses the whole call,
TensorBoard raises) is tracklane's documented behaviour instead: test_values.py and the sinks' tests.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import os
import posixpath
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.verl_inputs import configs as verl_configs
from tests.verl_inputs import keys, numbers, torch_scalars
from tracklane import Tracking
from tracklane.workers.sinks.mlflow import mlflow_key
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl 0.9.1 is not installed (.ci/run installs it)", allow_module_level=True)

_INVALID = re.compile(r"[^/\w.\- :]")


def verls_mlflow_name(key: str) -> str:
    """verl's ``_MlflowLoggingAdapter._sanitize_key``, restated to generate keys that stay apart once sanitised."""
    return _INVALID.sub("_", re.sub(r"/+", "/", key.replace("@", "_at_")))


def verl_loses(data: dict) -> bool:
    """verl's MLflow loses the whole call when one name resolves to another as a path (``..x``, ``a/./b``): tracklane
    renames such a name (``mlflow_key``) and stores the call."""
    names = [verls_mlflow_name(key) for key in data]
    return any(posixpath.normpath(name) != name or name.startswith(("..", "/")) for name in names)


dicts = st.dictionaries(keys, st.one_of(numbers, torch_scalars), min_size=1, max_size=6).filter(
    lambda data: len({verls_mlflow_name(key) for key in data}) == len({mlflow_key(key) for key in data}) == len(data))
calls = st.lists(st.tuples(dicts, st.integers(0, 10_000)), min_size=1, max_size=6)
_runs = itertools.count()


def _stored(points: list[tuple[int, str, float]]) -> Counter:
    """A multiset of (step, key, value) with NaN made comparable (NaN != NaN)."""
    return Counter((step, key, "nan" if math.isnan(value) else value) for step, key, value in points
                   if not key.startswith("tracklane/"))


def _as_mlflow_stores(value: float) -> float:
    """MLflow's store keeps +-Inf as the largest finite float64 (NaN as NaN)."""
    return math.copysign(sys.float_info.max, value) if math.isinf(value) else value


def _run(root: Path, logged: list[tuple[dict, int]], which: str, log_async: bool = False) -> tuple[Counter, Counter]:
    n = next(_runs)
    uri, board = f"sqlite:///{root / 'mlflow.db'}", root / f"tb-{which}-{n}"
    os.environ.update(MLFLOW_TRACKING_URI=uri, TENSORBOARD_DIR=str(board))
    project = f"{which}-{n}"
    if which == "verl":
        from verl.utils.tracking import Tracking as VerlTracking

        tracking = VerlTracking(project, "oracle", default_backend=["mlflow", "tensorboard"])
    else:
        tracking = Tracking(project, "oracle", ["mlflow", "tensorboard"], config={"trainer": {"log_async": log_async}})
    for data, step in logged:
        tracking.log(data, step=step)
    tracking.finish()
    [run_id] = find_mlflow_run_ids(uri, project, "oracle")
    return _stored(read_mlflow_run(uri, run_id).points), _stored(read_tensorboard_dir(board).points)


@pytest.fixture
def restore_env():
    names = ("MLFLOW_TRACKING_URI", "TENSORBOARD_DIR")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logged=calls)
@example(logged=[({"..a": math.inf, "b": -math.inf}, 3)])  # a call verl's MLflow refuses, with +-Inf in it
def test_mlflow_and_tensorboard_hold_what_verls_hold(tmp_path_factory, restore_env, logged):
    _same_as_verl(tmp_path_factory.mktemp("oracle"), logged, log_async=False)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logged=st.lists(calls, min_size=3, max_size=3).map(lambda parts: [call for part in parts for call in part]))
def test_mlflow_and_tensorboard_hold_what_verls_hold_through_the_lanes(ray_session, tmp_path_factory, restore_env,
                                                                      logged):
    """The same through the pipeline: Ray, one lane actor per tracker (a run's worth of calls an example)."""
    _same_as_verl(tmp_path_factory.mktemp("oracle-async"), logged, log_async=True)


def _same_as_verl(root: Path, logged: list[tuple[dict, int]], log_async: bool) -> None:
    verl_mlflow, verl_board = _run(root, logged, "verl")
    ours_mlflow, ours_board = _run(root, logged, "tracklane", log_async)
    lost = [(data, step) for data, step in logged if verl_loses(data)]
    renamed = _stored([(step, mlflow_key(key), _as_mlflow_stores(float(value))) for data, step in lost
                       for key, value in data.items()])
    assert ours_mlflow == verl_mlflow + renamed
    assert sum(verl_mlflow.values()) == sum(len(data) for data, _ in logged if not verl_loses(data))
    assert ours_board == verl_board


configs = verl_configs()


def _params(root: Path, config: dict, which: str) -> dict[str, str]:
    n = next(_runs)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    os.environ.update(MLFLOW_TRACKING_URI=uri, TENSORBOARD_DIR=str(root / f"tb-{n}"))
    project = f"params-{which}-{n}"
    if which == "verl":
        from verl.utils.tracking import Tracking as VerlTracking

        VerlTracking(project, "oracle", default_backend=["mlflow"], config=config).finish()
    else:
        Tracking(project, "oracle", ["mlflow"], config={**config, "trainer": {"log_async": False}}).finish()
    [run_id] = find_mlflow_run_ids(uri, project, "oracle")
    return read_mlflow_run(uri, run_id).params


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs)
def test_mlflow_params_are_verls_for_nested_configs(tmp_path_factory, restore_env, config):
    """Nested dicts and lists (verl turns a list into ``list_len`` and its indices), dataclasses, Enums and Paths:
    MLflow's params as verl's ``_compute_mlflow_params_from_objects`` flattens them, read back through MlflowClient.
    (tracklane adds its ``trainer`` section here: verl gets it too, so both flatten the same config.)"""
    root = tmp_path_factory.mktemp("params")
    full = {**config, "trainer": {"log_async": False}}
    kept = dict.fromkeys(_empty_dicts(config), "{}")  # beyond verl (flatten_params): its pandas drops them
    assert _params(root, config, "tracklane") == {**_params(root, full, "verl"), **kept}


def _empty_dicts(value: object, prefix: str = "") -> list[str]:
    """The flattened names of the empty dicts in a config, as verl's transform nests it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        if not value and prefix:
            return [prefix[:-1]]
        return [name for key, item in value.items() for name in _empty_dicts(item, f"{prefix}{key}/")]
    if isinstance(value, list):
        return [name for index, item in enumerate(value) for name in _empty_dicts(item, f"{prefix}{index}/")]
    return []
