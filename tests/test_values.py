"""Values from the trainer: copied safely on the caller's thread, made plain numbers on the shipper's."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import numpy as np
import torch

from pipeline.values import MetricCleaner, capture


def test_capture_copies_plain_dicts():
    """A flat dict of floats is copied, so the caller may reuse or change it after log()."""
    data = {"a": 1.0, "b": np.float32(2.5), "c": 3}
    values, size = capture(data)
    data["a"] = 99.0
    assert values == {"a": 1.0, "b": np.float32(2.5), "c": 3} and size > 0


def test_capture_flattens_nested_dicts():
    """Nested dicts are flattened with '/' at once (they are mutable), keys kept in order."""
    inner = {"acc": {"mean@4": 0.5}, "loss": 1.0}
    values, _ = capture({"val-core": inner, "step": 1})
    inner["loss"] = 7.0
    assert values == {"val-core/acc/mean@4": 0.5, "val-core/loss": 1.0, "step": 1}


def test_capture_reads_tensors_immediately():
    """A 0-d tensor is read when log() is called, so a later in-place change does not alter what was logged."""
    tensor = torch.tensor(1.5)
    values, _ = capture({"loss": tensor, "arr": np.array(2.0)})
    tensor.add_(10)
    assert values == {"loss": 1.5, "arr": 2.0} and type(values["loss"]) is float


def test_cleaner_converts_and_skips(caplog):
    """numpy scalars and bools become Python numbers, NaN/Inf are kept, non-numbers are skipped with one warning per key."""
    cleaner = MetricCleaner()
    data = {"f": np.float64(0.25), "i": np.int64(3), "b": True, "nan": math.nan, "inf": math.inf,
            "text": "hello", "none": None, 5: 1.0}
    values, _ = capture(data)
    values["vec"] = capture({"vec": torch.ones(3)})[0]["vec"]
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        out = cleaner.clean(values)
        cleaner.clean(values)
    assert out["f"] == 0.25 and type(out["f"]) is float
    assert out["i"] == 3 and type(out["i"]) is int and out["b"] == 1 and type(out["b"]) is int
    assert math.isnan(out["nan"]) and out["inf"] == math.inf and out["5"] == 1.0
    assert set(out) == {"f", "i", "b", "nan", "inf", "5"}
    assert cleaner.skipped == 6  # text, none, vec, twice
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and any("'vec'" in m and "shape (3,)" in m for m in warned)


def test_huge_int_becomes_float():
    """An int beyond 64 bits (msgpack's range) is sent as a float instead of failing the batch."""
    assert MetricCleaner().clean({"big": 10**30}) == {"big": 1e30}


def test_huge_string_counted_in_size():
    """A huge string counts toward the byte bound, so it cannot blow up memory unseen."""
    _, size = capture({"text": "x" * 10_000_000})
    assert size >= 10_000_000


def test_pipeline_does_not_import_torch():
    """Importing and using the pipeline never imports torch (it costs seconds and may be absent)."""
    code = ("import sys; from pipeline.values import capture, MetricCleaner; from pipeline import Tracking; "
            "MetricCleaner().clean(capture({'a': {'b': 1.0}, 'c': object()})[0]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
