"""A rollout dump as JSON lines: rendered once, carried as a view, appended by the file tracker as it is."""

from __future__ import annotations

import math
import time

import numpy as np
import orjson
import pytest

from tracklane.capture.captured import Captured
from tracklane.capture.convert import Converter
from tracklane.capture.rich import RecordLimits, record_limits
from tracklane.core.errors import CodecError
from tracklane.core.records import Batch, Metrics, RunSpec, Trajectories, Trajectory
from tracklane.core.trajectory_lines import TrajectoryLines, trajectory_line
from tracklane.wire.batch import decode_batch, encode_batch, shared
from tracklane.workers.sinks.file import FileSink


def _trajectories(n: int) -> list[Trajectory]:
    return [Trajectory(messages=[{"role": "user", "content": f"héllo {i}"}, {"role": "assistant", "content": "x" * i}],
                       tool_calls=[{"name": "python", "arguments": "1+1", "result": "2", "latency_s": 0.5}],
                       rewards={"score": math.nan if i == 2 else i / 2}, meta={"sample_index": i, "ok": True},
                       token_ids=np.arange(i, dtype="<i4").tobytes()) for i in range(n)]


def test_a_line_is_orjson_of_the_rows_dict_with_its_step():
    """The line is what orjson writes for ``{**as_dict(), "step": N}``: compact, NaN as null, one line."""
    for t in _trajectories(4):
        expected = orjson.dumps({**t.as_dict(), "step": 7}) + b"\n"
        assert trajectory_line(t, 7) == expected and expected.count(b"\n") == 1


def test_lines_travel_in_the_tail_and_come_back_as_a_view():
    """Encoded with the step's metrics, the lines ride in the frame's tail and decode to a view of the same bytes;
    read as trajectories they are the ones logged (a NaN reward back as NaN)."""
    rows = _trajectories(5)
    lines = TrajectoryLines.render(rows, 3)
    batch = Batch(seq=4, created=1.0, records=[Metrics(step=3, values={"a": 1.0}, time=2.0),
                                               Trajectories(step=3, trajectories=lines, time=2.0, key="k", only=["file"])])
    back = decode_batch(shared(encode_batch(batch, None)))
    metrics, trajectories = back.records
    assert metrics.values == {"a": 1.0} and trajectories.only == ["file"] and trajectories.key == "k"
    got = trajectories.trajectories
    assert isinstance(got, TrajectoryLines) and isinstance(got.lines, memoryview) and len(got) == 5
    assert bytes(got.lines) == lines.lines
    parsed = list(got)
    assert [t.messages for t in parsed] == [t.messages for t in rows] and math.isnan(parsed[2].rewards["score"])
    assert [t.token_array().tolist() for t in parsed] == [t.token_array().tolist() for t in rows]


@pytest.mark.parametrize("lines, why", [(b'["not", "an object"]\n', "JSON objects"), (b'{"a": 1}', "JSON objects"),
                                        (b'{"a": "\xff"}\n', "UTF-8"), (b"", "count")])
def test_lines_from_elsewhere_are_checked(lines: bytes, why: str):
    """A tail that is not JSON objects a line, not UTF-8, or disagrees with its count is refused."""
    with pytest.raises(CodecError, match=why):
        TrajectoryLines(lines, 1, 0).check()


def test_a_tail_reference_past_the_end_is_refused():
    """A record naming bytes past the frame's tail is refused, not read out of bounds."""
    lines = TrajectoryLines.render(_trajectories(2), 1)
    blob = encode_batch(Batch(seq=1, created=0.0, records=[Trajectories(step=1, trajectories=lines, time=0.0)]))
    import zstandard

    content = bytearray(zstandard.ZstdDecompressor().decompress(blob))
    content = content.replace(b"\xa4size", b"\xa4sizf", 1)  # the record loses its size field: malformed
    with pytest.raises(CodecError):
        decode_batch(zstandard.ZstdCompressor().compress(bytes(content)))
    truncated = zstandard.ZstdCompressor().compress(bytes(zstandard.ZstdDecompressor().decompress(blob))[:-10])
    with pytest.raises(CodecError, match="tail"):
        decode_batch(truncated)


def test_the_file_tracker_writes_the_same_bytes_either_way(tmp_path):
    """Rows as a list of Trajectory (a migration, a test) and as shipped lines make byte-identical rollout files."""
    rows = _trajectories(6)
    files = []
    for name, trajectories in (("list", rows), ("lines", TrajectoryLines.render(rows, 5))):
        run = RunSpec(project="p", experiment=name)
        sink = FileSink(run, FileSink.resolve(run, {"VERL_FILE_LOGGER_PATH": str(tmp_path / f"{name}.jsonl")}, {}))
        sink.open(None)
        sink.write([Trajectories(step=5, trajectories=trajectories, time=0.0)])
        sink.close(0)
        files.append((tmp_path / f"{name}_rollouts" / "5.jsonl").read_bytes())
    assert files[0] == files[1] and files[0].count(b"\n") == 6


def test_a_dump_is_chunked_only_for_trackers_that_add_the_chunks_up():
    """A dump over the bulk size goes later, in chunks of about chunk_bytes for the file tracker (it appends) and
    whole for MLflow (a document a step); the dashboards' 64-row sample goes now, with the step's other records."""
    converter = Converter(record_limits({"backends": {"mlflow": {"max_trajectories": None}}}),
                          backends=["file", "mlflow", "wandb"], traits={"takes_pieces": frozenset({"file", "wandb"})})
    items = [{"messages": [{"role": "user", "content": "y" * 1000}], "rewards": {"score": 1.0}} for _ in range(2000)]
    now, later = converter.staged(Captured(1, (items, "rollout/trajectories"), time.time(), None, "trajectories",
                                           2000 * 1100), chunk_bytes=200_000, bulk_bytes=500_000)
    assert [(r.only, len(r.trajectories)) for r in now] == [(["wandb"], 64)]
    by_group = [list(group) for group in later]
    assert [[r.only for r in group][0] for group in by_group] == [["file", "mlflow"]]  # one group: both keep all
    [group] = by_group
    assert len(group) == 1 and len(group[0].trajectories) == 2000  # MLflow is in it: whole


def test_a_dump_for_the_file_tracker_alone_is_chunked():
    """With only trackers that append, the dump comes in chunks of about chunk_bytes, every row once, in order."""
    converter = Converter(RecordLimits(), backends=["file", "wandb"], traits={"takes_pieces": frozenset({"file", "wandb"})})
    items = [{"messages": [{"role": "user", "content": f"{i:06d}" + "y" * 1000}]} for i in range(2000)]
    now, [later] = converter.staged(Captured(1, (items, "k"), time.time(), None, "trajectories", 2000 * 1100),
                                    chunk_bytes=200_000, bulk_bytes=500_000)
    chunks = list(later)
    assert len(chunks) > 5 and all(r.only == ["file"] for r in chunks)
    assert all(len(r.trajectories.lines) < 200_000 + 2000 for r in chunks)
    contents = [t.messages[0]["content"][:6] for r in chunks for t in r.trajectories]
    assert contents == [f"{i:06d}" for i in range(2000)]
