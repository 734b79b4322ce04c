"""Values from the trainer made plain numbers on the shipper's side: numpy, tensors, nested dicts, junk."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import numpy as np
import torch

from tracklane.core.values import MetricCleaner


def test_numbers_numpy_and_tensors():
    """numpy scalars, bools, 0-d tensors and size-1 arrays become Python numbers; NaN and +-Inf are kept."""
    out = MetricCleaner().clean({"f": np.float64(0.25), "f32": np.float32(0.5), "i": np.int64(3), "b": True,
                                 "t": torch.tensor(1.5), "a": np.array([2.0]), "nan": math.nan, "inf": -math.inf})
    assert out == {"f": 0.25, "f32": 0.5, "i": 3, "b": 1, "t": 1.5, "a": 2.0, "nan": out["nan"], "inf": -math.inf}
    assert math.isnan(out["nan"])
    assert [type(out[k]) for k in ("f", "f32", "i", "b", "t", "a")] == [float, float, int, int, float, float]


def test_nested_dicts_flatten():
    """Nested dicts are flattened with '/', keys kept in order; non-string keys become strings."""
    out = MetricCleaner().clean({"val-core": {"acc": {"mean@4": 0.5}, "loss": 1.0}, 5: 2})
    assert list(out.items()) == [("val-core/acc/mean@4", 0.5), ("val-core/loss", 1.0), ("5", 2)]


def test_non_numbers_skipped_once_warned(caplog):
    """Strings, None, objects and multi-element tensors are skipped, counted, and warned about once per key."""
    cleaner = MetricCleaner()
    data = {"ok": 1.0, "text": "hello", "none": None, "vec": torch.ones(3), "obj": object()}
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        assert cleaner.clean(data) == {"ok": 1.0}
        cleaner.clean(data)
    assert cleaner.skipped == 8
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4 and any("'vec'" in m and "shape (3,)" in m for m in warned)


def test_huge_int_becomes_float():
    """An int beyond 64 bits (msgpack's range) is sent as a float instead of failing the batch."""
    assert MetricCleaner().clean({"big": 10**30}) == {"big": 1e30}


def test_pipeline_does_not_import_torch():
    """Importing and using the pipeline never imports torch (it costs seconds and may be absent)."""
    code = ("import sys; from tracklane.core.values import MetricCleaner; from tracklane import Tracking; "
            "MetricCleaner().clean({'a': {'b': 1.0}, 'c': object()}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_clean_dict_is_taken_as_it_is_and_anything_else_is_cleaned():
    """verl's usual dict (flat, str keys, floats and int64 ints) is returned itself; numpy numbers, nested dicts,
    a prefix or an int past int64 go through the cleaning."""
    import numpy as np

    from tracklane.core.values import MetricCleaner

    cleaner = MetricCleaner()
    plain = {"a": 1.0, "b": 2}
    assert cleaner.clean(plain) is plain
    for values, want in (({"a": np.float64(1.5)}, {"a": 1.5}), ({"a": {"b": 1.0}}, {"a/b": 1.0}),
                         ({"a": 2**70}, {"a": float(2**70)}), ({"a": True}, {"a": 1})):
        got = cleaner.clean(values)
        assert got == want and got is not values
        assert all(type(v) in (int, float) for v in got.values())
    assert cleaner.clean(plain, "w/") == {"w/a": 1.0, "w/b": 2}
