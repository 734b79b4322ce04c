"""Metrics on the wire by key table: each batch names a set of keys once, each record sends its numbers.

A verl step logs the same ~100 keys every time; packed as a map, every record carried every key's
string and the lane actor built each one again (decoding was ~50 us a record, most of a lane's work
for scalars). Here a batch holds a table of schemas, and a metrics record refers to one::

    schema = [[key, ...], [position of an int value, ...]]
    record = ["m", step, time, schema index, numbers, only, axis]   # numbers: float64 little-endian
    record = ["m", step, time, schema index, numbers, only, axis, verl_data]   # with Metrics.verl_data (bytes)

Ints travel as float64 and come back as ints (their positions are part of the schema), so a value is
given back with its type; a record holding an int beyond 2**53 (not exact in float64) keeps the map
form (wire/batch.py). Decoding treats the table and the records as hostile, like the rest of the batch.
"""

from __future__ import annotations

import reprlib
import struct
from collections.abc import Mapping
from typing import Any

from tracklane.core.errors import CodecError
from tracklane.core.packed_values import MetricsSchema, PackedValues
from tracklane.core.records import Metrics

KIND = "m"
EXACT = 2**53
_FLOAT = frozenset({float})
_NUMBERS = frozenset({float, int})


class SchemaTable:
    """The schemas of one batch being encoded: key set (and int positions) -> its index."""

    def __init__(self) -> None:
        self._index: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        self.wire: list[list[list[Any]]] = []

    def pack(self, record: Metrics) -> list[Any] | None:
        """The record's wire form, or None if it must keep the map form (a huge int, a bool)."""
        numbers = list(record.values.values())
        kinds = set(map(type, numbers))
        if kinds <= _FLOAT:
            ints: tuple[int, ...] = ()
        elif kinds <= _NUMBERS:
            ints = tuple(i for i, value in enumerate(numbers) if type(value) is int)
            if any(not -EXACT <= numbers[i] <= EXACT for i in ints):
                return None
        else:
            return None
        key = (tuple(record.values), ints)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.wire)
            self.wire.append([list(key[0]), list(ints)])
        wire = [KIND, record.step, record.time, index, struct.pack(f"<{len(numbers)}d", *numbers), record.only,
                record.axis]
        if record.verl_data is not None:
            wire.append(record.verl_data)
        return wire


def is_axis(value: Any) -> bool:
    """A metrics record's axis on the wire: nil (the trainer's step) or a short string."""
    return value is None or (type(value) is str and 0 < len(value) <= 256)


def is_verl_data(value: Any) -> bool:
    """A metrics record's verl_data on the wire: nil, or bytes the file tracker may append as a line's data (an
    object, no line break in it: orjson's compact output has none)."""
    return value is None or (type(value) is bytes and value[:1] == b"{" and value[-1:] == b"}" and b"\n" not in value)


def schemas_from_wire(wire: Any) -> list[MetricsSchema]:
    """The batch's schema table, checked: unique string keys, int positions in range and increasing."""
    if not isinstance(wire, list):
        raise CodecError("malformed batch: the metrics schemas must be a list")
    schemas = []
    for schema in wire:
        if not (isinstance(schema, list) and len(schema) == 2 and isinstance(schema[0], list)
                and isinstance(schema[1], list)):
            raise CodecError("malformed batch: a metrics schema must be [keys, int positions]")
        keys, ints = schema
        if not all(type(key) is str for key in keys) or len(set(keys)) != len(keys):
            raise CodecError("malformed batch: a metrics schema's keys must be distinct strings")
        if not all(type(i) is int for i in ints) or ints != sorted(set(ints)) \
                or (ints and not (0 <= ints[0] and ints[-1] < len(keys))):
            raise CodecError("malformed batch: a metrics schema's int positions must increase, within its keys")
        schemas.append(MetricsSchema(keys, ints))
    return schemas


def metrics_from_wire(wire: list[Any], schemas: list[MetricsSchema], packed: bool = False) -> Metrics:
    """``packed``: the values stay as the wire carried them (``PackedValues``: a dict only if read)."""
    if len(wire) not in (7, 8):
        raise CodecError("malformed batch: a keyed metrics record must have 7 or 8 fields")
    _, step, when, index, numbers, only, axis = wire[:7]
    verl_data = wire[7] if len(wire) == 8 else None
    if not is_verl_data(verl_data):
        raise CodecError("malformed batch: metrics verl_data must be nil or one JSON object's bytes")
    if type(step) is not int or type(when) not in (int, float):
        raise CodecError("malformed batch: metrics step must be an int and time a number")
    if type(index) is not int or not 0 <= index < len(schemas):
        raise CodecError(f"malformed batch: metrics schema index {reprlib.repr(index)} is not in the batch's table")
    schema = schemas[index]
    if type(numbers) is not bytes or len(numbers) != schema.layout.size:
        raise CodecError(f"malformed batch: metrics numbers must be {schema.layout.size} bytes")
    if only is not None and not (isinstance(only, list) and all(type(b) is str for b in only)):
        raise CodecError("malformed batch: metrics 'only' must be nil or a list of backend names")
    if axis is not None and not is_axis(axis):
        raise CodecError("malformed batch: metrics axis must be a short string")
    for i in schema.ints:
        number = _INT_AT.unpack_from(numbers, 8 * i)[0]
        if not (-EXACT <= number <= EXACT and number.is_integer()):  # NaN fails the comparison too
            raise CodecError(f"malformed batch: metric {reprlib.repr(schema.keys[i])} must be an int")
    values: Mapping[str, float | int] = PackedValues(schema, numbers) if packed else schema.values(numbers)
    return Metrics(step=step, time=float(when), values=values, only=only, axis=axis, verl_data=verl_data)


_INT_AT = struct.Struct("<d")
