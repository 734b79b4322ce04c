"""The asynchronous path end to end through Ray: every record arrives once, failures stay in their lane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import log_verl_steps, same_value
from tracklane import Tracking
from tracklane.workers.testing.memory import memory_records
from tracklane.workers.testing.readers.file_reader import file_lines, verl_lines
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

pytestmark = pytest.mark.usefixtures("ray_session")


def _config(**async_log) -> dict:
    settings = {"flush_interval_s": 0.05, "sink_retries": 1, "retry_backoff_s": 0.01, **async_log}
    memory = settings.pop("memory_sink", {})
    return {"trainer": {"log_async": True, "async_log": settings, "memory_sink": memory}}


def _file_steps(path) -> list[dict]:
    """The trainer's lines, verl's file (tracklane's own figures are beside it: ``file_lines`` reads both)."""
    return verl_lines(path)


def _user_values(values: dict) -> dict:
    return {k: v for k, v in values.items() if not k.startswith("tracklane/")}


@pytest.mark.slow
def test_every_record_arrives_once_in_order(offline_trackers):
    """300 steps x ~100 keys reach the memory and file lanes exactly, in order, NaN included."""
    with Tracking("proj", "exp", ["memory", "file"], config=_config()) as tracking:
        logged = log_verl_steps(tracking, 300)
    report = tracking.finish()
    assert report.complete, report.summary()
    memory = {}
    for record in memory_records(tracking.run_id):
        memory.setdefault(record.step, {}).update(_user_values(record.values))
    lines = _file_steps(offline_trackers["file"])
    assert [line["step"] for line in lines] == sorted({line["step"] for line in lines}) == list(range(300))
    for got in (memory, {line["step"]: _user_values(line["data"]) for line in lines}):
        assert set(got) == set(logged)
        for step, values in logged.items():
            assert set(got[step]) == set(values)
            assert all(same_value(got[step][k], v) for k, v in values.items()), step


@pytest.mark.slow
def test_health_metrics_are_logged(offline_trackers):
    """The pipeline's own figures arrive as tracklane/* metrics."""
    with Tracking("proj", "exp", ["file"], config=_config()) as tracking:
        assert tracking.vitals() == {}  # nothing shipped yet
        for step in range(20):
            tracking.log({"x": step}, step=step)
        tracking.flush()
        health = tracking.vitals()  # what the trainer's progress line reads
    keys = set().union(*(line["data"] for line in file_lines(offline_trackers["file"])))
    assert {"tracklane/lag_s", "tracklane/queue_bytes", "tracklane/dropped_records",
            "tracklane/lane/file/unstored_bytes"} <= keys
    assert set(health) <= keys and "tracklane/lag_s" in health and health["tracklane/dropped_records"] == 0


@pytest.mark.slow
def test_failing_tracker_does_not_stop_the_others(offline_trackers):
    """A sink that raises on every write leaves the file lane complete, and its failures are reported."""
    tracking = Tracking("proj", "exp", ["memory", "file"], config=_config(memory_sink={"fail_writes": True}))
    for step in range(50):
        tracking.log({"x": float(step)}, step=step)
    report = tracking.finish()
    assert report.lanes["file"].complete
    assert [line["step"] for line in _file_steps(offline_trackers["file"])] == list(range(50))
    failed = report.lanes["memory"]
    assert failed.failed_records >= 50 and "told to fail every write" in failed.error
    assert not report.complete and "memory" in report.summary()


@pytest.mark.slow
def test_killed_actors_are_restarted_without_duplicates(offline_trackers):
    """Actors killed mid-run are restarted; the file and TensorBoard still hold every step exactly once."""
    tracking = Tracking("proj", "exp", ["file", "tensorboard"], config=_config())
    tracking.flush(timeout=60)  # every actor has answered: its pid is known
    pids = {name: lane.pid for name, lane in tracking.lanes().items()}
    for step in range(400):
        tracking.log({"x": float(step), "y": step}, step=step)
        if step in (150, 250):
            os.kill(pids["file" if step == 150 else "tensorboard"], signal.SIGKILL)
        time.sleep(0.002)
    report = tracking.finish(timeout=90)
    assert report.complete, report.summary()
    assert report.lanes["file"].restarts >= 1 and report.lanes["tensorboard"].restarts >= 1, report.summary()
    assert [line["step"] for line in _file_steps(offline_trackers["file"])] == list(range(400))
    board = read_tensorboard_dir(offline_trackers["tensorboard"])
    assert not board.duplicates(), (sorted({s for s, _ in board.duplicates()}), report.summary())
    assert sorted(step for step, key, _ in board.points if key == "x") == list(range(400))


@pytest.mark.slow
def test_a_lane_that_gives_up_leaves_its_last_error_in_the_other_trackers(offline_trackers, tmp_path):
    """A lane whose actor dies for good (no restarts left) is reported, and its last error reaches the other
    trackers as the text record error/lane/<name>."""
    tracking = Tracking("proj", "exp", ["memory", "file"], config=_config(max_restarts=0))
    tracking.flush(timeout=60)
    os.kill(tracking.lanes()["memory"].pid, signal.SIGKILL)
    for step in range(30):
        tracking.log({"x": float(step)}, step=step)
        time.sleep(0.02)
    report = tracking.finish(timeout=60)
    assert "actor died" in (report.lanes["memory"].error or ""), report.summary()
    texts = list((tmp_path / "metrics_media" / "text" / "error_lane_memory").glob("*.txt"))
    assert texts and "the memory lane gave up: actor died" in texts[0].read_text()
    assert report.lanes["file"].complete


def test_a_record_msgpack_cannot_take_is_rejected_alone(offline_trackers):
    """A trajectory whose meta holds an int past 64 bits is rejected and counted; the records shipped in the same
    batch still arrive."""
    tracking = Tracking("proj", "exp", ["memory"], config=_config(flush_interval_s=0.5))
    tracking.log({"x": 1.0}, step=1)
    tracking.log_trajectories([{"messages": [{"role": "user", "content": "hi"}], "meta": {"big": 2**70}}], step=1)
    tracking.log({"x": 2.0}, step=2)
    report = tracking.finish(timeout=60)
    assert report.rejected_records == 1 and not report.complete
    steps = [r.step for r in memory_records(tracking.run_id) if getattr(r, "values", {}).get("x") is not None]
    assert steps == [1, 2]


@pytest.mark.slow
def test_with_the_spool_a_slow_lane_waits_on_disk_and_loses_nothing(offline_trackers, tmp_path):
    """With the spool, a slow tracker's lane keeps its memory bound by leaving batches on disk only, and every record
    arrives, in order, once; the spool is emptied as the trackers acknowledge."""
    bound = 128 * 1024
    config = _config(lane_max_bytes=bound, max_batch_bytes=32 * 1024, memory_sink={"delay_s": 0.1},
                     spool_dir=str(tmp_path / "spool"), spool_segment_bytes=64 * 1024)
    tracking = Tracking("proj", "exp", ["memory", "file"], config=config)
    tracking.flush(timeout=120)
    rng = np.random.default_rng(0)
    for step in range(300):
        tracking.log({f"k{i}": float(v) for i, v in enumerate(rng.random(100))}, step=step)
        time.sleep(0.005)
    report = tracking.finish(timeout=120)
    memory, file = report.lanes["memory"], report.lanes["file"]
    assert report.complete, report.summary()
    steps = [r.step for r in memory_records(tracking.run_id) if "k0" in getattr(r, "values", {})]
    assert steps == list(range(300))
    lines = file_lines(offline_trackers["file"])
    unacked = [line["data"]["tracklane/lane/memory/unstored_bytes"] for line in lines
               if "tracklane/lane/memory/unstored_bytes" in line["data"]]
    assert unacked and max(unacked) <= bound + 2 * 32 * 1024  # plus the batches in flight, read back from disk
    spooled = [line["data"]["tracklane/spool_bytes"] for line in lines if "tracklane/spool_bytes" in line["data"]]
    assert max(spooled) > bound  # it did wait on disk
    assert memory.dropped_records == 0 and file.complete
    assert report.spool is not None and report.spool.batches <= 2  # acknowledged segments were deleted


@pytest.mark.slow
def test_block_policy_does_not_wait_for_a_slow_lane(offline_trackers):
    """Under "block" a slow tracker makes no log() wait: "block" bounds the trainer-side buffer only, and the shipper
    spools what the full lane cannot hold, so nothing is dropped. (The wait at the deadline, then the drop, is
    tests/unit/test_buffer.py::test_block_waits_up_to_the_deadline_then_drops.)"""
    config = _config(overflow="block", block_timeout_s=1.0, queue_max_bytes=8 * 1024, lane_max_bytes=8 * 1024,
                     max_batch_bytes=4 * 1024, max_inflight_batches=1, memory_sink={"delay_s": 0.1})
    tracking = Tracking("proj", "exp", ["memory"], config=config)
    waits = []
    for step in range(60):
        started = time.monotonic()
        tracking.log({f"k{i}": float(i) for i in range(60)}, step=step)
        waits.append(time.monotonic() - started)
    report = tracking.finish(timeout=60)
    assert max(waits) < 1.0, max(waits)  # none ran into the deadline
    assert report.complete and report.dropped_records == report.lanes["memory"].dropped_records == 0, report.summary()
    steps = [r.step for r in memory_records(tracking.run_id) if "k0" in getattr(r, "values", {})]
    assert steps == list(range(60))


def test_backend_argument_routes_records(offline_trackers):
    """log(..., backend=[...]) reaches only the named trackers, as in verl."""
    with Tracking("proj", "exp", ["memory", "file"], config=_config()) as tracking:
        tracking.log({"both": 1.0}, step=0)
        tracking.log({"file_only": 2.0}, step=1, backend=["file"])
    report = tracking.finish()
    assert report.complete, report.summary()
    memory_keys = set().union(*(r.values for r in memory_records(tracking.run_id)))
    assert "both" in memory_keys and "file_only" not in memory_keys
    file_keys = set().union(*(line["data"] for line in _file_steps(offline_trackers["file"])))
    assert {"both", "file_only"} <= file_keys


def test_finish_is_idempotent_and_late_logs_are_counted(offline_trackers):
    """finish() twice returns the same report; a log() after finish is dropped, counted and does not raise."""
    tracking = Tracking("proj", "exp", ["memory"], config=_config())
    tracking.log({"x": 1.0}, step=0)
    first = tracking.finish()
    tracking.log({"x": 2.0}, step=1)
    assert tracking.finish() is first and first.dropped_records == 1


def test_flush_is_a_barrier(offline_trackers):
    """flush() returns once everything logged before it is in the tracker."""
    tracking = Tracking("proj", "exp", ["file"], config=_config(flush_interval_s=5.0))
    for step in range(10):
        tracking.log({"x": float(step)}, step=step)
    report = tracking.flush(timeout=30)
    assert report.lanes["file"].unstored_records == 0 and not report.timed_out
    assert [line["step"] for line in verl_lines(offline_trackers["file"])] == list(range(10))
    tracking.finish()


@pytest.mark.slow
def test_unfinished_tracking_is_finished_at_exit(tmp_path):
    """A script that never calls finish() still delivers every step before the interpreter exits."""
    path = tmp_path / "metrics.jsonl"
    script = textwrap.dedent("""
        from tracklane import Tracking
        t = Tracking("p", "e", ["file"], config={"trainer": {"log_async": True}})
        for step in range(50):
            t.log({"x": float(step)}, step=step)
    """)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=180, cwd=tmp_path)
    assert [line["step"] for line in _file_steps(path)] == list(range(50))


@pytest.mark.slow
def test_missing_artifact_is_counted_in_the_report(offline_trackers, tmp_path):
    """An artifact whose file is gone before its lane reaches it is skipped, and the report says so."""
    path = tmp_path / "weights.bin"
    path.write_bytes(b"w" * 10)
    with Tracking("proj", "exp", ["file"], config=_config(flush_interval_s=5.0)) as tracking:
        tracking.log_artifact(str(path), name="policy", step=1)
        path.unlink()  # before the shipper's next batch (5 s away) reaches the actor
        report = tracking.flush()
    assert report.lanes["file"].artifacts_missing == 1
    assert "1 artifact(s) skipped: file missing" in report.lanes["file"].line()


def _thread_priorities(pid: int) -> set[tuple[int, int]]:
    """(scheduling policy, nice) of every thread of ``pid``."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add((os.sched_getscheduler(int(tid)), os.getpriority(os.PRIO_PROCESS, int(tid))))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return out


@pytest.mark.parametrize("setting, expected", [(None, (os.SCHED_OTHER, 10)), ("idle", (os.SCHED_IDLE, 0)),
                                               (7, (os.SCHED_OTHER, 7)), ("normal", (os.SCHED_OTHER, 0))])
def test_lane_actors_run_at_the_background_priority(offline_trackers, setting, expected):
    """Once its tracker is open, every thread of a lane actor's process (Ray's and the tracker's own) and of the
    processes its SDK started (wandb-core) runs at background_priority (nice 10 by default; "idle": SCHED_IDLE), so
    it yields the CPU a trainer wants; "normal" leaves it alone. The console's lane (the user's terminal) stays at normal
    priority."""
    import psutil

    config = _config() if setting is None else _config(background_priority=setting)  # None: the default
    tracking = Tracking("proj", "exp", ["file", "console", "wandb"], config=config)
    try:
        tracking.log({"x": 1.0}, step=1)
        tracking.flush()
        lanes = tracking.lanes()
        wandb_core = psutil.Process(lanes["wandb"].pid).children(recursive=True)
        assert wandb_core  # the SDK's own service process, started when the run opened
        for pid in [lanes["file"].pid, lanes["wandb"].pid, *(child.pid for child in wandb_core)]:
            threads = _thread_priorities(pid)
            # none is raised, none stays above the setting (Ray runs a thread of its own at nice 15 already, and
            # wandb-core, started from one, inherits it)
            assert {policy for policy, _ in threads} == {expected[0]}, (pid, threads)
            assert min(nice for _, nice in threads) >= expected[1], (pid, threads)
        assert min(nice for _, nice in _thread_priorities(lanes["file"].pid)) == expected[1]
        console = _thread_priorities(lanes["console"].pid)  # the user's terminal: always at normal priority
        assert {policy for policy, _ in console} == {os.SCHED_OTHER} and min(nice for _, nice in console) == 0
    finally:
        assert tracking.finish().complete


def test_a_removed_setting_is_warned_and_ignored(offline_trackers, caplog):
    """trainer.async_log.gil_switch_interval_s was removed (issue 36): a config naming it still runs, warned once,
    and Python's thread switch interval is left alone."""
    before = sys.getswitchinterval()
    tracking = Tracking("proj", "exp", ["file"], config=_config(gil_switch_interval_s=0.0005))
    assert sys.getswitchinterval() == before
    tracking.log({"x": 1.0}, step=1)
    assert tracking.finish().complete
    warned = [r.getMessage() for r in caplog.records if "gil_switch_interval_s was removed" in r.getMessage()]
    assert len(warned) == 1 and "ignored" in warned[0]
