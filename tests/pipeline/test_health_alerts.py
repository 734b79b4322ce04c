"""The health rules on a real run: every rule fires at the step its defaults say; what fires reaches the console,
every tracker (read back with their readers or server) and the report, on both paths; a healthy run fires
nothing."""

from __future__ import annotations

import math
import time

import pytest

from tracklane import Tracking
from tracklane.workers.sinks.tensorboard import TEXT_SUFFIX
from tracklane.workers.testing.readers.file_reader import file_points
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir, read_tensorboard_rich

pytestmark = pytest.mark.usefixtures("ray_session")


def _config(log_async: bool) -> dict:
    return {"trainer": {"log_async": log_async, "async_log": {"flush_interval_s": 0.05},
                        "health": {"enabled": True, "rules": {"kl_blowup": {"for_steps": 2}}}}}


def _healthy(step: int) -> dict[str, float]:
    return {"actor/entropy": 1.0, "actor/kl_loss": 0.01, "actor/pg_loss": -0.1, "actor/grad_norm": 0.5,
            "critic/score/mean": 0.1 * step}


def _log_two_pathologies(tracking: Tracking):
    """10 steps: a NaN pg_loss at step 4, a KL of 5 from step 6 (non_finite fires at 4, kl_blowup at 7); finished."""
    for step in range(1, 11):
        values = _healthy(step)
        if step == 4:
            values["actor/pg_loss"] = math.nan
        if step >= 6:
            values["actor/kl_loss"] = 5.0
        tracking.log(values, step=step)
    return tracking.finish()


@pytest.mark.parametrize("log_async", [True, False], ids=["async", "sync"])
def test_a_nan_loss_and_a_kl_blowup_reach_every_store(offline_trackers, capfd, log_async):
    """A NaN pg_loss at step 4 and a KL above 1.0 from step 6 fire non_finite at 4 and kl_blowup at 7: one console
    line each, the point tracklane/alert/<rule> and the text alert/<rule> in the file and TensorBoard, and the
    report's ALERT lines."""
    tracking = Tracking("health", "alerts", ["console", "file", "tensorboard"], config=_config(log_async))
    report = _log_two_pathologies(tracking)
    assert report.complete, report.summary()
    fired = {(line.split(" at step ")[0], int(line.split(" at step ")[1].split(":")[0])) for line in report.alerts}
    assert fired == {("non_finite", 4), ("kl_blowup", 7)}, report.alerts
    out = capfd.readouterr().out
    assert "tracklane ALERT non_finite: actor/pg_loss = nan at step 4" in out
    assert "tracklane ALERT kl_blowup: actor/kl_loss = 5 at step 7" in out
    points = {(step, key) for step, key, _ in file_points(offline_trackers["file"]) if key.startswith("tracklane/alert/")}
    assert points == {(4, "tracklane/alert/non_finite"), (7, "tracklane/alert/kl_blowup")}
    board = read_tensorboard_dir(offline_trackers["tensorboard"])
    assert sorted((s, k) for s, k, _ in board.points if k.startswith("tracklane/alert/")) == \
        [(4, "tracklane/alert/non_finite"), (7, "tracklane/alert/kl_blowup")]
    texts = read_tensorboard_rich(offline_trackers["tensorboard"]).texts
    assert any("actor/pg_loss = nan" in text for text in texts[f"alert/non_finite{TEXT_SUFFIX}"][4])
    assert any("actor/kl_loss = 5" in text for text in texts[f"alert/kl_blowup{TEXT_SUFFIX}"][7])


def test_a_healthy_run_fires_nothing(offline_trackers, capfd):
    """Ordinary values for 30 steps: no alert anywhere."""
    tracking = Tracking("health", "healthy", ["console", "file"], config=_config(True))
    for step in range(1, 31):
        tracking.log(_healthy(step), step=step)
    report = tracking.finish()
    assert report.complete and report.alerts == [], report.summary()
    assert "ALERT" not in capfd.readouterr().out
    assert not [key for _, key, _ in file_points(offline_trackers["file"]) if key.startswith("tracklane/alert/")]


_EVERY_METRIC_RULE = {"kl_blowup": 11, "clip_saturated": 14, "flat_groups": 19, "entropy_collapse": 22,
                      "reward_val_diverge": 25, "length_clipped": 27, "rollout_mismatch": 30, "non_finite": 33}
"""Where each per-metric rule fires in ``_pathologies`` with its defaults: the step its condition began plus
``for_steps`` - 1 (reward_val_diverge: the fourth validation in a row that fell while the reward rose)."""


def _pathologies(step: int) -> dict[str, float]:
    """verl's metric names, each going wrong from a step of its own (40 steps, a validation every 5th)."""
    values = {"actor/entropy": 1.0 if step < 20 else 0.05, "actor/kl_loss": 0.01 if step < 10 else 5.0,
              "actor/pg_loss": -0.1, "actor/grad_norm": math.inf if step == 33 else 0.5,
              "actor/pg_clipfrac": 0.1 if step < 12 else 0.5,
              "critic/score/flat_group_ratio": 0.2 if step < 15 else 0.95,
              "response_length/clip_ratio": 0.0 if step < 25 else 0.5,
              "training/rollout_probs_diff_mean": 0.01 if step < 28 else 0.3, "critic/score/mean": 0.1 * step}
    if step % 5 == 0:
        values["val-core/gsm8k/reward/mean@1"] = {5: 0.8, 10: 0.8, 15: 0.75, 20: 0.7}.get(step, 0.65)
    return values


def test_every_metric_rule_fires_at_its_step_on_a_real_run(offline_trackers, capfd):
    """Each per-metric rule with its defaults, on an async run whose metrics go wrong one after the other: every
    rule fires once, at the step its condition has held for its for_steps (none fires twice while its condition
    goes on holding); the console, the file tracker and the report say so."""
    tracking = Tracking("health", "every-rule", ["console", "file"], config={"trainer": {
        "log_async": True, "async_log": {"flush_interval_s": 0.05}, "health": {"enabled": True}}})
    for step in range(1, 41):
        tracking.log(_pathologies(step), step=step)
    report = tracking.finish()
    assert report.complete, report.summary()
    expected = set(_EVERY_METRIC_RULE.items())
    fired = [(line.split(" at step ")[0], int(line.split(" at step ")[1].split(":")[0])) for line in report.alerts]
    assert sorted(fired) == sorted(expected), report.alerts
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("tracklane ALERT ")]
    said = {(line.split()[2].rstrip(":"), line) for line in lines}
    assert len(lines) == len(expected) and {rule for rule, _ in said} == set(_EVERY_METRIC_RULE), lines
    assert all(f"step {_EVERY_METRIC_RULE[rule]}" in line for rule, line in said), lines
    points = sorted((step, key) for step, key, _ in file_points(offline_trackers["file"])
                    if key.startswith("tracklane/alert/"))
    assert points == sorted((step, f"tracklane/alert/{rule}") for rule, step in expected)


def test_rank_zero_sees_a_stalled_trainer_and_a_tracker_down(offline_trackers, tmp_path):
    """The trainer stops logging for 2.5 s after steps 0.1 s apart, while the memory tracker is down: stalled
    (at the last step, key "trainer"), tracker_down and lane_behind (key "memory": its records wait) reach the
    file tracker and the report."""
    down = tmp_path / "memory-down"
    down.touch()
    config = _config(True)
    config["trainer"]["health"]["rules"].update(stalled={"threshold": 0.5}, tracker_down={"threshold": 1.0},
                                                lane_behind={"threshold": 1.0})
    config["trainer"]["memory_sink"] = {"down_while": str(down)}
    config["trainer"]["async_log"].update(max_retry_backoff_s=0.2, sink_retries=0, retry_backoff_s=0.01)
    tracking = Tracking("health", "rank0", ["file", "memory"], config=config)
    tracking.flush(timeout=60)
    for step in range(1, 11):
        tracking.log(_healthy(step), step=step)
        time.sleep(0.1)
    time.sleep(2.5)  # no step: stalled; the memory tracker still down
    down.unlink()
    tracking.log(_healthy(11), step=11)
    report = tracking.finish()
    assert report.complete, report.summary()
    rules = {line.split(" at step ")[0] for line in report.alerts}
    assert {"stalled", "tracker_down", "lane_behind"} <= rules, report.alerts
    points = {key for _, key, _ in file_points(offline_trackers["file"]) if key.startswith("tracklane/alert/")}
    assert {"tracklane/alert/stalled", "tracklane/alert/tracker_down", "tracklane/alert/lane_behind"} <= points


def test_each_tracker_keeps_the_alert_its_own_way(offline_trackers, mlflow_server_uri, monkeypatch):
    """The same pathologies on the async path into every tracker: each keeps the point tracklane/alert/<rule> and
    the text alert/<rule>, and those with an alert mechanism of their own hold the alert there too, read back with
    the tracker's reader or server: a wandb alert record in the run file, trackio's alerts table, an MLflow run tag
    on the real server, a ClearML task tag; SwanLab (whose notifications are webhooks only) keeps the text."""
    from mlflow.tracking import MlflowClient

    from tracklane.workers.testing.readers.clearml_reader import read_clearml_run
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run
    from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_media, read_swanlab_run
    from tracklane.workers.testing.readers.trackio_reader import read_trackio_run
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_media, read_wandb_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server_uri)
    trackers = ["wandb", "trackio", "mlflow", "swanlab", "clearml"]
    tracking = Tracking("health-own", "alerts", trackers, config=_config(True))
    report = _log_two_pathologies(tracking)
    assert report.complete, report.summary()
    expected = {(4, "tracklane/alert/non_finite"), (7, "tracklane/alert/kl_blowup")}

    def alert_points(points) -> set[tuple[int, str]]:
        return {(step, key) for step, key, _ in points if key.startswith("tracklane/alert/")}

    wandb_media = read_wandb_media(offline_trackers["wandb"])
    assert alert_points(read_wandb_run(offline_trackers["wandb"]).points) == expected
    wandb_alerts = {(a["title"], a["level"]): a["text"] for a in wandb_media.alerts}
    assert set(wandb_alerts) == {("tracklane: non_finite", "ERROR"), ("tracklane: kl_blowup", "WARN")}
    assert wandb_alerts[("tracklane: kl_blowup", "WARN")].startswith("step 7: actor/kl_loss = 5")
    assert {step for step, _ in wandb_media.table_rows("alert/kl_blowup").items()} == {7}

    trackio = read_trackio_run(offline_trackers["trackio"], "health-own")
    assert alert_points(trackio.points) == expected
    own = {(a["title"], a["level"], a["step"]) for a in trackio.alerts if a["title"].startswith("tracklane: ")
           and a["title"] != "tracklane: trainer exited"}
    assert own == {("tracklane: non_finite", "error", 4), ("tracklane: kl_blowup", "warn", 7)}
    assert "actor/kl_loss = 5" in trackio.texts("alert/kl_blowup")[7]

    [run_id] = find_mlflow_run_ids(mlflow_server_uri, "health-own", "alerts")
    assert alert_points(read_mlflow_run(mlflow_server_uri, run_id).points) == expected
    tags = MlflowClient(tracking_uri=mlflow_server_uri).get_run(run_id).data.tags
    assert tags["tracklane.alert.non_finite"].startswith("ERROR at step 4: actor/pg_loss = nan")
    assert tags["tracklane.alert.kl_blowup"].startswith("WARN at step 7: actor/kl_loss = 5")

    clearml = read_clearml_run(offline_trackers["clearml-cache"], experiment="alerts")
    assert {"tracklane.alert=non_finite", "tracklane.alert=kl_blowup"} <= set(clearml.tags)
    assert alert_points(clearml.points) == expected

    assert alert_points(read_swanlab_run(offline_trackers["swanlog"]).points) == expected
    assert "actor/kl_loss = 5" in read_swanlab_media(offline_trackers["swanlog"]).texts("alert/kl_blowup")[7]


def test_a_health_judge_killed_again_and_again_emits_each_alert_once(offline_trackers, capfd):
    """A NaN pg_loss at steps 4, 9 and 14 (non_finite fires at each: it cleared in between); the health judge's
    actor is killed after every other step (Ray starts another, which takes the judge's spool back and is sent
    again what its predecessor had not stored): the file holds each alert's point once, the console says each
    once, and the report lists each once."""
    import ray

    config = _config(True)
    config["trainer"]["async_log"]["max_restarts"] = 20
    tracking = Tracking("health", "killed", ["console", "file"], config=config)
    assert tracking.wait_ready(120)
    for step in range(1, 21):
        values = _healthy(step)
        if step in (4, 9, 14):
            values["actor/pg_loss"] = math.nan
        tracking.log(values, step=step)
        time.sleep(0.03 * (step % 4))  # the kill lands before, during or after the step's batch reached the judge
        if step % 2 == 0:
            ray.kill(tracking._pipe._lanes["health"][0].actor, no_restart=False)
    report = tracking.finish(timeout=120)
    assert report.complete, report.summary()
    assert report.lanes["health"].restarts >= 1, report.summary()
    fired = sorted(line.split(":")[0] for line in report.alerts)
    assert fired == ["non_finite at step 14", "non_finite at step 4", "non_finite at step 9"], report.alerts
    points = [(step, key) for step, key, _ in file_points(offline_trackers["file"]) if key.startswith("tracklane/alert/")]
    assert sorted(points) == [(4, "tracklane/alert/non_finite"), (9, "tracklane/alert/non_finite"),
                              (14, "tracklane/alert/non_finite")]
    said = [line for line in capfd.readouterr().out.splitlines() if line.startswith("tracklane ALERT ")]
    assert len(said) == 3, said
