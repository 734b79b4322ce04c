"""The file tracker is verl 0.9.1's ``FileLogger``, byte for byte, for any ``log()`` calls (hypothesis).

verl's own ``Tracking(default_backend=["file"])`` and tracklane's, synchronous and asynchronous, get the same
generated calls: keys of any characters, values of every type users pass (float with NaN and +-Inf, int up to
64 bits, bool, numpy float64/float32/int64/bool scalars, strings, None, lists, nested dicts, an empty dict), steps
in any order. verl's ``.jsonl`` and tracklane's must be the same bytes; what tracklane adds is beside the file.
Where verl itself raises (a tensor, a 0-d array) or would write a secret, tracklane's documented behaviour is tested.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracklane import Tracking
from tracklane.core.params import REDACTED, is_secret_key

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl 0.9.1 is not installed (.ci/run installs it)", allow_module_level=True)

keys = st.text(st.characters(exclude_categories=["Cs"]), max_size=12).filter(lambda key: not is_secret_key(key))
"""Any characters but lone surrogates (no UTF-8: orjson, and so verl, refuses them); no secret's name (redacted by
tracklane: tested on its own below)."""
scalars = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**63) + 1, 2**64 - 1), st.booleans(),
    st.floats(width=64).map(np.float64), st.floats(width=32, allow_nan=False).map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64), st.booleans().map(np.bool_), st.text(max_size=8), st.none(),
    st.lists(st.floats(allow_nan=False), max_size=3),
)
values = st.recursive(scalars, lambda inner: st.dictionaries(keys, inner, max_size=3), max_leaves=12)
calls = st.lists(st.tuples(st.dictionaries(keys, values, max_size=8), st.integers(0, 10**6)), min_size=1, max_size=12)


def verl_file(path: Path, logged: list[tuple[dict, int]]) -> bytes:
    from verl.utils.tracking import Tracking as VerlTracking

    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    tracking = VerlTracking("p", "e", default_backend=["file"])
    for data, step in logged:
        tracking.log(data, step=step)
    tracking.finish()
    return path.read_bytes()


def tracklane_file(path: Path, logged: list[tuple[dict, int]], log_async: bool) -> bytes:
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    tracking = Tracking("p", "e", ["file"], config={"trainer": {"log_async": log_async}})
    for data, step in logged:
        tracking.log(data, step=step)
    tracking.finish()
    return path.read_bytes()


@pytest.fixture
def restore_env():
    before = os.environ.get("VERL_FILE_LOGGER_PATH")
    yield
    if before is None:
        os.environ.pop("VERL_FILE_LOGGER_PATH", None)
    else:
        os.environ["VERL_FILE_LOGGER_PATH"] = before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logged=calls)
def test_sync_file_is_verls_bytes(tmp_path_factory, restore_env, logged):
    root = tmp_path_factory.mktemp("sync")
    assert tracklane_file(root / "tracklane.jsonl", logged, False) == verl_file(root / "verl.jsonl", logged)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logged=st.lists(calls, min_size=4, max_size=4).map(lambda parts: [call for part in parts for call in part]))
def test_async_file_is_verls_bytes(ray_session, tmp_path_factory, restore_env, logged):
    """Through the pipeline (Ray, the lane actor): a run's worth of calls an example (Ray starts once a module)."""
    root = tmp_path_factory.mktemp("async")
    assert tracklane_file(root / "tracklane.jsonl", logged, True) == verl_file(root / "verl.jsonl", logged)


def test_what_tracklane_adds_is_beside_the_file_in_strict_json(ray_session, tmp_path, restore_env):
    """The config, its vitals and the system metrics' lines go to ``<name>_tracklane/``, as strict JSON."""
    path = tmp_path / "run.jsonl"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    tracking = Tracking("p", "e", ["file"], config={"trainer": {"log_async": True, "lr": 0.5,
                                                                 "async_log": {"system_metrics_s": 1}}})
    for step in range(3):
        tracking.log({"loss": float("nan") if step == 1 else 1.0 / (step + 1)}, step=step)
    time.sleep(2.5)  # a system metrics sample or two, and vitals, beside the file
    tracking.finish()
    assert path.read_bytes() == b'{"step":0,"data":{"loss":1.0}}\n{"step":1,"data":{"loss":null}}\n' \
                                b'{"step":2,"data":{"loss":0.3333333333333333}}\n'
    own = tmp_path / "run_tracklane"
    assert json.loads((own / "run.json").read_text())["config"]["trainer"]["lr"] == 0.5

    def strict(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    lines = [json.loads(line, parse_constant=strict) for line in (own / "metrics.jsonl").read_text().splitlines()]
    assert any(key.startswith("tracklane/") for line in lines for key in line["data"])
    assert any(line.get("axis") == "system/elapsed_s" for line in lines)


def test_where_verl_raises_the_file_gets_the_numbers_and_secrets_are_redacted(tmp_path, restore_env):
    """verl's FileLogger raises on a 0-d array (orjson refuses it); tracklane writes its number, as every other
    tracker gets it. A string under a secret's name is never written."""
    path = tmp_path / "run.jsonl"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    tracking = Tracking("p", "e", ["file"], config={"trainer": {"log_async": False}})
    tracking.log({"a": np.array(2.5), "b": 1}, step=0)
    tracking.log({"wandb_api_key": "sk-not-for-files", "note": "kept"}, step=1)
    tracking.finish()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"step": 0, "data": {"a": 2.5, "b": 1}}
    assert lines[1] == {"step": 1, "data": {"wandb_api_key": REDACTED, "note": "kept"}}
    assert "sk-not-for-files" not in path.read_text()
    assert not math.isnan(lines[0]["data"]["a"])
