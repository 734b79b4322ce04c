"""verl's other public names: DapoFilteredRewardTableLogger into wandb's run, the platform backends' clear errors."""

from __future__ import annotations

import pytest

from pipeline import ConfigError, DapoFilteredRewardTableLogger, Tracking
from pipeline.dapo_reward_logger import KEY, counts_text
from pipeline.testing.readers.wandb_reader import read_wandb_media

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


@pytest.mark.parametrize("name, needs", [("vemlp_wandb", "VOLC_ACCESS_KEY_ID"), ("rl_insight", "rl-insight server start")])
def test_verls_platform_backends_say_what_they_need(name, needs, offline_trackers):
    """Naming vemlp_wandb or rl_insight is a ConfigError saying what the platform needs and what to use instead."""
    with pytest.raises(ConfigError, match=needs):
        Tracking("p", "e", ["console", name], config={"trainer": {"log_async": False}})
    from trainer.config import load_config

    with pytest.raises(ConfigError, match=f"trainer.logger: the {name} backend"):
        load_config([f"trainer.logger=[console,{name}]"])
