"""The main job's progress line says which tracker is behind, which are out of reach, and where drops were."""

from __future__ import annotations

from tracklane.trainer.progress import logging_part


def test_the_line_names_the_lagging_tracker_the_ones_down_and_where_drops_were():
    """From Tracking.vitals(): the slowest lane by name, each lane with down_s, the drops per lane."""
    health = {"tracklane/lag_s": 27.04, "tracklane/dropped_records": 445,
              "tracklane/lane/wandb/lag_s": 27.04, "tracklane/lane/wandb/down_s": 0.0,
              "tracklane/lane/wandb/dropped_records": 0,
              "tracklane/lane/mlflow/lag_s": 3.0, "tracklane/lane/mlflow/down_s": 95.4,
              "tracklane/lane/mlflow/dropped_records": 445}
    assert logging_part(health, 12.3) == "logging lag 27.0 s (wandb), mlflow down 95 s, 445 dropped (mlflow 445), log() 12 us"


def test_a_healthy_run_says_only_the_lag_and_the_cost_of_log():
    """Nothing down, nothing dropped, a lag under a second: no tracker named."""
    health = {"tracklane/lag_s": 0.4, "tracklane/dropped_records": 0, "tracklane/lane/file/lag_s": 0.4,
              "tracklane/lane/file/down_s": 0.0, "tracklane/lane/file/dropped_records": 0}
    assert logging_part(health, 9.0) == "logging lag 0.4 s, log() 9 us"
    assert logging_part({}, 9.0) == "log() 9 us"  # the synchronous path has no figures
