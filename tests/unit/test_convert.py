"""Captured items become bounded, typed records: sampling and truncation counted, bad input rejected."""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image as PILImage

from tracklane.capture.captured import Captured
from tracklane.capture.convert import Converter
from tracklane.capture.rich import RecordLimits
from tracklane.core.records import Trajectory
from tracklane.core.report import PipelineReport


def _item(kind, payload, step=3, backend=None):
    return Captured(step=step, payload=payload, time=12.5, backend=backend, kind=kind, size=64)


def test_metrics_item():
    """A metrics item keeps its step, time and backend; a numpy step is accepted."""
    record = Converter(RecordLimits()).record(_item("metrics", {"x": 1.0}, step=np.int64(7), backend="wandb"))
    assert (record.step, record.values, record.time, record.only) == (7, {"x": 1.0}, 12.5, ["wandb"])


def test_bad_step_and_empty_metrics():
    """A non-integer step is rejected and counted; a dict with no numbers yields no record."""
    converter = Converter(RecordLimits())
    assert converter.record(_item("metrics", {"x": 1.0}, step="seven")) is None
    assert converter.record(_item("metrics", {"s": "text"}, step=1)) is None
    counts = converter.counted(PipelineReport())
    assert counts.rejected_records == 1 and counts.skipped_values == 1


def test_generations_thinned_and_truncated():
    """Samples beyond max_generations are left out evenly, long strings cut; both counted; NaN score kept."""
    converter = Converter(RecordLimits(max_generations=4, max_chars=10))
    samples = [(f"in{i}", "x" * (20 if i == 0 else 3), float("nan") if i == 9 else i / 10) for i in range(10)]
    record = converter.record(_item("generations", (samples, "val/generations")))
    assert [row[0] for row in record.samples] == ["in0", "in3", "in6", "in9"]
    assert record.samples[0][1] == "x" * 10 and math.isnan(record.samples[3][2])
    counts = converter.counted(PipelineReport())
    assert counts.sampled_out == 6 and counts.truncated_strings == 1


def test_trajectories_packed():
    """Trajectories keep messages, tool calls, rewards and meta; token ids (list, array or tensor) become int32 bytes."""
    converter = Converter(RecordLimits())
    items = [
        {"messages": [{"role": "user", "content": "héllo"}], "tool_calls": [{"name": "calc", "arguments": {"a": 1},
         "result": "2", "latency_s": 0.5}], "rewards": {"score": 1.0, "format": 0.5},
         "meta": {"sample_index": 3, "rollout_index": 1, "validation": False}, "token_ids": [1, 2, 3]},
        {"messages": [], "reward": 0.25, "token_ids": np.array([7, 8], dtype=np.int64)},
        Trajectory(messages=[{"role": "assistant", "content": ""}], token_ids=torch.tensor([9]).numpy().astype("<i4").tobytes()),
    ]
    record = converter.record(_item("trajectories", (items, "rollout/trajectories")))
    first, second, third = record.trajectories
    assert first.messages == [{"role": "user", "content": "héllo"}] and first.tool_calls[0]["arguments"] == '{"a": 1}'
    assert first.rewards == {"score": 1.0, "format": 0.5} and first.meta["sample_index"] == 3
    assert first.token_array().tolist() == [1, 2, 3] and second.token_array().tolist() == [7, 8]
    assert second.rewards == {"score": 0.25} and third.token_array().tolist() == [9]


def test_histogram_and_image():
    """A histogram travels as its figures (of the finite values, the NaN counted), not its values; an HxWxC array
    becomes a PNG with the same pixels."""
    converter = Converter(RecordLimits())
    histogram = converter.record(_item("histogram", ("rewards", torch.tensor([1.0, 2.0, float("nan")]))))
    figures = histogram.summary()
    assert histogram.values == b"" and (figures.count, figures.nan, figures.min, figures.max) == (2, 1, 1.0, 2.0)
    assert sum(figures.counts) == 2 and figures.bin_edges[0] == 1.0 and figures.bin_edges[-1] == 2.0
    pixels = np.random.default_rng(0).integers(0, 255, (4, 5, 3), dtype=np.uint8)
    image = converter.record(_item("image", ("sample", pixels)))
    assert (np.asarray(PILImage.open(io.BytesIO(image.png))) == pixels).all()


def test_malformed_rich_input_is_rejected():
    """A trajectory that is neither a dict nor a Trajectory, or bytes that are not a PNG, are rejected and counted."""
    converter = Converter(RecordLimits())
    assert converter.record(_item("trajectories", ([42], "k"))) is None
    assert converter.record(_item("image", ("x", b"not a png"))) is None
    assert converter.counted(PipelineReport()).rejected_records == 2


def test_each_backend_gets_its_own_sample_limit():
    """By default the file keeps every sample and the dashboards 256: one record each, addressed with `only`,
    the dashboards' rows evenly spaced over all; each lane's report says what it did not get."""
    from tracklane.core.report import LaneReport

    converter = Converter(RecordLimits(), backends=["file", "wandb", "mlflow"])
    samples = [[f"in{i}", f"out{i}", float(i)] for i in range(300)]
    wide, narrow = converter.records(_item("generations", (samples, "val/generations")))
    assert (wide.only, len(wide.samples)) == (["file"], 300)
    assert (narrow.only, len(narrow.samples)) == (["wandb", "mlflow"], 256)
    assert narrow.samples[0] == ["in0", "out0", 0.0] and narrow.samples[-1] == ["in299", "out299", 299.0]
    [only_wandb] = converter.records(_item("generations", (samples, "val/generations"), backend="wandb"))
    assert (only_wandb.only, len(only_wandb.samples)) == (["wandb"], 256)
    [few] = converter.records(_item("generations", (samples[:10], "val/generations")))
    assert few.only is None and len(few.samples) == 10  # under every limit: one record for all
    report = converter.counted(PipelineReport(lanes={n: LaneReport(name=n) for n in ("file", "wandb", "mlflow")}))
    assert {n: lane.sampled_out for n, lane in report.lanes.items()} == {"file": 0, "wandb": 88, "mlflow": 44}
    assert report.sampled_out == 0  # the file got every sample


def test_backend_limits_are_merged_over_the_defaults_and_checked():
    """trainer.record_limits.backends overrides a backend's own sample limits (null: all); bad ones are refused."""
    import pytest

    from tracklane.capture.rich import record_limits
    from tracklane.core.errors import ConfigError

    limits = record_limits({"max_trajectories": 16, "backends": {"wandb": {"max_trajectories": 4},
                                                                  "file": {"max_generations": 10}}})
    assert [limits.samples_for(n, "max_trajectories") for n in ("wandb", "file", "mlflow")] == [4, None, 16]
    assert limits.samples_for("file", "max_generations") == 10
    assert record_limits({}).samples_for("file", "max_trajectories") is None
    with pytest.raises(ConfigError, match=r"unknown key\(s\) trainer.record_limits.backends.wandb.max_chars"):
        record_limits({"backends": {"wandb": {"max_chars": 5}}})
    with pytest.raises(ConfigError, match="trainer.record_limits.backends.file.max_trajectories must be an int >= 0"):
        record_limits({"backends": {"file": {"max_trajectories": -1}}})
    with pytest.raises(ConfigError, match="trainer.record_limits.max_chars must be an int >= 0, got None"):
        record_limits({"max_chars": None})
