"""The synchronous path's spool: what a tracker did not take is kept, and ``tracklane replay`` delivers it once.

A real ``mlflow server`` behind a loopback proxy that is cut for good, the file tracker beside it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tracklane import Tracking
from tracklane.core.report import PipelineReport
from tracklane.spool import RunManifest, Spool
from tracklane.testing.tcp_proxy import TcpProxy
from tracklane.wire import decode_batch
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30



def _tracking(project: str, backends: list[str], spool_dir: Path) -> Tracking:
    async_log = {"sink_retries": 1, "retry_backoff_s": 0.01, "spool_dir": str(spool_dir)}
    return Tracking(project, "exp", backends, config={"trainer": {"log_async": False, "async_log": async_log}})


def _scalars(step: int) -> dict[str, float]:
    return {"train/loss": 1.0 / (step + 1), "train/acc": step * 0.01, "train/lr": 1e-3 * (1 + step % 3)}


def _log_with_cut(proxy: TcpProxy, project: str, spool_dir: Path, cut_at: int) -> tuple[Tracking, PipelineReport]:
    """STEPS steps into MLflow and the file; the proxy is cut for good before step ``cut_at`` (0: before the start)."""
    if cut_at == 0:
        proxy.cut()
    tracking = _tracking(project, ["mlflow", "file"], spool_dir)
    for step in range(STEPS):
        if step == cut_at:
            proxy.cut()
        tracking.log(_scalars(step), step=step)
    return tracking, tracking.finish()


def _replay_command(report: PipelineReport) -> list[str]:
    """The command the summary prints, as ``python -m tracklane`` runs it."""
    [line] = [line for line in report.summary().splitlines() if "did not take" in line]
    command = shlex.split(line.partition("deliver with: ")[2])
    assert command[:2] == ["tracklane", "replay"], line
    return [sys.executable, "-m", "tracklane", *command[1:], "--no-progress", "--timeout", "120"]


def _replay(command: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _mlflow_points(uri: str, project: str) -> tuple[Counter, str]:
    """How often each (step, key, value) is stored in the run's one MLflow run, and the run's status."""
    [run_id] = find_mlflow_run_ids(uri, project, "exp")
    back = read_mlflow_run(uri, run_id)
    return Counter(p for p in back.points if not p[1].startswith("tracklane")), back.status


def _file_steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text(encoding="utf-8").splitlines()]


def _expected() -> Counter:
    return Counter((step, key, value) for step in range(STEPS) for key, value in _scalars(step).items())


def test_a_run_without_failures_leaves_no_spool(offline_trackers, tmp_path):
    """A synchronous run whose trackers took everything writes no spool and names no replay."""
    tracking = _tracking("p", ["file"], tmp_path / "spool")
    for step in range(5):
        tracking.log(_scalars(step), step=step)
    report = tracking.finish()
    assert report.complete and report.spool is None and report.spooled == {}, report.summary()
    assert not (tmp_path / "spool").exists()
    assert "tracklane replay" not in report.summary()


def test_what_a_tracker_did_not_take_is_spooled_for_it_alone(mlflow_proxy, tmp_path):
    """With MLflow cut, each failed write is one spooled batch addressed to MLflow; the file took everything."""
    spool_dir = tmp_path / "spool"
    mlflow_proxy.cut()
    tracking = _tracking(f"sspool-{uuid.uuid4().hex[:8]}", ["mlflow", "file"], spool_dir)
    for step in range(3):
        tracking.log(_scalars(step), step=step)
    report = tracking.finish()
    assert report.spooled == {"mlflow": 3} and report.lanes["mlflow"].failed_records == 3, report.summary()
    assert report.lanes["file"].complete and not report.complete
    assert f"deliver with: tracklane replay {spool_dir} --to mlflow" in report.summary()
    assert list(RunManifest.load(str(spool_dir)).backends) == ["mlflow"]  # a replay opens no other tracker
    spool = Spool(str(spool_dir), readonly=True)
    batches = [decode_batch(spool.read(entry.seq) or b"") for entry in spool.entries()]
    assert [[(r.step, r.only) for r in batch.records] for batch in batches] == [[(s, ["mlflow"])] for s in range(3)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_down_for_the_whole_run_is_complete_after_one_replay(mlflow_proxy, mlflow_server_uri, offline_trackers,
                                                                    tmp_path):
    """MLflow cut before the run starts: once it is back, one replay of the printed command puts every point in
    MLflow exactly once, in one run, FINISHED; the file tracker keeps its one copy of each step."""
    project = f"sspool-{uuid.uuid4().hex[:8]}"
    _, report = _log_with_cut(mlflow_proxy, project, tmp_path / "spool", cut_at=0)
    assert report.spooled == {"mlflow": STEPS} and find_mlflow_run_ids(mlflow_server_uri, project, "exp") == []
    mlflow_proxy.restore()
    _replay(_replay_command(report))
    points, status = _mlflow_points(mlflow_server_uri, project)
    assert points == _expected() and status == "FINISHED"
    assert _file_steps(Path(offline_trackers["file"])) == list(range(STEPS))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_continues_the_run_once_and_a_second_replay_changes_nothing(mlflow_proxy, mlflow_server_uri,
                                                                          offline_trackers, tmp_path):
    """MLflow cut for good at step 10 of 30: the replay writes steps 10-29 into the same MLflow run, every point
    once; a second replay delivers nothing; the file tracker is never written twice."""
    project = f"sspool-{uuid.uuid4().hex[:8]}"
    _, report = _log_with_cut(mlflow_proxy, project, tmp_path / "spool", cut_at=10)
    assert report.spooled == {"mlflow": STEPS - 10}, report.summary()
    assert mlflow_proxy.refused > 0
    file_log = Path(offline_trackers["file"])
    before = file_log.read_bytes()
    mlflow_proxy.restore()
    command = _replay_command(report)
    _replay(command)
    points, status = _mlflow_points(mlflow_server_uri, project)  # one run: the replay re-attached to it
    assert points == _expected() and status == "FINISHED"
    again = _replay(command)
    assert "0 not stored, 0 dropped, 0 failed" in again.stderr
    assert _mlflow_points(mlflow_server_uri, project) == (points, status)
    assert file_log.read_bytes() == before and _file_steps(file_log) == list(range(STEPS))
