"""Batches on the wire: msgpack inside a zstd frame. Never pickle.

Wire layout: a zstd frame of the header, a msgpack array, or when the batch has a tail of
``"TLB3" | header length u32 | header | tail``::

    ["TLB", 3, seq, created, [record, ...], [metrics schema, ...]]
    record = ["m", step, time, schema index, numbers, only, axis]   # metrics by key table (wire/metrics.py)
           | ["metrics", step, time, {name: number}, only]   # only: [backend, ...] or nil
           | ["metrics", step, time, {name: number}, only, axis]   # a step on another axis (str)
           | ["trajectory_lines", {step, time, key, only, at, size, count}]   # Trajectories as JSON lines
           | [kind, {field: value}]                          # every other kind (records.py)

The tail holds the bytes of every trajectory_lines record (``size`` bytes at ``at``): a dump's rows are never copied
into msgpack or out of it, and a lane reads them as a view of the decompressed frame (the file tracker appends
them as they are: core/trajectory_lines.py). Versions 1 and 2 (spools of earlier releases) are the bare msgpack
array in the frame, with no tail: version 1 has no schema table and no "m" records, version 2 carries trajectories
only as ``[kind, {field: value}]`` (both still read).

Decoding treats its input as hostile: sizes are capped before and after
decompression, msgpack refuses extension types, and every field is type-checked,
so a corrupt or crafted batch raises ``CodecError`` instead of doing harm.
"""

from __future__ import annotations

import reprlib
import struct
from dataclasses import dataclass
from itertools import chain
from typing import Any

import msgpack
import numpy as np
import zstandard

from tracklane.core.errors import CodecError
from tracklane.core.histogram import FIELDS as HISTOGRAM_FIELDS
from tracklane.core.histogram import HistogramFigures
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
from tracklane.wire.metrics import KIND as KEYED_METRICS
from tracklane.wire.metrics import SchemaTable, is_axis, is_verl_data, metrics_from_wire, schemas_from_wire

MAGIC = "TLB"
TRAJECTORY_LINES = "trajectory_lines"
"""The wire kind of a ``Trajectories`` record whose rows are JSON lines (``TrajectoryLines``)."""
VERSION = 3
VERSIONS = {1: 5, 2: 6, 3: 6}
_PREFIX = struct.Struct("<4sI")  # "TLB3", header length
_PREFIX_MAGIC = b"TLB3"
"""Version -> fields of the batch array."""


@dataclass(slots=True, kw_only=True, frozen=True)
class DecodeLimits:
    """Caps applied when decoding a batch that came from elsewhere."""

    max_compressed_bytes: int = 256 * 2**20
    max_decoded_bytes: int = 1024 * 2**20
    max_records: int = 1_000_000


STORED = -131072
"""zstd's fastest level: the frame holds raw blocks (ratio 1.0), its checksum still checked (a bulk batch's default)."""


def encode_batch(batch: Batch, level: int | None = 3) -> bytes:
    """msgpack + zstd encoding of one batch (runs on the shipper thread, never the caller's); ``level`` None:
    ``STORED``."""
    schemas = SchemaTable()
    tail: list[bytes | memoryview] = []
    records = [(schemas.pack(r) if isinstance(r, Metrics) else None) or _record_to_wire(r, tail) for r in batch.records]
    wire = [MAGIC, VERSION, batch.seq, batch.created, records, schemas.wire]
    try:
        header = msgpack.packb(wire, use_bin_type=True)
    except UnicodeEncodeError:  # a lone surrogate (an os.fsdecode'd name, say) has no UTF-8: sent as "?"
        header = msgpack.packb(wire, use_bin_type=True, unicode_errors="replace")
    compressor = zstandard.ZstdCompressor(level=STORED if level is None else level, write_content_size=True,
                                          write_checksum=True)
    if not tail:
        return compressor.compress(header)
    parts = [_PREFIX.pack(_PREFIX_MAGIC, len(header)), header, *tail]
    stream = compressor.compressobj(size=sum(map(len, parts)))  # the tail's pieces go in as they are, not joined
    return b"".join([*(stream.compress(part) for part in parts), stream.flush()])


def shared(blob: bytes) -> np.ndarray:
    """A batch as Ray should hold it: as a uint8 array, a lane reads it in Ray's shared memory without a copy (bytes
    are copied into the actor's heap before its call starts: 0.6 ms/MB, a third of a lane's CPU for a dump)."""
    return np.frombuffer(blob, dtype=np.uint8)


def encode_what_encodes(records: list[Record], seq: int, created: float, level: int | None = 3, check: bool = False,
                        ) -> tuple[bytes | None, list[Record], list[tuple[Record, Exception]]]:
    """A batch of the records that encode (and, with ``check``, decode back): the whole batch when it does,
    else each record tried alone and the bad ones left out, so one bad record never costs the others.
    Returns (the batch's bytes, or None when no record is left; the records in it; each refused record with
    its error)."""
    try:
        blob = encode_batch(Batch(seq=seq, created=created, records=records), level)
        if check:
            decode_batch(blob)
        return blob, records, []
    except Exception:  # msgpack, zstd and the checks raise several unrelated types
        pass
    kept: list[Record] = []
    refused: list[tuple[Record, Exception]] = []
    for record in records:
        try:
            alone = encode_batch(Batch(seq=0, created=0.0, records=[record]), level)
            if check:
                decode_batch(alone)
        except Exception as exc:
            refused.append((record, exc))
        else:
            kept.append(record)
    return (encode_batch(Batch(seq=seq, created=created, records=kept), level) if kept else None), kept, refused


def _record_to_wire(record: Record, tail: list[bytes | memoryview]) -> list:
    if isinstance(record, Metrics):  # the common case stays compact
        if record.verl_data is not None:
            return [Metrics.kind, record.step, record.time, record.values, record.only, record.axis, record.verl_data]
        if record.axis is None:
            return [Metrics.kind, record.step, record.time, record.values, record.only]
        return [Metrics.kind, record.step, record.time, record.values, record.only, record.axis]
    if isinstance(record, Trajectories) and isinstance(record.trajectories, TrajectoryLines):
        lines = record.trajectories.lines
        at = sum(map(len, tail))
        tail.append(lines)
        return [TRAJECTORY_LINES, {"step": record.step, "time": record.time, "key": record.key, "only": record.only,
                                   "at": at, "size": len(lines), "count": record.trajectories.rows}]
    fields = {name: getattr(record, name) for name in record.__slots__}
    if isinstance(record, Trajectories):
        fields["trajectories"] = [{name: getattr(t, name) for name in t.__slots__} for t in record.trajectories]
    if isinstance(record, Histogram) and record.figures is not None:
        fields["figures"] = record.figures.to_plain()
    return [record.kind, fields]


def decode_batch(blob: Any, limits: DecodeLimits = DecodeLimits(), packed_metrics: bool = False) -> Batch:
    """Decode and validate one batch (bytes, or any buffer: a lane gets a read-only array over Ray's shared memory);
    raises ``CodecError`` on anything malformed. ``packed_metrics``: keyed metrics records keep their numbers packed
    (core/packed_values.py), for a sink that renders them (``Sink.reads_packed_metrics``)."""
    try:
        view = memoryview(blob).cast("B")
    except (TypeError, ValueError):
        raise CodecError(f"a batch must be bytes, got {type(blob).__name__}") from None
    if len(view) > limits.max_compressed_bytes:
        raise CodecError(f"batch of {len(view)} bytes exceeds the {limits.max_compressed_bytes}-byte limit")
    content = memoryview(_decompress(view, limits.max_decoded_bytes))
    header, tail = content, None
    if content[:4] == _PREFIX_MAGIC:
        if len(content) < _PREFIX.size:
            raise CodecError("batch is truncated: no room for its header's length")
        length = _PREFIX.unpack_from(content)[1]
        if _PREFIX.size + length > len(content):
            raise CodecError(f"batch header of {length} bytes runs past the batch's {len(content)}")
        header, tail = content[_PREFIX.size:_PREFIX.size + length], content[_PREFIX.size + length:]
    try:
        wire = msgpack.unpackb(header, raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext)
    except CodecError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CodecError(f"batch is not valid msgpack: {exc}") from exc
    return _batch_from_wire(wire, limits, tail, packed_metrics)


def _decompress(blob: memoryview, limit: int) -> bytes:
    try:
        declared = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise CodecError(f"batch is not a zstd frame: {exc}") from exc
    if declared > limit:
        raise CodecError(f"batch declares {declared} decoded bytes, over the {limit}-byte limit")
    try:
        with zstandard.ZstdDecompressor().stream_reader(blob) as reader:
            # read() allocates its whole argument up front: ask for what the frame declares, not the cap
            packed = reader.read((declared if declared >= 0 else limit) + 1)
    except zstandard.ZstdError as exc:
        raise CodecError(f"batch is corrupt: {exc}") from exc
    if len(packed) > limit:
        raise CodecError(f"batch decodes to more than the {limit}-byte limit")
    if declared >= 0 and len(packed) != declared:
        raise CodecError(f"batch is truncated or corrupt: {len(packed)} decoded bytes, {declared} declared")
    return packed


def _refuse_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack extension type {code} is not allowed in a batch")


def _batch_from_wire(wire: Any, limits: DecodeLimits, tail: memoryview | None, packed: bool = False) -> Batch:
    if not (isinstance(wire, list) and len(wire) in VERSIONS.values() and wire[0] == MAGIC):
        raise CodecError("batch header is missing or wrong")
    version = wire[1]
    if type(version) is not int or VERSIONS.get(version) != len(wire):
        raise CodecError(f"batch version {_short(version)} is not supported (expected {VERSION})")
    if version < 3 and tail is not None:
        raise CodecError(f"batch version {version} cannot have a tail")
    _, _, seq, created, records = wire[:5]
    schemas = schemas_from_wire(wire[5]) if version >= 2 else []
    _expect(type(seq) is int and seq >= 0, "sequence number must be a non-negative int")
    _expect(type(created) in (int, float), "batch time must be a number")
    _expect(isinstance(records, list), "batch records must be a list")
    if len(records) > limits.max_records:
        raise CodecError(f"batch holds {len(records)} records, over the {limits.max_records} limit")
    return Batch(seq=seq, created=float(created), records=[_record_from_wire(r, schemas, tail, packed) for r in records])


def _record_from_wire(wire: Any, schemas: list, tail: memoryview | None, packed: bool = False) -> Record:
    _expect(isinstance(wire, list) and len(wire) >= 1, "record must be a non-empty list")
    kind = wire[0]
    if kind == KEYED_METRICS:
        return metrics_from_wire(wire, schemas, packed)
    if kind == Metrics.kind:
        _expect(len(wire) in (5, 6, 7), "metrics record must have 5 to 7 fields")
        _, step, when, values, only = wire[:5]
        axis = wire[5] if len(wire) >= 6 else None
        verl_data = wire[6] if len(wire) == 7 else None
        _expect(is_verl_data(verl_data), "metrics verl_data must be nil or one JSON object's bytes")
        _expect(is_axis(axis), "metrics axis must be a short string")
        _expect(type(step) is int, "metrics step must be an int")
        _expect(type(when) in (int, float), "metrics time must be a number")
        _expect(isinstance(values, dict), "metrics values must be a map")
        # Types checked in C (set of map of type): the per-key loop with its messages cost as much as the
        # rest of decoding. A failure then names the first bad key, as before.
        if not _str_map_of(values, _NUMERIC):
            for key, value in values.items():
                _expect(type(key) is str, "metric names must be strings")
                _expect(type(value) in _NUMERIC, f"metric {key!r} must be a number")
        _expect(_is_only(only), "metrics 'only' must be nil or a list of backend names")
        return Metrics(step=step, time=float(when), values=values, only=only, axis=axis, verl_data=verl_data)
    schema = _SCHEMAS.get(kind) if type(kind) is str else None  # a list or map kind is unhashable
    if schema is None:
        raise CodecError(f"malformed batch: unknown record kind {_short(kind)}")
    _expect(len(wire) == 2 and isinstance(wire[1], dict), f"{kind} record must be [kind, fields]")
    fields = wire[1]
    if set(fields) != set(schema):  # keys may mix str and bytes: sort their reprs, and only on failure
        raise CodecError(f"malformed batch: {kind} record has fields {sorted(map(_short, fields))}, "
                         f"expected {sorted(schema)}")
    for name, check in schema.items():
        _expect(check(fields[name]), f"{kind} field {name!r} is malformed")
    if kind == TRAJECTORY_LINES:
        at, size = fields["at"], fields["size"]
        _expect(tail is not None and at + size <= len(tail), "trajectory lines run past the batch's tail")
        assert tail is not None
        lines = TrajectoryLines(tail[at:at + size], fields["count"], fields["step"])
        lines.check()
        return Trajectories(step=fields["step"], trajectories=lines, time=float(fields["time"]), key=fields["key"],
                            only=fields["only"])
    if kind == Trajectories.kind:
        fields["trajectories"] = [Trajectory(**t) for t in fields["trajectories"]]
    if kind == Histogram.kind and fields["figures"] is not None:
        fields["figures"] = HistogramFigures(**fields["figures"])
    fields["time"] = float(fields["time"])
    return RECORD_TYPES[kind](**fields)


_STR = frozenset({str})
_NUMERIC = frozenset({int, float})
_OPS = frozenset(OPS)


def _is_only(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(type(b) is str for b in value))


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_str(value: Any) -> bool:
    return type(value) is str


def _is_sample(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 3 and _is_str(row[0]) and _is_str(row[1]) and _is_number(row[2])


def _is_figures(f: Any) -> bool:
    return f is None or (
        isinstance(f, dict) and set(f) == set(HISTOGRAM_FIELDS)
        and all(type(f[name]) is int for name in ("count", "nan", "posinf", "neginf"))
        and all(_is_number(f[name]) for name in ("min", "max", "mean", "std", "sum", "sum_squares"))
        and isinstance(f["bin_edges"], list) and all(map(_is_number, f["bin_edges"]))
        and isinstance(f["counts"], list) and all(type(n) is int for n in f["counts"]))


_TRAJECTORY_FIELDS = frozenset(Trajectory.__slots__)
_DICT = frozenset({dict})
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _is_trajectory(t: Any) -> bool:
    # Types checked in C (sets of maps of type over every message's keys and values at once): checking each
    # message in Python was three quarters of decoding a batch of trajectories.
    if not (type(t) is dict and t.keys() == _TRAJECTORY_FIELDS):
        return False
    messages, calls = t["messages"], t["tool_calls"]
    return (type(messages) is list and set(map(type, messages)) <= _DICT
            and set(map(type, chain.from_iterable(messages))) <= _STR
            and set(map(type, chain.from_iterable(map(dict.values, messages)))) <= _STR
            and type(calls) is list and set(map(type, calls)) <= _DICT
            and set(map(type, chain.from_iterable(calls))) <= _STR
            and set(map(type, chain.from_iterable(map(dict.values, calls)))) <= _PLAIN
            and _str_map_of(t["rewards"], _NUMERIC) and _str_map_of(t["meta"], _PLAIN)
            and type(t["token_ids"]) is bytes and len(t["token_ids"]) % 4 == 0)


def _str_map_of(value: Any, kinds: frozenset) -> bool:
    return type(value) is dict and set(map(type, value)) <= _STR and set(map(type, value.values())) <= kinds


_COMMON = {"step": lambda v: type(v) is int, "time": _is_number, "only": _is_only}
_SCHEMAS: dict[str, dict[str, Any]] = {
    Generations.kind: {**_COMMON, "key": _is_str,
                       "samples": lambda v: isinstance(v, list) and all(map(_is_sample, v))},
    Trajectories.kind: {**_COMMON, "key": _is_str,
                        "trajectories": lambda v: isinstance(v, list) and all(map(_is_trajectory, v))},
    TRAJECTORY_LINES: {**_COMMON, "key": _is_str, "at": lambda v: type(v) is int and v >= 0,
                       "size": lambda v: type(v) is int and v >= 0, "count": lambda v: type(v) is int and v >= 0},
    Histogram.kind: {**_COMMON, "name": _is_str, "values": lambda v: type(v) is bytes and len(v) % 8 == 0,
                     "figures": _is_figures},
    Text.kind: {**_COMMON, "name": _is_str, "text": _is_str},
    Alert.kind: {**_COMMON, "rule": _is_str, "text": _is_str, "level": lambda v: type(v) is str and v in ALERT_LEVELS},
    Image.kind: {**_COMMON, "name": _is_str, "png": lambda v: type(v) is bytes and v[:8] == PNG_SIGNATURE},
    Artifact.kind: {**_COMMON, "path": _is_str, "name": _is_str, "type": _is_str},
    Trace.kind: {**_COMMON, "name": _is_str, "key": _is_str, "status": _is_str,
                 "start_ns": lambda v: type(v) is int and v >= 0, "end_ns": lambda v: type(v) is int and v >= 0,
                 "attributes": lambda v: _str_map_of(v, _PLAIN),
                 "messages": lambda v: type(v) is list and set(map(type, v)) <= _DICT
                 and set(map(type, chain.from_iterable(v))) <= _STR
                 and set(map(type, chain.from_iterable(map(dict.values, v)))) <= _STR,
                 "metadata": lambda v: type(v) is str and v.startswith("{") and v.endswith("}")},
    Reduction.kind: {**_COMMON, "role": lambda v: type(v) is str and v in ROLES,
                     "values": lambda v: _str_map_of(v, _NUMERIC),
                     "op": lambda v: type(v) is str and (v == "" or v in _OPS),
                     "ops": lambda v: _str_map_of(v, _STR) and set(v.values()) <= _OPS},
}


def _short(value: Any) -> str:
    """A bounded repr of a hostile value for an error message (depth and length capped, never recursing far)."""
    return reprlib.repr(value)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CodecError(f"malformed batch: {message}")
