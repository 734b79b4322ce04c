"""The health rules on synthetic step series: each fires once when its condition starts to hold, never when healthy."""

from __future__ import annotations

import math

import pytest

from tracklane.core.errors import ConfigError
from tracklane.core.health_rules import Alert, HealthRules, RunRules, rule_settings


def _run(series: list[dict[str, float]], settings=None) -> list[Alert]:
    rules = HealthRules(rule_settings(settings))
    return [alert for step, values in enumerate(series, 1) for alert in rules.observe(step, values)]


def _healthy(step: int) -> dict[str, float]:
    return {"actor/entropy": 1.0 + 0.01 * (step % 3), "actor/kl_loss": 0.01, "actor/pg_clipfrac": 0.05,
            "critic/score/flat_group_ratio": 0.3, "response_length/clip_ratio": 0.02, "actor/pg_loss": -0.1,
            "actor/grad_norm": 0.5, "training/rollout_probs_diff_mean": 0.01, "critic/score/mean": 0.5}


def test_a_healthy_run_fires_nothing():
    """Two hundred steps of ordinary values fire no rule."""
    assert _run([_healthy(step) for step in range(200)]) == []


def test_entropy_collapse_fires_once_after_for_steps_below_its_early_median():
    """Entropy falling below 0.1 x its early median for 3 steps fires once, at the third step, and not again."""
    series = [_healthy(s) for s in range(10)] + [{**_healthy(s), "actor/entropy": 0.05} for s in range(10, 30)]
    (alert,) = _run(series)
    assert (alert.rule, alert.step, alert.key) == ("entropy_collapse", 13, "actor/entropy")
    assert "collapsed" in alert.message


@pytest.mark.parametrize(("rule", "key", "bad", "steps"), [
    ("kl_blowup", "actor/kl_loss", 5.0, 2), ("clip_saturated", "actor/pg_clipfrac", 0.6, 3),
    ("flat_groups", "critic/score/flat_group_ratio", 1.0, 5), ("length_clipped", "response_length/clip_ratio", 0.8, 3),
    ("rollout_mismatch", "training/rollout_probs_diff_mean", 0.5, 3)])
def test_threshold_rules_fire_after_their_streak_and_again_after_recovering(rule, key, bad, steps):
    """A value over the threshold for for_steps steps fires; as many healthy steps re-arm the rule, fewer do not."""
    episode = [{**_healthy(s), key: bad} for s in range(8)]
    alerts = _run([_healthy(0)] + episode + [_healthy(9)] * steps + episode)
    assert [(a.rule, a.step) for a in alerts] == [(rule, 1 + steps), (rule, 9 + 2 * steps)]
    if steps > 1:  # a value wavering around the threshold: one alert
        assert len(_run([_healthy(0)] + episode + [_healthy(9)] * (steps - 1) + episode)) == 1


def test_non_finite_loss_or_grad_norm_fires_at_once_per_key():
    """A NaN loss and an Inf grad norm each fire at their first step."""
    series = [_healthy(0), {**_healthy(1), "actor/pg_loss": math.nan}, {**_healthy(2), "actor/grad_norm": math.inf}]
    assert [(a.rule, a.key, a.step) for a in _run(series)] == [("non_finite", "actor/pg_loss", 2),
                                                               ("non_finite", "actor/grad_norm", 3)]


def test_training_reward_rising_while_validation_falls():
    """Four validations falling (0.05 in all) while the training reward rose at each fires reward_val_diverge; a
    smaller fall does not."""
    def series(vals):
        out = []
        for n, (reward, val) in enumerate(zip([0.2, 0.3, 0.4, 0.5], vals, strict=True)):
            out += [{**_healthy(n), "critic/score/mean": reward}, {"val-core/tool/acc/mean@1": val}]
        return out
    (alert,) = _run(series([0.5, 0.48, 0.46, 0.44]))
    assert alert.rule == "reward_val_diverge" and alert.key == "val-core/tool/acc/mean@1" and alert.step == 8
    assert _run(series([0.5, 0.49, 0.48, 0.47])) == []


def test_a_rule_turned_off_or_retuned():
    """enabled: false silences a rule; a threshold setting moves it."""
    episode = [{**_healthy(s), "actor/kl_loss": 5.0} for s in range(5)]
    assert _run(episode, {"kl_blowup": {"enabled": False}}) == []
    assert _run(episode, {"kl_blowup": {"threshold": 10.0}}) == []


def test_settings_are_checked():
    """An unknown rule, an unknown setting or a bad value is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="unknown rule 'nope'"):
        rule_settings({"nope": {}})
    with pytest.raises(ConfigError, match="kl_blowup: unknown setting 'limit'"):
        rule_settings({"kl_blowup": {"limit": 1}})
    with pytest.raises(ConfigError, match="kl_blowup.threshold must be a number"):
        rule_settings({"kl_blowup": {"threshold": "high"}})


def test_an_alert_survives_its_plain_form():
    """Alert.to_plain / from_plain round-trips; anything else is refused."""
    alert = Alert(rule="kl_blowup", step=3, key="actor/kl_loss", value=5.0, message="m")
    assert Alert.from_plain(alert.to_plain()) == alert
    with pytest.raises(Exception, match="malformed alert"):
        Alert.from_plain(["kl_blowup", "3", "k", 1.0, "m"])


def test_rank_zero_rules_judge_the_pace_and_the_lanes():
    """stalled fires once when no step came for 5 x the median gap (and the floor), again only after a new step;
    tracker_down and lane_behind fire once per lane and episode."""
    rules = RunRules(rule_settings({"stalled": {"threshold": 2.0}, "tracker_down": {"threshold": 10.0},
                                    "lane_behind": {"threshold": 30.0}}))
    healthy = {"file": (0.0, 0.1), "wandb": (0.0, 0.1)}
    now = 0.0
    for step in range(1, 6):  # a step a second
        now = float(step)
        assert rules.look(now, step, healthy) == []
    assert rules.look(now + 4.9, 5, healthy) == []  # under 5 x 1 s
    (stalled,) = rules.look(now + 5.1, 5, healthy)
    assert (stalled.rule, stalled.step, stalled.key) == ("stalled", 5, "trainer") and "looks stuck" in stalled.message
    assert rules.look(now + 9, 5, healthy) == []  # once per stall
    assert rules.look(now + 10, 6, healthy) == []  # a step: re-armed
    down = {"file": (12.0, 40.0), "wandb": (0.0, 0.1)}
    alerts = rules.look(now + 10.5, 6, down)
    assert sorted((a.rule, a.key) for a in alerts) == [("lane_behind", "file"), ("tracker_down", "file")]
    assert rules.look(now + 11, 6, down) == []
    assert rules.look(now + 11.5, 6, healthy) == [] and len(rules.look(now + 12, 6, down)) == 2  # a new episode


def test_the_health_judge_writes_its_state_only_when_an_alert_fired(tmp_path):
    """The judge's state file is written after the batch that fired an alert (after its emitter's keep), and left
    alone by flushes with nothing new; a judge opened on it takes those alerts back."""
    from tracklane.core.records import Metrics, RunSpec
    from tracklane.workers.sinks.health import HealthSink

    class Emitter:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def emit(self, records) -> None:
            self.calls.append("emit")

        def keep(self) -> None:
            self.calls.append("keep")

    path, run = tmp_path / "health.judge", RunSpec(project="p", experiment="e", run_id="r")
    judge, emitter = HealthSink(run, {"rules": {}, "state_path": str(path)}), Emitter()
    judge.judge_into(emitter)
    judge.open(None)
    judge.write([Metrics(step=1, values=_healthy(1), time=0.0)])
    judge.flush()
    assert not path.exists()  # nothing fired: nothing to keep
    judge.write([Metrics(step=2, values={**_healthy(2), "actor/pg_loss": math.nan}, time=0.0)])
    judge.flush()
    assert emitter.calls == ["emit", "keep"] and path.exists()
    written = path.stat()
    for step in (3, 4):
        judge.write([Metrics(step=step, values=_healthy(step), time=0.0)])
        judge.flush()
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    again = HealthSink(run, {"rules": {}, "state_path": str(path)})
    again.open({})
    again.flush()
    assert again.judged() == judge.judged() and len(judge.judged()["alerts"]) == 1
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
