"""``tracklane inspect`` / ``replay`` (``python -m tracklane``): what a spool holds, one JSON line per record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tracklane.core.records import Batch, Metrics, RunSpec, Text
from tracklane.spool.lane_state import LaneState
from tracklane.spool.manifest import RunManifest, lanes_dir, state_path
from tracklane.spool.segments import Spool
from tracklane.wire.batch import encode_batch

ROOT = Path(__file__).resolve().parents[2]


def _spool(folder: Path) -> None:
    spool = Spool(str(folder))
    for seq in (1, 2, 3):
        records = [Metrics(step=seq, values={"loss": 1.0 / seq, "acc": 0.5}, time=100.0 + seq)]
        if seq == 2:
            records.append(Text(step=2, name="note", text="hello", time=102.5))
        spool.append(seq, len(records), 100.0 + seq, encode_batch(Batch(seq=seq, created=0.0, records=records)))
    spool.close()
    RunManifest(run=RunSpec(project="p", experiment="e", run_id="r1"), backends={"file": {}, "mlflow": {}}).save(str(folder))
    Path(lanes_dir(str(folder))).mkdir()
    for name, stored in (("file", 3), ("mlflow", 1)):
        state = LaneState.load(state_path(str(folder), name))
        state.stored[""] = stored
        state.save()


def test_inspect_prints_one_json_line_per_record_with_who_acknowledged_it(tmp_path):
    """Each record is a JSON line with its batch, step, kind, keys and which trackers acknowledged it."""
    _spool(tmp_path / "s")
    proc = subprocess.run([sys.executable, "-m", "tracklane", "inspect", str(tmp_path / "s")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(x["seq"], x["step"], x["kind"]) for x in lines] == [(1, 1, "metrics"), (2, 2, "metrics"), (2, 2, "text"),
                                                                   (3, 3, "metrics")]
    assert lines[0]["keys"] == ["acc", "loss"] and lines[2]["keys"] == ["note"]
    assert lines[0]["stored_by"] == ["file", "mlflow"] and lines[1]["pending"] == ["mlflow"]
    assert "3 batches" in proc.stderr


def test_replay_of_a_folder_that_is_no_spool_says_so(tmp_path):
    """replay on a folder without a spool manifest exits 2 with a clear message."""
    proc = subprocess.run([sys.executable, "-m", "tracklane", "replay", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "is not a tracklane spool" in proc.stderr
