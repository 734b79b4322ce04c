"""Property tests and a bounded fuzz of the wire codec and of ``Ack.unpack``.

Valid batches of every record kind round trip exactly; hostile input (random bytes, truncations,
bit flips, zstd bombs, huge msgpack length headers, wrong types anywhere, extension types) raises
only ``CodecError``, and decoding it stays within a few times ``DecodeLimits.max_decoded_bytes``.

By default the generated tests run about 10,000 cases in all, derandomized so CI is stable;
``TRACKLANE_FUZZ_EXAMPLES=N`` scales every test so the file runs about N cases (randomly seeded).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from tracklane.core.acks import Ack, SinkCounts, Work
from tracklane.core.errors import CodecError
from tracklane.core.histogram import HistogramFigures, histogram_figures
from tracklane.core.png import PNG_SIGNATURE
from tracklane.core.records import (
    ALERT_LEVELS,
    RECORD_TYPES,
    Alert,
    Artifact,
    Batch,
    Generations,
    Histogram,
    Image,
    Metrics,
    Record,
    Reduction,
    Text,
    Trace,
    Trajectories,
    Trajectory,
)
from tracklane.core.reduction import OPS, ROLES
from tracklane.core.trajectory_lines import TrajectoryLines
from tracklane.wire.ack import pack_ack, unpack_ack
from tracklane.wire.batch import DecodeLimits, decode_batch, encode_batch

# -- case budget ---------------------------------------------------------------------------------
_DEFAULT_TOTAL = 10_000
_ENV = os.environ.get("TRACKLANE_FUZZ_EXAMPLES")
_TOTAL = int(_ENV) if _ENV else _DEFAULT_TOTAL
_BUDGETS: list[int] = []
# hypothesis's caches (its unicode tables take seconds to build) live in the temp dir, not in a .hypothesis/ of the checkout
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "tracklane-hypothesis"))


def _fuzz(examples: int) -> Callable:
    """Hypothesis settings for a test worth ``examples`` of the default 10,000 cases."""
    _BUDGETS.append(max(1, examples * _TOTAL // _DEFAULT_TOTAL))
    return settings(max_examples=_BUDGETS[-1], deadline=None,
                    derandomize=not _ENV, database=None, print_blob=bool(_ENV),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example, HealthCheck.filter_too_much])


CAP = 2**20
SMALL = DecodeLimits(max_compressed_bytes=4 * CAP, max_decoded_bytes=CAP, max_records=10_000)
"""Small caps, so that anything allocated past them is easy to see."""
SWEEP_CAP = 2**17
SWEEP = DecodeLimits(max_compressed_bytes=4 * SWEEP_CAP, max_decoded_bytes=SWEEP_CAP, max_records=10_000)
"""Smaller still (yet well above the ~200 KB a decode needs whatever the cap), for the sweep of a thousand cap-sized buffers."""

# -- strategies for valid records -----------------------------------------------------------------
_NAN_PAYLOAD = struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]
_special_floats = st.sampled_from([math.nan, -math.nan, _NAN_PAYLOAD, math.inf, -math.inf, -0.0, 0.0, 5e-324,
                                   -1.7976931348623157e308, 2.0**53 + 1])
_floats = st.one_of(st.floats(), _special_floats)
_ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**64 - 1]))
_numbers = st.one_of(_ints, _floats)
_ODD = ["", "\x00", "a/b/c", "\u202egnp.exe", "e\u0301", "\U0001f980", "\U0010ffff", "\ufeff", "\x00\x00", "ключ/值",
        "\ud7ff\ue000", "\x7f\x80", "a" * 300]
_texts = st.one_of(st.text(max_size=8), st.sampled_from(_ODD))  # any code point with UTF-8, and a pool of odd ones
_odd_keys = _texts
_plain = st.one_of(st.none(), st.booleans(), _ints, _floats, _texts)
_only = st.one_of(st.none(), st.lists(_texts, max_size=3))
_common = {"step": _ints, "time": _floats, "only": _only}

_metrics = st.builds(Metrics, values=st.dictionaries(_odd_keys, _numbers, max_size=6), **_common)
_generations = st.builds(Generations, key=_texts,
                         samples=st.lists(st.tuples(_texts, _texts, _numbers).map(list), max_size=3), **_common)
_token_ids = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8).map(lambda ids: struct.pack(f"<{len(ids)}i", *ids))
_trajectory = st.builds(
    Trajectory,
    messages=st.lists(st.dictionaries(_texts, _texts, max_size=2), max_size=2),
    tool_calls=st.lists(st.dictionaries(_texts, _plain, max_size=3), max_size=2),
    rewards=st.dictionaries(_texts, _numbers, max_size=2),
    meta=st.dictionaries(_texts, _plain, max_size=3),
    token_ids=_token_ids,
)
_trajectories = st.builds(Trajectories, key=_texts, trajectories=st.lists(_trajectory, max_size=2), **_common)


@st.composite
def _trajectory_lines(draw: st.DrawFn) -> Trajectories:
    """Trajectories as the shipper carries them: JSON lines, in the frame's tail."""
    step = draw(_ints)
    rows = draw(st.lists(_trajectory, max_size=3))
    return Trajectories(key=draw(_texts), trajectories=TrajectoryLines.render(rows, step), step=step,
                        time=draw(_floats), only=draw(_only))


_f64 = st.lists(_floats, max_size=8).map(lambda xs: struct.pack(f"<{len(xs)}d", *xs))
_random_figures = st.builds(
    HistogramFigures, count=_ints, nan=_ints, posinf=_ints, neginf=_ints, min=_numbers, max=_numbers, mean=_numbers,
    std=_numbers, sum=_numbers, sum_squares=_numbers, bin_edges=st.lists(_numbers, max_size=6),
    counts=st.lists(_ints, max_size=5))


@st.composite
def _histograms(draw: st.DrawFn) -> Histogram:
    """Histograms without figures, with random typed figures, or with the figures the shipper computes."""
    how = draw(st.sampled_from(["none", "random", "computed"]))
    if how == "computed":
        values = draw(st.lists(st.one_of(st.floats(-1e9, 1e9), st.sampled_from([math.nan, math.inf, -math.inf])),
                               max_size=20))
        array = np.array(values, dtype="<f8")
        return Histogram(name=draw(_texts), values=array.tobytes(), figures=histogram_figures(array),
                         **{k: draw(v) for k, v in _common.items()})
    return Histogram(name=draw(_texts), values=draw(_f64), figures=None if how == "none" else draw(_random_figures),
                     **{k: draw(v) for k, v in _common.items()})


_text_records = st.builds(Text, name=_texts, text=st.text(max_size=30), **_common)
_images = st.builds(Image, name=_texts, png=st.binary(max_size=32).map(lambda b: PNG_SIGNATURE + b), **_common)
_artifacts = st.builds(Artifact, path=_texts, name=_texts, type=_texts, **_common)
_reductions = st.builds(Reduction, role=st.sampled_from(sorted(ROLES)), values=st.dictionaries(_texts, _numbers, max_size=3),
                        op=st.sampled_from(["", *OPS]), ops=st.dictionaries(_texts, st.sampled_from(OPS), max_size=2),
                        **_common)
_traces = st.builds(Trace, name=_texts, key=_texts, start_ns=st.integers(0, 2**64 - 1),
                    end_ns=st.integers(0, 2**64 - 1), status=_texts, attributes=st.dictionaries(_texts, _plain, max_size=3),
                    messages=st.lists(st.dictionaries(_texts, _texts, max_size=2), max_size=2),
                    metadata=st.dictionaries(_texts, _plain, max_size=3).map(
                        lambda m: orjson.dumps(m, option=orjson.OPT_NON_STR_KEYS).decode()), **_common)
_records = st.one_of(_metrics, _generations, _trajectories, _trajectory_lines(), _histograms(), _text_records, _images,
                     _artifacts, _reductions, _traces)


def _batches(records: st.SearchStrategy = _records, max_records: int = 4) -> st.SearchStrategy[Batch]:
    return st.builds(Batch, seq=st.integers(0, 2**64 - 1), created=_floats,
                     records=st.lists(records, max_size=max_records))


# -- helpers -------------------------------------------------------------------------------------
def _canon(value: Any) -> Any:
    """A comparable form: floats by their bits (NaN equals the same NaN, -0.0 differs from 0.0), types kept."""
    if type(value) is float:
        return ("float", struct.pack("<d", value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_canon(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((_canon(k), _canon(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value):
        return (type(value).__name__, tuple((f.name, _canon(getattr(value, f.name))) for f in dataclasses.fields(value)))
    return (type(value).__name__, value)


def _raw(wire: Any, content_size: bool = True) -> bytes:
    """A valid zstd frame around any msgpack-able wire (no validation of the structure)."""
    return zstandard.ZstdCompressor(write_content_size=content_size).compress(msgpack.packb(wire, use_bin_type=True))


def _wire(batch: Batch) -> list:
    """The msgpack structure encode_batch puts on the wire (read back without the codec's checks)."""
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(encode_batch(batch)), raw=False)


def _is_number(v: Any) -> bool:
    return type(v) in (int, float)


def _is_plain(v: Any) -> bool:
    return v is None or type(v) in (str, int, float, bool)


def _str_map(d: Any, values: Callable[[Any], bool]) -> bool:
    return type(d) is dict and all(type(k) is str and values(v) for k, v in d.items())


def _well_typed(record: Record) -> bool:
    """The records.py contract, written independently of the codec: what a sink may rely on."""
    if type(record) not in RECORD_TYPES.values() or type(record.step) is not int or type(record.time) is not float:
        return False
    if not (record.only is None or (type(record.only) is list and all(type(b) is str for b in record.only))):
        return False
    if isinstance(record, Metrics):
        return _str_map(record.values, _is_number)
    if isinstance(record, Generations):
        return type(record.key) is str and type(record.samples) is list and all(
            type(r) is list and len(r) == 3 and type(r[0]) is str and type(r[1]) is str and _is_number(r[2])
            for r in record.samples)
    if isinstance(record, Trajectories) and isinstance(record.trajectories, TrajectoryLines):
        rows = record.trajectories
        return type(record.key) is str and len(list(rows)) == len(rows) and rows.step == record.step
    if isinstance(record, Trajectories):
        return type(record.key) is str and type(record.trajectories) is list and all(
            type(t) is Trajectory and type(t.messages) is list and all(_str_map(m, lambda v: type(v) is str)
                                                                        for m in t.messages)
            and type(t.tool_calls) is list and all(_str_map(c, _is_plain) for c in t.tool_calls)
            and _str_map(t.rewards, _is_number) and _str_map(t.meta, _is_plain)
            and type(t.token_ids) is bytes and t.token_array().size * 4 == len(t.token_ids)
            for t in record.trajectories)
    if isinstance(record, Histogram):
        f = record.figures
        return type(record.name) is str and type(record.values) is bytes and record.array().size * 8 == len(record.values) \
            and (f is None or (type(f) is HistogramFigures
                               and all(type(getattr(f, n)) is int for n in ("count", "nan", "posinf", "neginf"))
                               and all(_is_number(getattr(f, n)) for n in ("min", "max", "mean", "std", "sum", "sum_squares"))
                               and type(f.bin_edges) is list and all(map(_is_number, f.bin_edges))
                               and type(f.counts) is list and all(type(n) is int for n in f.counts)))
    if isinstance(record, Text):
        return type(record.name) is str and type(record.text) is str
    if isinstance(record, Alert):
        return type(record.rule) is str and type(record.text) is str and record.level in ALERT_LEVELS
    if isinstance(record, Image):
        return type(record.name) is str and type(record.png) is bytes and record.png.startswith(PNG_SIGNATURE)
    if isinstance(record, Reduction):
        return (record.role in ROLES and _str_map(record.values, _is_number) and (record.op == "" or record.op in OPS)
                and _str_map(record.ops, lambda op: op in OPS))
    if isinstance(record, Trace):
        return (all(type(getattr(record, n)) is str for n in ("name", "key", "status", "metadata"))
                and all(type(getattr(record, n)) is int and getattr(record, n) >= 0 for n in ("start_ns", "end_ns"))
                and _str_map(record.attributes, _is_plain) and type(record.messages) is list
                and all(_str_map(m, lambda v: type(v) is str) for m in record.messages)
                and record.metadata.startswith("{") and record.metadata.endswith("}"))
    return all(type(getattr(record, n)) is str for n in ("path", "name", "type"))


def _decode_or_refuse(blob: bytes, limits: DecodeLimits = SMALL) -> Batch | None:
    """decode_batch, asserting that it either refuses with CodecError or returns only well-typed records."""
    try:
        batch = decode_batch(blob, limits)
    except CodecError:
        return None
    assert type(batch.seq) is int and batch.seq >= 0 and type(batch.created) is float
    assert all(_well_typed(r) for r in batch.records), batch
    return batch


def _peak(fn: Callable[[], Any]) -> int:
    """Peak bytes traced while ``fn`` runs (its result dropped); CodecError is expected and swallowed."""
    tracemalloc.start()
    try:
        fn()
    except CodecError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _paths(obj: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every position in a msgpack structure (the root included), as a tuple of list indices / map keys."""
    yield path
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from _paths(item, (*path, i))
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from _paths(item, (*path, key))


def _get(obj: Any, path: tuple) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def _replace(obj: Any, path: tuple, value: Any) -> Any:
    """A copy of ``obj`` with the value at ``path`` replaced (the rest shared)."""
    if not path:
        return value
    copy = list(obj) if isinstance(obj, list) else dict(obj)
    copy[path[0]] = _replace(obj[path[0]], path[1:], value)
    return copy


def _mutate(obj: Any, path: tuple, op: str, value: Any) -> Any:
    """Replace the value at ``path``, or (for a list or map there) drop an item or add one."""
    target = _get(obj, path)
    if op == "replace" or not isinstance(target, (list, dict)):
        return _replace(obj, path, value)
    if isinstance(target, list):
        return _replace(obj, path, target[:-1] if op == "drop" else [*target, value])
    changed = dict(target)
    if op == "drop" and changed:
        changed.pop(next(iter(changed)))
    else:
        changed[f"extra{len(changed)}"] = value
    return _replace(obj, path, changed)


def _every_kind() -> Batch:
    """One record of each kind, every list and map holding one item, so every nested position exists."""
    common = {"step": 3, "time": 1.5, "only": ["wandb"]}
    figures = histogram_figures(np.array([1.0, 2.0, math.nan]))
    return Batch(seq=7, created=2.5, records=[
        Metrics(values={"loss": 0.5, "n": 2}, **common),
        Generations(key="val/generations", samples=[["in", "out", 0.5]], **common),
        Trajectories(key="rollout/trajectories", trajectories=[Trajectory(
            messages=[{"role": "user", "content": "hi"}], tool_calls=[{"name": "f", "latency_s": 0.1}],
            rewards={"score": 1.0}, meta={"sample_index": 0}, token_ids=struct.pack("<2i", 1, 2))], **common),
        Histogram(name="h", values=struct.pack("<3d", 1.0, 2.0, math.nan), figures=figures, **common),
        Histogram(name="h0", values=b"", figures=None, **common),
        Text(name="t", text="text", **common),
        Image(name="i", png=PNG_SIGNATURE + b"\x00" * 8, **common),
        Artifact(path="/ckpt/a.pt", name="a", type="checkpoint", **common),
        Metrics(values={"loss": 0.5, "big": 2**60}, **common),  # an int past 2**53: the map form
        Reduction(role="part", values={"r": 1.5}, op="", ops={"r": "max"}, **common),
        Trace(name="ToolAgentLoop.run", key="rollout_trace/ToolAgentLoop.run", start_ns=1, end_ns=2, status="success",
              attributes={"sample_index": 0}, messages=[{"role": "user", "content": "hi"}], metadata='{"op":"x"}',
              **common),
        Alert(rule="kl_blowup", text="actor/kl_loss = 5", level="WARN", **common),
    ])


_EVERY_KIND_WIRE = _wire(_every_kind())
_EVERY_PATH = list(_paths(_EVERY_KIND_WIRE))

# -- hostile values --------------------------------------------------------------------------------
_ext = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))
_timestamps = st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999))
_hostile_scalars = st.one_of(
    st.none(), st.booleans(), _ints, _floats, st.text(max_size=8), st.binary(max_size=16), _ext, _timestamps,
    st.sampled_from(["TLB", "metrics", "histogram", "trajectories", "", PNG_SIGNATURE, b"\x00" * 8, b"\x00" * 4]))
_hostile = st.recursive(
    _hostile_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=6), st.binary(max_size=4), st.integers(-3, 3)),
                                            inner, max_size=4)),
    max_leaves=4)


# == 1. round trip ================================================================================
@pytest.mark.slow
@_fuzz(400)
@given(batch=_batches(max_records=3), level=st.sampled_from([1, 3, 9]))
def test_round_trip_every_kind(batch: Batch, level: int) -> None:
    """encode_batch then decode_batch gives back equal records of every kind, bit for bit (NaN, -0.0, types kept)."""
    assert _canon(decode_batch(encode_batch(batch, level))) == _canon(batch)


@_fuzz(300)
@given(batch=_batches(_metrics, max_records=4))
def test_round_trip_metrics(batch: Batch) -> None:
    """Metrics with odd unicode names, NaN/Inf/subnormal floats and 64-bit ints round trip exactly, with and without only."""
    assert _canon(decode_batch(encode_batch(batch))) == _canon(batch)


def test_lone_surrogate_is_sent_not_fatal() -> None:
    """A string without a UTF-8 form (a lone surrogate) is sent as '?' instead of failing the whole batch."""
    batch = Batch(seq=1, created=0.0, records=[Metrics(step=0, time=0.0, values={"a\udc80": 1.0}),
                                               Text(step=0, time=0.0, name="n", text="x\ud800y")])
    decoded = decode_batch(encode_batch(batch))
    assert list(decoded.records[0].values) == ["a?"] and decoded.records[1].text == "x?y"


# == 2. hostile bytes =============================================================================
@pytest.mark.slow
@_fuzz(3500)
@given(blob=st.one_of(st.binary(max_size=64), st.binary(max_size=160).map(lambda b: b"\x28\xb5\x2f\xfd" + b)))
def test_random_bytes(blob: bytes) -> None:
    """Random bytes, with or without the zstd magic in front, raise only CodecError."""
    _decode_or_refuse(blob)


@pytest.mark.slow
@_fuzz(2200)
@given(payload=st.binary(max_size=200), content_size=st.booleans(), checksum=st.booleans())
def test_random_payload_in_a_valid_frame(payload: bytes, content_size: bool, checksum: bool) -> None:
    """Random bytes inside a valid zstd frame (random msgpack) raise only CodecError."""
    blob = zstandard.ZstdCompressor(write_content_size=content_size, write_checksum=checksum).compress(payload)
    _decode_or_refuse(blob)


@_fuzz(400)
@given(wire=st.one_of(_hostile, st.tuples(st.just("TLB"), _hostile, _hostile, _hostile, _hostile).map(list),
                      st.lists(_hostile, max_size=4).map(lambda rs: ["TLB", 1, 1, 0.0, rs])))
def test_random_structures(wire: Any) -> None:
    """Random msgpack values (extension types, timestamps, int keys included), bare or batch-shaped, raise only CodecError."""
    _decode_or_refuse(_raw(wire))


@_fuzz(60)
@given(batch=_batches(max_records=3))
def test_truncated_at_every_length(batch: Batch) -> None:
    """Every prefix of a valid batch is refused; only cutting the frame checksum alone may still decode, to the same batch."""
    blob = encode_batch(batch)
    for n in range(len(blob)):
        decoded = _decode_or_refuse(blob[:n])
        assert decoded is None or (n >= len(blob) - 4 and _canon(decoded) == _canon(batch)), n


@_fuzz(300)
@given(batch=_batches(max_records=2), flips=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 7)),
                                                       min_size=1, max_size=4))
def test_bit_flips(batch: Batch, flips: list[tuple[int, int]]) -> None:
    """A valid batch with random bits flipped is refused with CodecError or still decodes to well-typed records."""
    blob = bytearray(encode_batch(batch))
    for where, bit in flips:
        blob[where % len(blob)] ^= 1 << bit
    _decode_or_refuse(bytes(blob))


@pytest.mark.slow
@_fuzz(1500)
@given(path=st.sampled_from(_EVERY_PATH), op=st.sampled_from(["replace", "replace", "drop", "add"]),
       value=st.one_of(_hostile_scalars, _hostile))
def test_mutated_fields(path: tuple, op: str, value: Any) -> None:
    """Any field of any record kind (or of the header, nested ones included) replaced by a value of any type, or an item
    dropped or added, is refused with CodecError or decodes to well-typed records."""
    _decode_or_refuse(_raw(_mutate(_EVERY_KIND_WIRE, path, op, value)))


# -- wrong types, field by field: the accepted types are the records.py contract ---------------------
def _accepts(spec: Any, v: Any) -> bool:
    if spec == "never":
        return False
    if spec == "int":
        return type(v) is int
    if spec == "uint":
        return type(v) is int and v >= 0
    if spec == "one":
        return type(v) is int and v == 1
    if spec == "two":
        return type(v) is int and v == 2
    if spec == "zero":
        return type(v) is int and v == 0
    if spec == "axis":
        return v is None or (type(v) is str and 0 < len(v) <= 256)
    if spec == "number":
        return _is_number(v)
    if spec == "str":
        return type(v) is str
    if spec == "plain":
        return _is_plain(v)
    if spec == "only":
        return v is None or (type(v) is list and all(type(b) is str for b in v))
    if spec == "f64":
        return type(v) is bytes and len(v) % 8 == 0
    if spec == "i32":
        return type(v) is bytes and len(v) % 4 == 0
    if spec == "png":
        return type(v) is bytes and v.startswith(PNG_SIGNATURE)
    if spec == "role":
        return type(v) is str and v in ROLES
    if spec == "level":
        return type(v) is str and v in ALERT_LEVELS
    if spec == "op":
        return type(v) is str and (v == "" or v in OPS)
    if spec == "opname":
        return type(v) is str and v in OPS
    if spec == "row":
        return type(v) is list and len(v) == 3 and type(v[0]) is str and type(v[1]) is str and _is_number(v[2])
    if spec == "object_text":
        return type(v) is str and v.startswith("{") and v.endswith("}")
    if spec == "figures":
        return v is None  # a map must hold exactly the figures' fields: none of the candidates does
    kind, inner = spec
    if kind == "list":
        return type(v) is list and all(_accepts(inner, x) for x in v)
    return type(v) is dict and all(type(k) is str and _accepts(inner, x) for k, x in v.items())


_COMMON_SPECS = [(("step",), "int"), (("time",), "number"), (("only",), "only"), (("only", 0), "str")]
_TRAJECTORY = ("trajectories", 0)
_FIGURES = ("figures",)
_SPECS: dict[int, list[tuple[tuple, Any]]] = {  # index of the record in _every_kind() -> (path in its fields, spec)
    0: [((), "never"), ((0,), "never"), ((1,), "int"), ((2,), "number"), ((3,), "zero"), ((4,), "never"),
        ((5,), "only"), ((5, 0), "str"), ((6,), "axis")],  # keyed metrics: schema 0, its 16 bytes of numbers
    8: [((), "never"), ((0,), "never"), ((1,), "int"), ((2,), "number"), ((3,), ("dict", "number")),
        ((3, "loss"), "number"), ((4,), "only"), ((4, 0), "str")],
    1: [(("key",), "str"), (("samples",), ("list", "row")), (("samples", 0), "row"), (("samples", 0, 0), "str"),
        (("samples", 0, 1), "str"), (("samples", 0, 2), "number")],
    2: [(("key",), "str"), (("trajectories",), ("list", "never")), (_TRAJECTORY, "never"),
        ((*_TRAJECTORY, "messages"), ("list", ("dict", "str"))), ((*_TRAJECTORY, "messages", 0), ("dict", "str")),
        ((*_TRAJECTORY, "messages", 0, "role"), "str"), ((*_TRAJECTORY, "tool_calls"), ("list", ("dict", "plain"))),
        ((*_TRAJECTORY, "tool_calls", 0), ("dict", "plain")), ((*_TRAJECTORY, "tool_calls", 0, "latency_s"), "plain"),
        ((*_TRAJECTORY, "rewards"), ("dict", "number")), ((*_TRAJECTORY, "rewards", "score"), "number"),
        ((*_TRAJECTORY, "meta"), ("dict", "plain")), ((*_TRAJECTORY, "meta", "sample_index"), "plain"),
        ((*_TRAJECTORY, "token_ids"), "i32")],
    3: [(("name",), "str"), (("values",), "f64"), (_FIGURES, "figures"),
        *[((*_FIGURES, n), "int") for n in ("count", "nan", "posinf", "neginf")],
        *[((*_FIGURES, n), "number") for n in ("min", "max", "mean", "std", "sum", "sum_squares")],
        ((*_FIGURES, "bin_edges"), ("list", "number")), ((*_FIGURES, "bin_edges", 0), "number"),
        ((*_FIGURES, "counts"), ("list", "int")), ((*_FIGURES, "counts", 0), "int")],
    5: [(("name",), "str"), (("text",), "str")],
    6: [(("name",), "str"), (("png",), "png")],
    7: [(("path",), "str"), (("name",), "str"), (("type",), "str")],
    10: [(("name",), "str"), (("key",), "str"), (("status",), "str"), (("start_ns",), "uint"), (("end_ns",), "uint"),
         (("attributes",), ("dict", "plain")), (("attributes", "sample_index"), "plain"),
         (("messages",), ("list", ("dict", "str"))), (("messages", 0), ("dict", "str")),
         (("messages", 0, "role"), "str"), (("metadata",), "object_text")],
    11: [(("rule",), "str"), (("text",), "str"), (("level",), "level")],
    9: [(("role",), "role"), (("values",), ("dict", "number")), (("values", "r"), "number"), (("op",), "op"),
        (("ops",), ("dict", "opname")), (("ops", "r"), "opname")],
}
_CANDIDATES = [None, True, False, 0, 1, -1, 2**64 - 1, 1.5, math.nan, -math.inf, "", "x", b"", b"\x00" * 4, PNG_SIGNATURE,
               [], ["x"], [1], [None], {}, {"a": 1}, {"a": "x"}, {"a": None}, {"a": [1]}, msgpack.ExtType(1, b"x"),
               msgpack.Timestamp(0, 0)]


def _field_cases() -> Iterator[tuple[str, tuple, Any]]:
    """(kind, path in the batch's wire, spec) for every field; a metrics record is a list, the others [kind, {fields}]."""
    for path, spec in [((), "never"), ((0,), "never"), ((1,), "two"), ((2,), "uint"), ((3,), "number"),
                       ((4,), ("list", "never")), ((5,), "never")]:
        yield "header", path, spec
    # The metrics schema table: [["loss", "n"], [1]] ("n" holds an int)
    for path, spec in [((5, 0), "never"), ((5, 0, 0), "never"), ((5, 0, 0, 0), "str"), ((5, 0, 1), ("list", "one")),
                       ((5, 0, 1, 0), "one")]:
        yield "schemas", path, spec
    for index, specs in _SPECS.items():
        kind = _EVERY_KIND_WIRE[4][index][0]
        if index in (0, 8):  # metrics records are lists
            for path, spec in specs:
                yield kind, (4, index, *path), spec
            continue
        for path, spec in [((), "never"), ((0,), "never"), ((1,), "never")]:
            yield kind, (4, index, *path), spec
        for path, spec in [*_COMMON_SPECS, *specs]:
            yield kind, (4, index, 1, *path), spec


@pytest.mark.parametrize("kind", ["header", "schemas", "m", *RECORD_TYPES])
def test_wrong_type_in_every_field(kind: str) -> None:
    """Each field of each record kind (and of the header), nested ones included, accepts exactly the types records.py
    promises: any other type (extension types included) is refused with CodecError."""
    cases = [(path, spec) for k, path, spec in _field_cases() if k == kind]
    assert cases
    for path, spec in cases:
        for candidate in _CANDIDATES:
            blob = _raw(_replace(_EVERY_KIND_WIRE, path, candidate))
            accepted = _accepts(spec, candidate)
            try:
                batch = decode_batch(blob, SMALL)
            except CodecError:
                assert not accepted, (path, candidate)
            else:
                assert accepted and all(_well_typed(r) for r in batch.records), (path, candidate)


def test_bytes_and_extra_keys_in_every_map() -> None:
    """Every map of a batch given a bytes key beside its str keys (msgpack allows both), a key turned into bytes, or an
    extra key, is refused with CodecError (never a TypeError from sorting mixed keys) or decodes to well-typed records."""
    for path in _EVERY_PATH:
        target = _get(_EVERY_KIND_WIRE, path)
        if not isinstance(target, dict):
            continue
        first = next(iter(target))
        for variant in ({**target, b"step": 1}, {first.encode(): target[first], **target}, {**target, "extra": 1}):
            _decode_or_refuse(_raw(_replace(_EVERY_KIND_WIRE, path, variant)))


_MARK = "\x00MARK\x00"


def _splice(wire: Any, path: tuple, raw: bytes, key: bool = False) -> tuple[bytes, bytes]:
    """msgpack of ``wire`` with the item at ``path`` (or, if ``key``, a map key there) replaced by the bytes ``raw``,
    as (prefix + raw, suffix); for what msgpack.packb cannot write (reserved ext codes, 1000-deep nesting)."""
    packed = msgpack.packb(_replace(wire, path, {_MARK: None} if key else _MARK), use_bin_type=True)
    at = packed.index(msgpack.packb(_MARK))
    return packed[:at] + raw, packed[at + len(msgpack.packb(_MARK)):]


def _positions(wire: Any) -> Iterator[tuple[tuple, bool]]:
    """Every (path, as_key) of a wire: each item, and a key of each map."""
    for path in _paths(wire):
        yield path, False
        if isinstance(_get(wire, path), dict):
            yield path, True


_DEEP = b"\x91" * 1000 + b"\xc0"  # 1000 nested one-item arrays: msgpack.packb refuses to write it, its reader does not


@pytest.mark.parametrize("code", [0, 1, 5, 127, -1, -2, -128])
def test_extension_types_anywhere(code: int) -> None:
    """An extension value (any type code, msgpack's timestamp -1 and the reserved negative codes included) anywhere in a
    batch, map keys included, is refused with CodecError."""
    ext = b"\xd6" + code.to_bytes(1, "big", signed=True) + b"\x00" * 4  # fixext 4 (a valid timestamp for -1)
    for path, key in _positions(_EVERY_KIND_WIRE):
        with pytest.raises(CodecError):
            decode_batch(zstandard.ZstdCompressor().compress(b"".join(_splice(_EVERY_KIND_WIRE, path, ext, key))), SMALL)


def test_deep_nesting_anywhere() -> None:
    """A 1000-deep nested array at any position of a batch (map keys included) is refused with CodecError, never a
    RecursionError from building an error message."""
    for path, key in _positions(_EVERY_KIND_WIRE):
        _decode_or_refuse(zstandard.ZstdCompressor().compress(b"".join(_splice(_EVERY_KIND_WIRE, path, _DEEP, key))))


# -- caps: bombs and huge length headers, measured with tracemalloc ---------------------------------
def _rle_block(size: int, last: bool) -> bytes:
    """A zstd RLE block: ``size`` copies of a zero byte, 4 bytes on the wire."""
    return (int(last) | (1 << 1) | (size << 3)).to_bytes(3, "little") + b"\x00"


def _rle_frame(total: int, declared: int | None, window_log: int | None) -> bytes:
    """A hand-made zstd frame of ``total`` zero bytes in 128 KiB RLE blocks; ``declared`` may lie about it."""
    block = 2**17 if window_log else max(1, min(2**17, declared or 1))
    n = max(1, total // block)
    blocks = b"".join(_rle_block(block, i == n - 1) for i in range(n))
    magic = struct.pack("<I", 0xFD2FB528)
    if window_log is None:  # single segment: the declared size is also the window
        return magic + bytes([0b1110_0000]) + struct.pack("<Q", declared or 0) + blocks
    window = bytes([(window_log - 10) << 3])
    if declared is None:
        return magic + b"\x00" + window + blocks
    return magic + bytes([0b1100_0000]) + window + struct.pack("<Q", declared) + blocks


def _streamed_zeros(total: int, content_size: bool, head: bytes = b"") -> bytes:
    """``head`` then zeros, compressed with zstandard by streaming (never ``total`` bytes in memory)."""
    out = io.BytesIO()
    chunk = bytes(4 * 2**20)
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    with compressor.stream_writer(out, size=total + len(head) if content_size else -1, closefd=False) as writer:
        writer.write(head)
        for _ in range(total // len(chunk)):
            writer.write(chunk)
    return out.getvalue()


@cache
def _bomb(name: str) -> bytes:
    two_gib = 2**31
    return {
        "zstandard, 2 GiB of zeros, size declared": lambda: _streamed_zeros(two_gib, True),
        "zstandard, 2 GiB of zeros, no size": lambda: _streamed_zeros(two_gib, False),
        "zstandard, a 2**32-1 array header then 64 MiB, no size": lambda: _streamed_zeros(2**26, False, b"\xdd" + b"\xff" * 4),
        "RLE blocks, 2 GiB held, 100 bytes declared": lambda: _rle_frame(two_gib, 100, 27),
        "RLE blocks, 16 MiB held, single segment of 100 bytes": lambda: _rle_frame(2**24, 100, None),
        "RLE blocks, 2 GiB held, no size, 128 MiB window": lambda: _rle_frame(two_gib, None, 27),
        "RLE blocks, no size, 2 GiB window": lambda: _rle_frame(2**20 + 2**17, None, 31),
    }[name]()


_BOMBS = ["zstandard, 2 GiB of zeros, size declared", "zstandard, 2 GiB of zeros, no size",
          "zstandard, a 2**32-1 array header then 64 MiB, no size", "RLE blocks, 2 GiB held, 100 bytes declared",
          "RLE blocks, 16 MiB held, single segment of 100 bytes", "RLE blocks, 2 GiB held, no size, 128 MiB window",
          "RLE blocks, no size, 2 GiB window"]


@pytest.mark.parametrize("name", _BOMBS)
def test_zstd_bomb(name: str) -> None:
    """A small frame that inflates past max_decoded_bytes (declared, undeclared or lied about) is refused, and decoding
    it allocates no more than the cap (plus a little)."""
    bomb = _bomb(name)
    assert len(bomb) < 2**20
    with pytest.raises(CodecError):
        decode_batch(bomb, SMALL)
    assert _peak(lambda: decode_batch(bomb, SMALL)) < CAP + 64 * 1024


def test_zstd_bomb_resident_memory(tmp_path: Any) -> None:
    """In a fresh process, decoding the hand-made bombs (zstd's own window buffers included, which tracemalloc cannot
    see) raises the resident-set high-water mark by less than 4x the cap."""
    bombs = [_bomb(name) for name in _BOMBS if name.startswith("RLE")]
    (tmp_path / "bombs").write_bytes(msgpack.packb(bombs))
    script = textwrap.dedent(f"""
        import gc, re, msgpack
        from tracklane.wire.batch import DecodeLimits, decode_batch
        from tracklane.core.errors import CodecError
        bombs = msgpack.unpackb(open({str(tmp_path / "bombs")!r}, "rb").read())
        gc.collect()
        def kib(field):
            return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the high-water mark to the current resident set
        except OSError:
            print("skip")
            raise SystemExit(0)
        before = kib("VmRSS")
        for bomb in bombs:
            try:
                decode_batch(bomb, DecodeLimits(max_decoded_bytes={CAP}))
            except CodecError:
                pass
        print(kib("VmHWM") - before)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    if out[-1] == "skip":
        pytest.skip("/proc/self/clear_refs is not writable here")
    assert int(out[-1]) * 1024 < 4 * CAP, out


_HEADERS = {"array32": b"\xdd", "map32": b"\xdf", "str32": b"\xdb", "bin32": b"\xc6", "ext32": b"\xc9",
            "array16": b"\xdc", "map16": b"\xde", "str16": b"\xda", "bin16": b"\xc5", "ext16": b"\xc8"}


def _hostile_header(path: tuple, header: str, length: int, pad_to: int, key: bool = False) -> bytes:
    """A valid batch cut at ``path`` (a map key there if ``key``) by a msgpack header declaring ``length`` items or bytes,
    then a filler that makes the buffer ``pad_to`` bytes long but never completes an item (so every length check is live)."""
    width = 4 if header.endswith("32") else 2
    head = _HEADERS[header] + min(length, 2 ** (8 * width) - 1).to_bytes(width, "big") + (b"\x01" if "ext" in header else b"")
    filler = b"\xdb\xff\xff\xff\xff"  # a str32 that never arrives: the item under the header stays incomplete
    body = _splice(_EVERY_KIND_WIRE, path, head + filler, key)[0]
    return zstandard.ZstdCompressor(level=1).compress(body + b"\x00" * max(0, pad_to - len(body)))


@pytest.mark.slow
def test_huge_length_headers_everywhere() -> None:
    """A header declaring 2**32-1 (or about the buffer's length) array items, map pairs, str, bin or ext bytes, at any
    position of a batch (map keys included), inside a valid frame, is refused within 5x the cap (the decoded bytes, and
    for a complete str of bad UTF-8 the decoder's buffer and its error's copy of the bytes)."""
    cases = [(header, length, pad_to) for header in _HEADERS if header.endswith("32")
             for length, pad_to in ((2**32 - 1, 0), (SWEEP_CAP - 17, SWEEP_CAP - 16), (SWEEP_CAP // 2 - 9, SWEEP_CAP - 16))]
    cases += [(header, 2**16 - 1, pad_to) for header in _HEADERS if header.endswith("16") for pad_to in (0, 2**16 + 64)]
    for path, key in _positions(_EVERY_KIND_WIRE):
        for header, length, pad_to in cases:
            blob = _hostile_header(path, header, length, pad_to, key)
            tracemalloc.start()
            try:
                with pytest.raises(CodecError):
                    decode_batch(blob, SWEEP)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 5 * SWEEP_CAP, (path, key, header, length, peak)


@_fuzz(150)
@given(path=st.sampled_from(_EVERY_PATH), header=st.sampled_from(sorted(_HEADERS)), length=st.integers(0, 2**32 - 1),
       pad_to=st.integers(0, CAP - 16), content_size=st.booleans())
def test_random_length_headers_stay_within_the_cap(path: tuple, header: str, length: int, pad_to: int,
                                                   content_size: bool) -> None:
    """Whatever length a msgpack header declares, wherever it sits, decoding raises only CodecError within 5x the cap."""
    blob = _hostile_header(path, header, length, pad_to)
    if not content_size:
        blob = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(
            zstandard.ZstdDecompressor().decompress(blob))
    peak = _peak(lambda: _decode_or_refuse(blob))
    assert peak < 5 * CAP


@pytest.mark.parametrize("flood, per_byte", [(b"\x80", 80), (b"\x90", 72), (b"\xc0", 10), (b"\xa2ab", 30),
                                             (b"\xcb" + b"\x00" * 8, 6)])
def test_object_amplification_within_the_cap(flood: bytes, per_byte: int) -> None:
    """Known limit, pinned: max_decoded_bytes caps bytes, not Python objects; msgpack within the cap builds up to ~75 bytes
    of objects per decoded byte (a flood of empty maps), which bounds a decode's memory at about 75x the cap."""
    cap = 2**16  # the factors do not depend on the cap
    n = (cap - 16) // len(flood)
    blob = zstandard.ZstdCompressor().compress(b"\xdd" + n.to_bytes(4, "big") + flood * n)
    peak = _peak(lambda: decode_batch(blob, DecodeLimits(max_decoded_bytes=cap)))
    assert peak < per_byte * cap


def test_nested_preallocation_within_the_cap() -> None:
    """Known limit, pinned: 1024 nested arrays each declaring 2**20 items preallocate at most 10,000 slots apiece
    (msgpack's own bound), about 80 MiB in all, whatever the cap; deeper nesting is refused."""
    for depth in (1024, 1025):
        nest = (b"\xdd" + (CAP - 6000).to_bytes(4, "big")) * depth
        blob = zstandard.ZstdCompressor().compress(nest + b"\xdb\xff\xff\xff\xff" + b"\x00" * (CAP - 16 - len(nest)))
        assert _peak(lambda blob=blob: decode_batch(blob, SMALL)) < 1024 * 10_000 * 8 + 4 * CAP


def test_default_limits_do_not_preallocate_the_cap() -> None:
    """Decoding a small batch under the default 1 GiB cap allocates about the batch, not the cap."""
    blob = encode_batch(_every_kind())
    assert _peak(lambda: decode_batch(blob)) < 256 * 1024


# == Ack.unpack ===================================================================================
_ACK_WIRE = msgpack.unpackb(pack_ack(Ack(handed=3, error="e", counts=SinkCounts(unsupported={"a": 1}, cuts={"c": 2}),
                                where="w", pid=12, node_id="n")), raw=False)


def _ack_field(annotation: str) -> st.SearchStrategy:
    return {"int": st.integers(-(2**63), 2**64 - 1), "bool": st.booleans(), "str": st.text(max_size=12),
            "float": st.floats(0, 1e12),
            "str | None": st.none() | st.text(max_size=12), "int | None": st.none() | st.integers(-(2**63), 2**64 - 1),
            "dict[str, int]": st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1), max_size=3),
            "SinkCounts": st.builds(SinkCounts, failed_records=st.integers(0, 2**63), artifacts_missing=st.integers(0, 9),
                                    unsupported=st.dictionaries(st.text(max_size=8), st.integers(0, 99), max_size=3),
                                    cuts=st.dictionaries(st.text(max_size=8), st.integers(0, 99), max_size=3)),
            "Work": st.builds(Work, busy_s=st.floats(0, 1e9), cpu_s=st.floats(0, 1e9), records=st.integers(0, 2**63)),
            }[annotation]


_acks = st.fixed_dictionaries({f.name: _ack_field(str(f.type)) for f in dataclasses.fields(Ack)}).map(lambda kw: Ack(**kw))


def _ack_well_typed(ack: Ack) -> bool:
    counts = ack.counts
    return (type(ack.handed) is int and type(ack.pid) is int and (ack.stored is None or type(ack.stored) is int)
            and _str_map(ack.handed_by_sender, lambda n: type(n) is int)
            and _str_map(ack.stored_by_sender, lambda n: type(n) is int)
            and type(ack.output) is str
            and all(type(getattr(ack, f.name)) is bool for f in dataclasses.fields(Ack) if f.type == "bool")
            and (ack.error is None or type(ack.error) is str) and type(ack.where) is str and type(ack.node_id) is str
            and (ack.last_error is None or type(ack.last_error) is str) and type(ack.last_error_at) is float
            and type(counts.failed_records) is int and type(counts.artifacts_missing) is int
            and _str_map(counts.unsupported, lambda n: type(n) is int) and _str_map(counts.cuts, lambda n: type(n) is int)
            and type(ack.work.busy_s) is float and type(ack.work.cpu_s) is float and type(ack.work.records) is int)


def _unpack_or_refuse(blob: bytes) -> None:
    try:
        ack = unpack_ack(blob)
    except CodecError:
        return
    assert _ack_well_typed(ack), ack


@_fuzz(300)
@given(ack=_acks)
def test_ack_round_trip(ack: Ack) -> None:
    """Ack.pack then Ack.unpack gives back an equal Ack."""
    assert unpack_ack(pack_ack(ack)) == ack


@_fuzz(400)
@given(blob=st.one_of(st.binary(max_size=100), st.builds(msgpack.packb, _hostile)))
def test_ack_hostile_bytes(blob: bytes) -> None:
    """Random bytes and random msgpack values given to Ack.unpack raise only CodecError."""
    _unpack_or_refuse(blob)


@_fuzz(490)
@given(path=st.sampled_from(list(_paths(_ACK_WIRE))), op=st.sampled_from(["replace", "replace", "drop", "add"]),
       value=st.one_of(_hostile_scalars, _hostile))
def test_ack_mutated_fields(path: tuple, op: str, value: Any) -> None:
    """Any field of an acknowledgement (its counts included) given a value of any type, or dropped, or one added,
    raises only CodecError or unpacks to a well-typed Ack."""
    _unpack_or_refuse(msgpack.packb(_mutate(_ACK_WIRE, path, op, value), use_bin_type=True))


def test_ack_wrong_type_in_every_field() -> None:
    """Each top-level field of an acknowledgement given each wrong-typed candidate raises only CodecError (never the
    TypeError or ValueError of a conversion) or unpacks to a well-typed Ack."""
    for index in range(len(_ACK_WIRE)):
        for candidate in [*_CANDIDATES, "abc", math.inf, 2**64 - 1, -(2**63)]:
            _unpack_or_refuse(msgpack.packb(_replace(_ACK_WIRE, (index,), candidate), use_bin_type=True))
    for path, key in _positions(_ACK_WIRE):
        for raw in (_DEEP, b"\xd6\xff" + b"\x00" * 4, b"\xd6\x05" + b"\x00" * 4):  # deep nesting, a timestamp, an ext
            _unpack_or_refuse(b"".join(_splice(_ACK_WIRE, path, raw, key)))


def test_case_budget() -> None:
    """The generated tests' max_examples add up to TRACKLANE_FUZZ_EXAMPLES (10,000 by default), to rounding."""
    assert len(_BUDGETS) >= 12 and abs(sum(_BUDGETS) - _TOTAL) <= len(_BUDGETS)
