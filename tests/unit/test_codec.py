"""The wire format: round trips exactly, and refuses corrupt or hostile batches with CodecError."""

from __future__ import annotations

import math

import msgpack
import pytest
import zstandard

from tracklane.core.errors import CodecError
from tracklane.core.records import Batch, Metrics
from tracklane.wire.batch import DecodeLimits, decode_batch, encode_batch


def _batch() -> Batch:
    records = [Metrics(step=s, time=1.5 + s, values={"a/b": s * 0.5, "nan": math.nan, "inf": -math.inf, "n": 7})
               for s in range(3)]
    records.append(Metrics(step=3, time=9.0, values={"x": 1.0}, only=["wandb"]))
    records.append(Metrics(step=2, time=9.5, values={"w/loss": 0.5}, axis="rollout/step"))  # a producer's own axis
    return Batch(seq=42, created=123.25, records=records)


def _raw(wire) -> bytes:
    return zstandard.ZstdCompressor().compress(msgpack.packb(wire, use_bin_type=True))


def test_round_trip_keeps_every_value():
    """Decoding an encoded batch gives back the same sequence number, steps, times and values (NaN, -Inf included)."""
    batch = decode_batch(encode_batch(_batch()))
    assert batch.seq == 42 and batch.created == 123.25
    assert [r.step for r in batch.records] == [0, 1, 2, 3, 2]
    assert [r.axis for r in batch.records] == [None, None, None, None, "rollout/step"]
    first = batch.records[1]
    assert first.values["a/b"] == 0.5 and math.isnan(first.values["nan"]) and first.values["inf"] == -math.inf
    assert type(first.values["n"]) is int and batch.records[3].only == ["wandb"]


@pytest.mark.parametrize("blob, message", [
    (b"", "not a zstd frame"),
    (b"garbage that is not zstd", "not a zstd frame"),
    ("text", "must be bytes"),
])
def test_not_a_batch(blob, message):
    """Input that is not a zstd frame is refused with a message saying so."""
    with pytest.raises(CodecError, match=message):
        decode_batch(blob)


def test_truncated_batch():
    """A batch cut short is refused, not half-decoded."""
    blob = encode_batch(_batch())
    with pytest.raises(CodecError):
        decode_batch(blob[: len(blob) // 2])


def test_flipped_byte():
    """A corrupted byte in the compressed body is refused."""
    blob = bytearray(encode_batch(_batch()))
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(CodecError):
        decode_batch(bytes(blob))


def test_decompression_bomb_is_capped():
    """A small frame that would decompress past the limit is refused before it is inflated."""
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (8 * 2**20))
    assert len(bomb) < 4096
    with pytest.raises(CodecError, match="limit"):
        decode_batch(bomb, DecodeLimits(max_decoded_bytes=2**20))


def test_bomb_without_declared_size_is_capped():
    """A streamed frame that does not declare its size is still cut at the limit."""
    compressor = zstandard.ZstdCompressor(write_content_size=False)
    bomb = compressor.compress(b"\0" * (4 * 2**20))
    with pytest.raises(CodecError, match="limit"):
        decode_batch(bomb, DecodeLimits(max_decoded_bytes=2**20))


def test_oversized_compressed_input():
    """A batch larger than the compressed-size cap is refused without being read."""
    with pytest.raises(CodecError, match="exceeds"):
        decode_batch(b"x" * 100, DecodeLimits(max_compressed_bytes=10))


@pytest.mark.parametrize("wire, message", [
    (["XXX", 1, 1, 0.0, []], "header"),
    (["TLB", 2, 1, 0.0, []], "version"),
    (["TLB", 1, -1, 0.0, []], "sequence"),
    (["TLB", 1, 1, "now", []], "time"),
    (["TLB", 1, 1, 0.0, {}], "list"),
    (["TLB", 1, 1, 0.0, [["pickle", 1]]], "unknown record kind"),
    (["TLB", 1, 1, 0.0, [["metrics", "1", 0.0, {}, None]]], "step"),
    (["TLB", 1, 1, 0.0, [["metrics", 1, 0.0, {"a": "text"}, None]]], "number"),
    (["TLB", 1, 1, 0.0, [["metrics", 1, 0.0, {"a": 1.0}, "wandb"]]], "only"),
    (["TLB", 1, 1, 0.0, [["metrics", 1, 0.0]]], "5 to 7 fields"),
    (["TLB", 1, 1, 0.0, [["metrics", 1, 0.0, {}, None, None, b"{\n}"]]], "verl_data must be nil or one JSON"),
    (["TLB", 1, 1, 0.0, [["metrics", 1, 0.0, {}, None, 7]]], "axis must be a short string"),
])
def test_malformed_structure(wire, message):
    """Well-formed msgpack with the wrong shape is refused with a message naming the field."""
    with pytest.raises(CodecError, match=message):
        decode_batch(_raw(wire))


def test_extension_types_refused():
    """msgpack extension types (a route to custom deserialisation) are refused."""
    blob = zstandard.ZstdCompressor().compress(msgpack.packb(msgpack.ExtType(5, b"payload")))
    with pytest.raises(CodecError, match="extension"):
        decode_batch(blob)


def test_non_string_map_keys_refused():
    """Integer map keys are refused (strict_map_key), as are deep nestings that would blow the stack."""
    with pytest.raises(CodecError):
        decode_batch(_raw(["TLB", 1, 1, 0.0, [["metrics", 1, 0.0, {1: 1.0}, None]]]))
    deep = b"\x91" * 100_000 + b"\xc0"  # 100k nested one-element arrays
    with pytest.raises(CodecError):
        decode_batch(zstandard.ZstdCompressor().compress(deep))


def test_too_many_records():
    """A batch with more records than the cap is refused."""
    wire = ["TLB", 1, 1, 0.0, [["metrics", i, 0.0, {}, None] for i in range(20)]]
    with pytest.raises(CodecError, match="records"):
        decode_batch(_raw(wire), DecodeLimits(max_records=10))


def test_a_version_1_batch_still_decodes():
    """Spools of earlier releases hold version 1 batches (no schema table, metrics as maps): they decode as before."""
    wire = ["TLB", 1, 5, 2.0, [["metrics", 3, 1.5, {"loss": 0.5, "n": 2}, None]]]
    (record,) = decode_batch(_raw(wire)).records
    assert (record.step, record.values, record.axis) == (3, {"loss": 0.5, "n": 2}, None)
    assert type(record.values["n"]) is int


def test_keyed_metrics_keep_each_value_and_type():
    """Metrics go by key table: ints come back as ints, an int past 2**53 (not exact in float64) keeps the map form,
    records of one key set share one schema."""
    records = [Metrics(step=s, time=0.0, values={"loss": s / 3, "tokens": 7 * s, "nan": math.nan}) for s in range(3)]
    records.append(Metrics(step=3, time=0.0, values={"big": 2**60, "x": 1.0}))
    blob = encode_batch(Batch(seq=1, created=0.0, records=records))
    wire = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(blob), raw=False)
    assert [r[0] for r in wire[4]] == ["m", "m", "m", "metrics"] and len(wire[5]) == 1
    back = decode_batch(blob).records
    for got, sent in zip(back, records, strict=True):
        assert list(got.values) == list(sent.values)
        for key, value in sent.values.items():
            assert type(got.values[key]) is type(value)
            assert got.values[key] == value or (math.isnan(value) and math.isnan(got.values[key]))


def test_verl_data_travels_with_both_metrics_forms():
    """A record's verl_data (the call's dict as verl's FileLogger encodes it) comes back as sent, in the key-table
    form and in the map form (an int past 2**53), and on a record on another axis; nil stays nil."""
    records = [Metrics(step=0, time=0.0, values={"ok": 1}, verl_data=b'{"ok":true}'),
               Metrics(step=1, time=0.0, values={"big": 2**60}, verl_data=b'{"big":1152921504606846976,"s":"x"}'),
               Metrics(step=2, time=0.0, values={}, verl_data=b"{}"),
               Metrics(step=3, time=0.0, values={"plain": 0.5})]
    back = decode_batch(encode_batch(Batch(seq=1, created=0.0, records=records))).records
    assert [r.verl_data for r in back] == [r.verl_data for r in records]
    assert [r.values for r in back] == [r.values for r in records]
