"""Metrics left packed in a file lane (core/packed_values.py): verl's line rendered from the wire's numbers is the
line orjson writes from the dict, byte for byte; the values read as the dict they were; the file sink's files are
the same either way. No Ray: the batch is encoded and decoded as the shipper and the lane actor do it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracklane.core.packed_values import PackedValues
from tracklane.core.records import SYSTEM_AXIS, Metrics, RunSpec
from tracklane.wire.batch import Batch, decode_batch, encode_batch
from tracklane.workers.sinks.file import FileSink

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
                    st.integers(-(2**53), 2**53), st.sampled_from([0.0, -0.0, 1e16, 1e-7, 1e22, 5e-324, 2.0**53]))
values = st.dictionaries(st.text(max_size=12), numbers, max_size=12)


def _through_the_wire(records: list[Metrics]) -> list[Metrics]:
    decoded = decode_batch(encode_batch(Batch(seq=1, created=0.0, records=records)), packed_metrics=True).records
    assert all(isinstance(r, Metrics) for r in decoded)
    return decoded  # type: ignore[return-value]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**40), values), min_size=1, max_size=5))
def test_the_line_rendered_from_the_numbers_is_orjsons_line_of_the_dict(logged):
    """Keys with quotes, backslashes, '%', any unicode; floats of every kind and ints, mixed in one record."""
    decoded = _through_the_wire([Metrics(step=step, values=data, time=1.0) for step, data in logged])
    for (step, data), record in zip(logged, decoded, strict=True):
        assert type(record.values) is PackedValues
        assert record.values.verl_line(step) == orjson.dumps({"step": step, "data": data}, option=OPTIONS)
        back = dict(record.values)
        assert list(back) == list(data)
        for key, value in data.items():  # the same numbers, ints as ints
            assert type(back[key]) is type(value)
            assert back[key] == value or (math.isnan(value) and math.isnan(back[key]))


def test_orjson_writes_a_float64_array_as_it_writes_python_floats():
    """The premise of the render: orjson's text of a float64 is the same from a numpy array and from Python floats
    (2 M random bit patterns: every exponent, subnormals, NaN payloads, +-Inf)."""
    rng = np.random.default_rng(7)
    array = np.concatenate([rng.integers(0, 2**64, size=2_000_000, dtype=np.uint64).view(np.float64),
                            rng.standard_normal(100_000), np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e16, 1e-7])])
    assert orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY) == orjson.dumps(array.tolist())


def test_a_record_unpacked_is_decoded_as_before():
    """Without packed_metrics (every lane but the file's, replay's readers, inspect): a plain dict, ints as ints."""
    record = Metrics(step=2, values={"a": 1.5, "n": 7, "z": math.inf}, time=0.0)
    (back,) = decode_batch(encode_batch(Batch(seq=1, created=0.0, records=[record]))).records
    assert type(back.values) is dict and back.values == record.values and type(back.values["n"]) is int


@pytest.mark.parametrize("packed", [False, True])
def test_the_file_sink_writes_the_same_files_from_packed_records(tmp_path: Path, packed: bool):
    """verl's lines, tracklane's own keys and the system axis beside it: the same bytes from packed records as from
    dicts, the own lines included (their dict is built where the sidecar needs it)."""
    records = [Metrics(step=0, values={"loss": 1.25, "n": 3}, time=0.0),
               Metrics(step=0, values={"tracklane/lag_s": 0.5}, time=0.0),
               Metrics(step=3, values={"system/cpu": 50.0}, time=0.0, axis=SYSTEM_AXIS),
               Metrics(step=1, values={"loss": math.nan, "50%": -math.inf}, time=0.0),
               Metrics(step=2, values={}, time=0.0)]
    if packed:
        records = _through_the_wire(records)
    run = RunSpec(project="proj", experiment="exp", params={}, run_id="r1")
    path = tmp_path / "proj" / "exp.jsonl"
    sink = FileSink(run, FileSink.resolve(run, {"VERL_FILE_LOGGER_PATH": str(path)}, {}))
    sink.open(None)
    sink.write(records)
    sink.close(0)
    assert path.read_bytes() == (b'{"step":0,"data":{"loss":1.25,"n":3}}\n{"step":1,"data":{"loss":null,"50%":null}}\n'
                                 b'{"step":2,"data":{}}\n')
    side = sorted((tmp_path / "proj").glob("*_tracklane/metrics.jsonl"))
    assert len(side) == 1
    assert side[0].read_bytes() == (b'{"step":0,"data":{"tracklane/lag_s":0.5}}\n'
                                    b'{"step":3,"axis":"system/elapsed_s","data":{"system/cpu":50.0}}\n')
