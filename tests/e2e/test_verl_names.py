"""verl's other public names: DapoFilteredRewardTableLogger into wandb's run, the platform backends' clear errors
(rl_insight, served by the prometheus backend: tests/trackers/test_prometheus_sink.py)."""

from __future__ import annotations

import pytest

from tracklane import ConfigError, DapoFilteredRewardTableLogger, Tracking
from tracklane.verl.dapo_reward_logger import KEY, counts_text
from tracklane.workers.testing.readers.wandb_reader import read_wandb_media

pytest.importorskip("wandb")


def test_dapo_filtered_reward_counts_land_as_one_wandb_table_row_per_step(offline_trackers):
    """Each step's counts arrive as verl's row (step, "value:count, ...") in wandb; the file never sees them."""
    tracking = Tracking("p", "dapo", ["wandb", "file"], config={"trainer": {"log_async": False}})
    dapo = DapoFilteredRewardTableLogger("p", "dapo")
    counts = {1: {1.0: 3, 0.0: 5}, 2: {0.5: 1}, 3: {}}
    for step, reward_counts in counts.items():
        tracking.log({"critic/score/mean": 0.5}, step=step)
        dapo.log(["wandb", "file"], reward_counts, step)
    dapo.log(["file"], {1.0: 9}, 4)  # wandb not named: nothing, as in verl
    report = tracking.finish()
    assert report.complete
    rows = read_wandb_media(offline_trackers["wandb"], tracking.run_id).table_rows(KEY)
    assert {step: [row[1] for row in got] for step, got in rows.items()} == {1: ["0:5, 1:3"], 2: ["0.5:1"], 3: [""]}
    assert KEY not in offline_trackers["file"].read_text()


def test_dapo_counts_that_are_not_a_map_of_numbers_are_a_counted_skip(offline_trackers, caplog):
    """Counts that are not value -> count are skipped with a warning and counted; the run goes on."""
    for bad in ({"x": 1}, [1, 2], {1.0: "many"}):
        with pytest.raises((AttributeError, TypeError, ValueError)):
            counts_text(bad)  # type: ignore[arg-type]
    tracking = Tracking("p", "dapo-bad", ["wandb"], config={"trainer": {"log_async": False}})
    DapoFilteredRewardTableLogger("p", "dapo-bad").log("wandb", {"not a number": "x"}, 1)
    tracking.log({"a": 1.0}, step=1)
    report = tracking.finish()
    assert report.dropped_records == 1  # the rejected call, counted with the run's drops
    assert "DapoFilteredRewardTableLogger.log() could not take dict; skipped and counted" in caplog.text


def test_vemlp_wandb_fails_where_verl_fails_and_runs_where_verl_runs(offline_trackers, tmp_path, monkeypatch):
    """Without volcengine_ml_platform (verl's ImportError) it is a ConfigError saying what it needs; with it, a skip."""
    with pytest.raises(ConfigError, match="VOLC_ACCESS_KEY_ID"):
        Tracking("p", "e", ["console", "vemlp_wandb"], config={"trainer": {"log_async": False}})
    from tracklane.trainer.config import load_config

    with pytest.raises(ConfigError, match="trainer.logger: the vemlp_wandb backend"):
        load_config(["trainer.logger=[console,vemlp_wandb]"])
    (tmp_path / "sdk" / "volcengine_ml_platform").mkdir(parents=True)  # importable, as on Volcano Engine's machines
    (tmp_path / "sdk" / "volcengine_ml_platform" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "sdk"))
    report = Tracking("p", "e", ["file", "vemlp_wandb"], config={"trainer": {"log_async": False}}).finish()
    assert report.complete and list(report.skipped_backends) == ["vemlp_wandb"]
