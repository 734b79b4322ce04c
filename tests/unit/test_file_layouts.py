"""The file tracker's files read back by the migration source (and so ``tracklane view``): verl's own file, the
layout tracklane writes now (verl's lines, its own beside them in ``<name>_tracklane/``) and the one it wrote before
(a header line and axis lines inside the ``.jsonl``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracklane.core.records import SYSTEM_AXIS, Metrics, RunSpec
from tracklane.workers.sinks.file import FileSink
from tracklane.workers.sources.file import FileSource


def _points(source: FileSource) -> list[tuple[int, str | None, str, float]]:
    return sorted((r.step, r.axis, key, value) for r in source.records() if isinstance(r, Metrics)
                  for key, value in r.values.items())


def test_the_layout_written_now_reads_back_whole(tmp_path: Path) -> None:
    run = RunSpec(project="proj", experiment="exp", params={"lr": 0.5}, run_id="r1")
    path = tmp_path / "proj" / "exp.jsonl"
    sink = FileSink(run, FileSink.resolve(run, {"VERL_FILE_LOGGER_PATH": str(path)}, {}))
    sink.open(None)
    sink.write([Metrics(step=0, values={"loss": 1.0, "ok": 1}, time=0.0, verl_data=b'{"loss":1.0,"ok":true}'),
                Metrics(step=0, values={"tracklane/lag_s": 0.5}, time=0.0),
                Metrics(step=3, values={"system/cpu": 50.0}, time=0.0, axis=SYSTEM_AXIS),
                Metrics(step=1, values={"loss": math.nan}, time=0.0)])
    sink.close(0)
    assert path.read_bytes() == b'{"step":0,"data":{"loss":1.0,"ok":true}}\n{"step":1,"data":{"loss":null}}\n'
    source = FileSource(str(path))
    who = source.run()
    assert (who.project, who.experiment, who.run_id, who.params) == ("proj", "exp", "r1", {"lr": 0.5})
    points = _points(source)
    assert (0, None, "loss", 1.0) in points and (0, None, "ok", 1) in points and (0, None, "tracklane/lag_s", 0.5) in points
    assert (3, SYSTEM_AXIS, "system/cpu", 50.0) in points
    assert any(step == 1 and key == "loss" and math.isnan(value) for step, _, key, value in points)
    assert len(points) == 5


def test_the_layout_of_before_and_verls_own_read_back(tmp_path: Path) -> None:
    before = tmp_path / "old" / "run.jsonl"
    before.parent.mkdir()
    before.write_text("\n".join(json.dumps(line) for line in [
        {"step": None, "data": {}, "project": "p0", "experiment": "e0", "run_id": "x", "resumed": False,
         "config": {"a": 1}},
        {"step": 0, "data": {"loss": 2.0, "tracklane/lag_s": 0.1}},
        {"step": 5, "axis": SYSTEM_AXIS, "data": {"system/cpu": 10.0}},
    ]) + "\n")
    source = FileSource(str(before))
    who = source.run()
    assert (who.project, who.experiment, who.run_id, who.params) == ("p0", "e0", "x", {"a": 1})
    assert _points(source) == [(0, None, "loss", 2.0), (0, None, "tracklane/lag_s", 0.1),
                               (5, SYSTEM_AXIS, "system/cpu", 10.0)]

    verls = tmp_path / "proj" / "exp.jsonl"  # verl's FileLogger: no identity but the path's names
    verls.parent.mkdir()
    verls.write_bytes(b'{"step":1,"data":{"a":1.5,"s":"text","n":{"b":true}}}\n')
    source = FileSource(str(verls))
    assert (source.run().project, source.run().experiment) == ("proj", "exp")
    assert _points(source) == [(1, None, "a", 1.5), (1, None, "n/b", 1)]
    assert source.skipped["str values"] == 1
