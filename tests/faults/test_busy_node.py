"""A busy node loses nothing: a lane that gives up, a lanes' node that joins late, a saturated CPU.

Each scenario (benchmarks/busy_faults.py) is staged for real and every tracker is read back from its own store:
the MLflow server, TensorBoard's event files, the file tracker, wandb's and SwanLab's offline runs.
"""

from __future__ import annotations

import re

import pytest

from tracklane.benchmarks import busy_faults

# Minutes each on a loaded 2-core machine: a node that joins 90 s late, a main job under 8 busy processes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _exactly_once(trackers: dict) -> None:
    for tracker, tally in trackers.items():
        assert tally["missing"] == 0 and tally["duplicated"] == 0, (tracker, tally)
        assert tally.get("unexpected", 0) == 0 and tally.get("wrong", 0) == 0, (tracker, tally)
        assert tally["once"] == tally["expected"] > 0, (tracker, tally)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("then", ["replay", "resume"])
def test_a_lane_whose_actor_dies_for_good_keeps_its_records_until_they_are_delivered(tmp_path, mlflow_server_uri,
                                                                                     then):
    """MLflow's lane actor SIGKILLed with no restart left: the lane gives up, keeps what MLflow lacks in the spool
    (none dropped), and the summary names the records and the replay command. That command, or a run resumed with
    the same id (what trainer.resume=true does), delivers them: every point once in MLflow, the run FINISHED, the
    spool emptied."""
    result = busy_faults.lane_dies(tmp_path, mlflow_server_uri, steps=150, then=then)
    assert result["gave_up"] and "actor died" in result["error"], result["summary"]
    assert result["kept"] > 0 and result["dropped"] == 0, result["summary"]
    assert result["mlflow_at_finish"]["missing"] > 0  # MLflow really lacked them at finish()
    assert result["segments_kept"] > 0  # on disk, though the file's lane stored everything
    assert f"kept in the spool: mlflow {result['kept']} records (gave up: actor died" in result["summary"]
    assert f"deliver with: tracklane replay {result['spool']} --to mlflow" in result["summary"]
    if then == "replay":
        assert result["delivery"]["rc"] == 0, result["delivery"]["stderr_tail"]
    else:
        assert result["delivery"]["complete"], result["delivery"]["summary"]
    _exactly_once(result["trackers"])
    assert result["mlflow_status"] == "FINISHED" and result["spool_left"] == 0


def test_lanes_on_a_node_that_joins_90_s_late_deliver_every_point_once(tmp_path, mlflow_server_uri):
    """The lanes placed on a logging node added to a two-node Cluster 90 s after Tracking(), while the trainer logs:
    they wait, pending and said so (the resource named), then deliver; none gives up or drops; tracker_down fired
    for them. After finish() and the replay command its summary prints for what its deadline left, every point is
    in TensorBoard, the file and MLflow exactly once."""
    result = busy_faults.late_node(tmp_path, mlflow_server_uri, join_after_s=90.0, log_for_s=110.0)
    assert result["joined_after_s"] >= 90.0
    assert re.match(r"not started after \d+ s \(pending: waiting for resource logging_node \(no node offers it yet\)\)",
                    result["down_before_join"]), result["down_before_join"]
    assert not result["gave_up"] and not any(result["dropped"].values()), result["summary"]
    assert all(seconds >= 90.0 for name, seconds in result["first_stored_s"].items() if name in busy_faults.LATE_TRACKERS)
    fired = {line.split(":")[1].split()[-1] for line in result["alerts"] if line.startswith("tracker_down")}
    assert set(busy_faults.LATE_TRACKERS) <= fired, result["alerts"]
    if any(result["left_at_finish"].values()):  # the deadline left some: the replay command delivered it
        assert result["delivery"]["rc"] == 0, result["delivery"]["stderr_tail"]
    _exactly_once(result["trackers"])


@pytest.mark.saturates_cpu  # alone: .ci/run runs it after the rest, not beside another worker
def test_the_main_job_on_a_saturated_cpu_loses_nothing(tmp_path):
    """Busy processes at 4x the cores, started before the main job with its six trackers: after it, and the replay
    command its summary prints for what finish()'s deadline left, every point it logged is once in every tracker
    (its value too); tracker_down fired for each lane whose actor had not started (answered) by its threshold."""
    result = busy_faults.saturated_main_job(tmp_path, steps=12, down_after_s=15.0)
    figures = result["figures"]
    left = {name: lane["unstored_records"] for name, lane in figures["lanes"].items() if lane["unstored_records"]}
    assert not any(lane["dropped_records"] or lane["gave_up"] for lane in figures["lanes"].values()), figures["summary"]
    if left:
        assert result["delivery"]["rc"] == 0 and set(left) <= set(result["delivery"]["to"]), result["delivery"]
    _exactly_once(result["trackers"])
    late = {name for name, lane in figures["lanes"].items() if lane["started_s"] > 16.0 or not lane["started_s"]}
    fired = {line.split(":")[1].split()[-1] for line in figures["alerts"] if line.startswith("tracker_down")}
    assert late <= fired, (late, figures["alerts"])
