"""A metrics record's values left as the wire carried them, for a sink that writes them as verl's file line.

A batch names each set of keys once (a schema) and each record sends its numbers as float64 bytes
(wire/metrics.py). Building the ``{key: value}`` dict and encoding it again costs the file lane about
as much as the bare orjson line it writes (3 of 7 us a record of 81 keys, measured in the lane actor).
``PackedValues`` keeps the numbers packed: ``verl_line`` renders verl's ``FileLogger`` line straight from
them, orjson encoding the numbers as one float64 array (its float text is the same as for Python floats:
checked on 2.7 M values, NaN and +-Inf as ``null``, tests/unit/test_packed_values.py), and the keys, encoded
once per schema, placed around them. The dict is built only if something reads the values.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

import numpy as np
import orjson

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


class MetricsSchema:
    """One batch's key set: the keys, the positions of int values, their numbers' layout; the verl line's bytes
    around the numbers are made on first use."""

    __slots__ = ("keys", "ints", "layout", "_template")

    def __init__(self, keys: list[str], ints: list[int]) -> None:
        self.keys = keys
        self.ints = ints
        self.layout = struct.Struct(f"<{len(keys)}d")
        self._template: bytes | None = None

    def values(self, numbers: bytes) -> dict[str, float | int]:
        """The dict of one record's numbers (ints given back as ints)."""
        if not self.ints:
            return dict(zip(self.keys, self.layout.unpack(numbers), strict=True))
        values: list[float | int] = list(self.layout.unpack(numbers))
        for i in self.ints:
            values[i] = int(values[i])
        return dict(zip(self.keys, values, strict=True))

    def template(self) -> bytes:
        """``{"step":%d,"data":{"<key>":%b,...}}`` and a line break, for bytes' ``%`` (a ``%`` in a key doubled)."""
        if self._template is None:
            fields = b",".join(orjson.dumps(key).replace(b"%", b"%%") + b":%b" for key in self.keys)
            self._template = b'{"step":%d,"data":{' + fields + b"}}\n"
        return self._template


class PackedValues(Mapping[str, float | int]):
    """Metric name -> number, from a schema and its numbers' bytes (checked against the schema by the decoder)."""

    __slots__ = ("schema", "numbers", "_values")

    def __init__(self, schema: MetricsSchema, numbers: bytes) -> None:
        self.schema = schema
        self.numbers = numbers
        self._values: dict[str, float | int] | None = None

    def verl_line(self, step: int) -> bytes:
        """``orjson.dumps({"step": step, "data": values}, option=OPT_SERIALIZE_NUMPY)`` and a line break."""
        schema = self.schema
        if not schema.keys:
            return b'{"step":%d,"data":{}}\n' % step
        parts = orjson.dumps(np.frombuffer(self.numbers, "<f8"), option=_NUMPY)[1:-1].split(b",")
        for i in schema.ints:  # exact in float64 (the decoder checked): written as the int it was
            parts[i] = b"%d" % int(struct.unpack_from("<d", self.numbers, 8 * i)[0])
        return schema.template() % (step, *parts)

    def _dict(self) -> dict[str, float | int]:
        if self._values is None:
            self._values = self.schema.values(self.numbers)
        return self._values

    def __getitem__(self, key: str) -> float | int:
        return self._dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.schema.keys)

    def __len__(self) -> int:
        return len(self.schema.keys)

    def __repr__(self) -> str:
        return f"PackedValues({self._dict()!r})"
