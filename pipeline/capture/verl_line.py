"""A ``log()`` call's dict as verl 0.9.1's ``FileLogger`` writes it, for the file tracker (shipper side).

verl writes each call as ``orjson.dumps({"step": step, "data": data}, option=OPT_SERIALIZE_NUMPY)``: the dict as the
caller passed it. The pipeline carries cleaned numbers (values.py: flattened, bools and numpy scalars as Python
numbers, strings skipped), which encode the same for verl's usual dict (str keys, floats, ints, numpy float64 and
integer scalars) and differently for anything else: ``true`` is not ``1``, a numpy float32's shortest text is not
its float64's, a nested dict is not its flattened keys, and a string or a list is not there at all. For such a
dict, orjson's bytes of the dict itself travel with the record (``Metrics.verl_data``) and the file tracker writes
them, a string under a secret's name (``is_secret_key``) redacted. Where orjson refuses the dict (a tensor, a 0-d
array, a non-str key, an int past 64 bits: verl's own ``log()`` raises there), the file gets the cleaned numbers, as
every other tracker does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from tracklane.core.params import REDACTED, is_secret_key

_SAME = frozenset({float, int, np.float64, np.int8, np.int16, np.int32, np.int64,
                   np.uint8, np.uint16, np.uint32, np.uint64})
"""Value types whose cleaned number encodes as verl's value does (numpy float64's text is float's)."""
_STR = frozenset({str})
_INT64_MAX = 2**63 - 1  # values.as_number keeps ints within it; a larger one becomes a float
MAX_BYTES = 4 * 2**20
"""A dict whose encoding is larger (a metric holding a big array) goes as cleaned numbers: the file's line then
has what every other tracker has."""


def verl_data(data: Any) -> bytes | None:
    """orjson's bytes of ``data`` where its cleaned numbers would encode differently; None where they encode the
    same, or where orjson refuses ``data`` (or it is over ``MAX_BYTES``)."""
    if type(data) is not dict:
        return None
    if data and set(map(type, data.values())) <= _SAME and set(map(type, data)) <= _STR \
            and all(-_INT64_MAX <= value <= _INT64_MAX for value in data.values() if type(value) is int):
        return None
    try:
        encoded = orjson.dumps(_without_secrets(data), option=orjson.OPT_SERIALIZE_NUMPY)
    except (TypeError, orjson.JSONEncodeError):  # verl's own log() raises here
        return None
    return encoded if len(encoded) <= MAX_BYTES else None


def _without_secrets(data: dict) -> dict:
    """``data`` with every string under a secret's name (an API key, a password, a token) as ``REDACTED``, at any
    depth; ``data`` itself when there is none."""
    out = None
    for key, value in data.items():
        if isinstance(value, dict):
            clean: Any = _without_secrets(value)
        elif isinstance(value, str) and isinstance(key, str) and is_secret_key(key):
            clean = REDACTED
        else:
            continue
        if clean is not value:
            out = dict(data) if out is None else out
            out[key] = clean
    return data if out is None else out
