"""A spool keeps what each of the run's trackers lacks, also one that a process does not deliver to."""

from __future__ import annotations

from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.records import RunSpec
from tracklane.shipping.spool_keeper import SpoolKeeper
from tracklane.spool.lane_state import LaneState, bulk_sender
from tracklane.spool.manifest import RunManifest, state_path
from tracklane.spool.recovery import held_back, lacking, open_spooling
from tracklane.spool.segments import Spool, SpoolEntry

RUN = RunSpec(project="p", experiment="e", run_id="r1")


def _entry(seq: int, bulk: bool = False, audience: frozenset[str] | None = None) -> SpoolEntry:
    return SpoolEntry(seq=seq, records=seq, oldest_log_time=0.0, nbytes=1, segment=1, offset=0, bulk=bulk,
                      audience=audience)


def test_what_a_tracker_lacks_follows_each_streams_watermark_and_the_audience():
    """Small batches past its small watermark, bulk past its bulk one, and only those that hold records for it."""
    entries = [_entry(1), _entry(2, bulk=True), _entry(3), _entry(4, bulk=True, audience=frozenset({"file"}))]
    stored = {"": 1, bulk_sender(""): 0}
    assert [e.seq for e in lacking(entries, "mlflow", stored)] == [2, 3]
    assert [e.seq for e in lacking(entries, "file", stored)] == [2, 3, 4]
    assert held_back(entries, {"mlflow": stored, "file": {"": 3, bulk_sender(""): 4}}) == 1
    assert held_back(entries, {"mlflow": {"": 3, bulk_sender(""): 2}}) is None  # it holds every batch meant for it


def test_a_replay_to_one_tracker_leaves_the_spool_what_the_others_lack(tmp_path):
    """The run had file and mlflow; mlflow stored through batch 2 of 6. A process delivering to file alone (a replay
    --to file) keeps mlflow in the manifest, and its spool forgets nothing past what mlflow holds, however far file
    gets; the report names what is kept for mlflow."""
    folder = tmp_path / "spool"
    spool = Spool(str(folder), segment_bytes=1)  # a segment a batch: each can go alone
    for seq in range(1, 7):
        spool.append(seq, 10, 0.0, b"x")
    spool.close()
    RunManifest(run=RUN, backends={"file": {}, "mlflow": {}}).save(str(folder))
    (folder / "lanes").mkdir()
    LaneState(stored={"": 2}, path=state_path(str(folder), "mlflow")).save()
    cfg = AsyncLogConfig(spool_dir=str(folder))
    spooling = open_spooling(cfg, RunSpec(project="p", experiment="e", run_id="r1", resume=True), {"file": {}})
    assert sorted(RunManifest.load(str(folder)).backends) == ["file", "mlflow"]
    assert spooling.held_back == 2 and spooling.held_for == {"mlflow": 40}
    assert [e.seq for e in spooling.pending["file"]] == [1, 2, 3, 4, 5, 6]
    stage = SpoolKeeper(spooling, cfg.spool_max_bytes)
    stage.release(6)  # file stored everything
    assert [e.seq for e in spooling.spool.entries()][0] == 3  # batches 1-2 (mlflow has them) gone, 3-6 kept
    assert stage.report().held_for == {"mlflow": 40}
    stage.close(0, 6)
    assert sorted(int(p.name[4:20]) for p in folder.iterdir() if p.name.startswith("seg-")) == [3, 4, 5, 6]
