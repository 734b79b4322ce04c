"""A verl job resumed from its checkpoint continues the same run, and the steps it re-runs are not logged twice.

verl's trainer names no run (``Tracking(project, experiment, loggers, config)``); with ``trainer.resume_mode=auto``
it restarts from the latest checkpoint under ``trainer.default_local_dir`` and logs the steps after it again.
Here the checkpoint folder is laid out as verl's checkpoint manager leaves it (``latest_checkpointed_iteration.txt``
and ``global_step_N``); verl's whole job, killed and resumed, is tests/e2e/test_verl_main_ppo.py.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgpack
import pytest

from tracklane import Tracking
from tracklane.core.records import Metrics
from tracklane.spool.logged_steps import FILE, LoggedSteps
from tracklane.spool.resumed_run import RUN_FILE
from tracklane.spool.segments import Spool
from tracklane.wire.batch import decode_batch, encode_what_encodes


def _config(checkpoints: Path, mode: str = "auto") -> dict:
    return {"trainer": {"log_async": True, "resume_mode": mode, "default_local_dir": str(checkpoints),
                        "async_log": {"system_metrics_s": 0, "log_vitals": False}}}


def _checkpoint(checkpoints: Path, step: int) -> None:
    """What verl's checkpoint manager leaves for ``resume_mode=auto`` to find."""
    (checkpoints / f"global_step_{step}").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))


def _file_points(path: Path) -> Counter:
    return Counter((line["step"], key, value) for line in map(json.loads, path.read_text().splitlines())
                   for key, value in line["data"].items())


@pytest.mark.usefixtures("ray_session")
def test_a_resumed_verl_job_continues_its_run_and_logs_no_step_twice(tmp_path, offline_trackers):
    """Steps 1-5 logged, the checkpoint at 3; the resumed job re-runs 4 and 5 (other values) and logs 6: the file and
    MLflow hold one run, steps 1-6 each once, the first values of 4 and 5; the report counts the points left out."""
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

    checkpoints = tmp_path / "checkpoints"
    first = Tracking("p", "e", ["file", "mlflow"], config=_config(checkpoints))
    for step in range(1, 6):
        first.log({"loss": float(step), "score": step * 10.0}, step=step)
    assert first.finish().complete
    _checkpoint(checkpoints, 3)
    assert json.loads((checkpoints / RUN_FILE).read_text())["run_id"] == first.run_id

    second = Tracking("p", "e", ["file", "mlflow"], config=_config(checkpoints))
    for step in range(4, 7):
        second.log({"loss": step + 0.5, "score": step * 10.0 + 5}, step=step)
    report = second.finish()
    assert second.run_id == first.run_id and report.complete, report
    assert (report.spool.repeated_points, report.spool.repeated_steps) == (4, (4, 5)), report.spool
    expected = Counter({(step, "loss", float(step)): 1 for step in range(1, 6)}
                       | {(step, "score", step * 10.0): 1 for step in range(1, 6)}
                       | {(6, "loss", 6.5): 1, (6, "score", 65.0): 1})
    assert _file_points(offline_trackers["file"]) == expected
    (run_id,) = find_mlflow_run_ids(offline_trackers["mlflow_uri"], "p", "e")
    run = read_mlflow_run(offline_trackers["mlflow_uri"], run_id)
    assert Counter(run.points) == expected and run.status == "FINISHED"


@pytest.mark.usefixtures("ray_session")
def test_a_verl_job_without_a_checkpoint_or_resume_starts_a_new_run(tmp_path, offline_trackers):
    """No checkpoint (verl trains from scratch), or ``resume_mode=disable``: a new run, every step logged."""
    checkpoints = tmp_path / "checkpoints"
    first = Tracking("p", "e", ["file"], config=_config(checkpoints))
    first.log({"loss": 1.0}, step=1)
    first.finish()
    second = Tracking("p", "e", ["file"], config=_config(checkpoints))
    second.log({"loss": 2.0}, step=1)
    second.finish()
    _checkpoint(checkpoints, 1)
    third = Tracking("p", "e", ["file"], config=_config(checkpoints, "disable"))
    third.log({"loss": 3.0}, step=1)
    report = third.finish()
    assert len({first.run_id, second.run_id, third.run_id}) == 3 and report.spool.repeated_points == 0
    # a new run starts the file afresh, as verl's FileLogger does
    assert _file_points(offline_trackers["file"]) == Counter({(1, "loss", 3.0): 1})


def test_a_crashed_process_s_notes_are_read_back_from_its_spool(tmp_path):
    """A process killed before it wrote its notes: what the file lacks is in the batches the spool still holds."""
    spool = Spool(str(tmp_path))
    written = LoggedSteps.open(spool, False, lambda blob: decode_batch(blob).records)
    batch = [Metrics(step=7, values={"a": 1.0, "b": 2.0}, time=0.0), Metrics(step=9, values={"a": 3.0}, time=0.0),
             Metrics(step=99, values={"gpu": 1.0}, time=0.0, axis="system/elapsed_s")]
    written.keep_new(batch)
    blob, _, _ = encode_what_encodes(batch, 1, 0.0)
    spool.append(1, len(batch), 0.0, blob)
    spool.close()
    assert not (tmp_path / FILE).exists()  # never saved: the spool forgot nothing yet

    reopened = LoggedSteps.open(Spool(str(tmp_path)), True, lambda blob: decode_batch(blob).records)
    assert reopened.last == {"a": 9, "b": 7}
    kept = reopened.keep_new([Metrics(step=8, values={"a": 0.0, "b": 0.0, "c": 0.0}, time=0.0)])
    assert [record.values for record in kept] == [{"b": 0.0, "c": 0.0}] and reopened.skipped == 1
    reopened.save()
    assert msgpack.unpackb((tmp_path / FILE).read_bytes()) == {"a": 9, "b": 8, "c": 8}
