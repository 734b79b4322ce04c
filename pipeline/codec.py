"""Batches on the wire: msgpack inside a zstd frame. Never pickle.

Wire layout (msgpack array)::

    ["TLB", 1, seq, created, [record, ...]]
    record = ["metrics", step, time, {name: number}, only]   # only: [backend, ...] or nil

Decoding treats its input as hostile: sizes are capped before and after
decompression, msgpack refuses extension types, and every field is type-checked,
so a corrupt or crafted batch raises ``CodecError`` instead of doing harm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import zstandard

from .errors import CodecError
from .records import Batch, Metrics, Record

MAGIC = "TLB"
VERSION = 1


@dataclass(slots=True, kw_only=True, frozen=True)
class DecodeLimits:
    """Caps applied when decoding a batch that came from elsewhere."""

    max_compressed_bytes: int = 256 * 2**20
    max_decoded_bytes: int = 1024 * 2**20
    max_records: int = 1_000_000


def encode_batch(batch: Batch, level: int = 3) -> bytes:
    """msgpack + zstd encoding of one batch (runs on the shipper thread, never the caller's)."""
    wire = [MAGIC, VERSION, batch.seq, batch.created, [_record_to_wire(r) for r in batch.records]]
    packed = msgpack.packb(wire, use_bin_type=True)
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True).compress(packed)


def _record_to_wire(record: Record) -> list:
    if isinstance(record, Metrics):
        return [Metrics.kind, record.step, record.time, record.values, record.only]
    raise CodecError(f"cannot encode a {type(record).__name__}")


def decode_batch(blob: bytes, limits: DecodeLimits = DecodeLimits()) -> Batch:
    """Decode and validate one batch; raises ``CodecError`` on anything malformed."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CodecError(f"a batch must be bytes, got {type(blob).__name__}")
    if len(blob) > limits.max_compressed_bytes:
        raise CodecError(f"batch of {len(blob)} bytes exceeds the {limits.max_compressed_bytes}-byte limit")
    packed = _decompress(bytes(blob), limits.max_decoded_bytes)
    try:
        wire = msgpack.unpackb(packed, raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext)
    except CodecError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CodecError(f"batch is not valid msgpack: {exc}") from exc
    return _batch_from_wire(wire, limits)


def _decompress(blob: bytes, limit: int) -> bytes:
    try:
        declared = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise CodecError(f"batch is not a zstd frame: {exc}") from exc
    if declared > limit:
        raise CodecError(f"batch declares {declared} decoded bytes, over the {limit}-byte limit")
    try:
        with zstandard.ZstdDecompressor().stream_reader(blob) as reader:
            packed = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise CodecError(f"batch is corrupt: {exc}") from exc
    if len(packed) > limit:
        raise CodecError(f"batch decodes to more than the {limit}-byte limit")
    return packed


def _refuse_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack extension type {code} is not allowed in a batch")


def _batch_from_wire(wire: Any, limits: DecodeLimits) -> Batch:
    if not (isinstance(wire, list) and len(wire) == 5 and wire[0] == MAGIC):
        raise CodecError("batch header is missing or wrong")
    _, version, seq, created, records = wire
    if version != VERSION:
        raise CodecError(f"batch version {version!r} is not supported (expected {VERSION})")
    _expect(type(seq) is int and seq >= 0, "sequence number must be a non-negative int")
    _expect(type(created) in (int, float), "batch time must be a number")
    _expect(isinstance(records, list), "batch records must be a list")
    if len(records) > limits.max_records:
        raise CodecError(f"batch holds {len(records)} records, over the {limits.max_records} limit")
    return Batch(seq=seq, created=float(created), records=[_record_from_wire(r) for r in records])


def _record_from_wire(wire: Any) -> Record:
    _expect(isinstance(wire, list) and len(wire) >= 1, "record must be a non-empty list")
    if wire[0] == Metrics.kind:
        _expect(len(wire) == 5, "metrics record must have 5 fields")
        _, step, when, values, only = wire
        _expect(type(step) is int, "metrics step must be an int")
        _expect(type(when) in (int, float), "metrics time must be a number")
        _expect(isinstance(values, dict), "metrics values must be a map")
        for key, value in values.items():
            _expect(type(key) is str, "metric names must be strings")
            _expect(type(value) in (int, float), f"metric {key!r} must be a number")
        _expect(only is None or (isinstance(only, list) and all(type(b) is str for b in only)),
                "metrics 'only' must be nil or a list of backend names")
        return Metrics(step=step, time=float(when), values=values, only=only)
    raise CodecError(f"unknown record kind {wire[0]!r}")


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CodecError(f"malformed batch: {message}")
