"""RL health rules: judgements on a run's own step metrics, each firing an ``Alert`` once when it starts to hold.

No Ray and no I/O: the health lane's sink (workers/sinks/health.py) feeds ``HealthRules.observe`` the metrics it
is handed, off the trainer's thread and process; rank 0 routes what fires to the console and every tracker.
Defaults fit verl's metric names (and the main job's). A rule fires when its condition holds for ``for_steps``
steps in a row, and fires again only after the condition stopped holding for as many: one alert per episode, not
per step, and none for a value wavering around its threshold.

    entropy_collapse     actor/entropy below ``ratio`` x its median over the first ``warmup`` steps
    kl_blowup            actor/kl_loss or actor/ppo_kl above ``threshold``
    clip_saturated       actor/pg_clipfrac above ``threshold``
    flat_groups          critic/score/flat_group_ratio (GRPO groups with no reward spread) above ``threshold``
    length_clipped       response_length/clip_ratio (responses cut at the length limit) above ``threshold``
    reward_val_diverge   the training reward (critic/score/mean) rising over the last ``points`` validations
                         while the validation score (val-core/*/mean@*) falls at each, by ``threshold`` in all
    rollout_mismatch     training/rollout_probs_diff_mean or rollout_corr/k3_kl above ``threshold``
    non_finite           NaN or +-Inf in a loss or a grad norm (a key with ``loss`` or ``grad_norm`` in it): at once

Three more are judged on rank 0, which knows the steps' timing and the lanes (``RunRules``, on the shipper thread):

    stalled              no new trainer step for ``ratio`` x the median time between steps, and ``threshold`` s
    tracker_down         a tracker out of reach for ``threshold`` s: down (its lane retrying), its lane's actor not
                         started or restarting yet, or the lane given up (its records kept in the spool)
    lane_behind          a lane's oldest record not handed to its tracker for ``threshold`` s
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from itertools import pairwise
from typing import Any, NamedTuple

from tracklane.core.errors import CodecError, ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """A rule that started to hold, at a step, on a key's value."""

    rule: str
    step: int
    key: str
    value: float
    message: str

    def to_plain(self) -> list[Any]:
        return [self.rule, self.step, self.key, self.value, self.message]

    @classmethod
    def from_plain(cls, data: Any) -> Alert:
        if not (isinstance(data, list) and len(data) == 5 and type(data[0]) is str and type(data[1]) is int
                and type(data[2]) is str and type(data[3]) in (int, float) and type(data[4]) is str):
            raise CodecError("malformed alert")
        return cls(rule=data[0], step=data[1], key=data[2], value=float(data[3]), message=data[4])


@dataclass(slots=True, kw_only=True)
class RuleSettings:
    """One rule's setting (``trainer.health.rules.<name>``); which fields a rule reads is in its line above."""

    enabled: bool = True
    threshold: float = 0.0
    for_steps: int = 1
    ratio: float = 0.0
    warmup: int = 0
    points: int = 0


DEFAULTS: dict[str, RuleSettings] = {
    "entropy_collapse": RuleSettings(ratio=0.1, warmup=5, for_steps=3),
    "kl_blowup": RuleSettings(threshold=1.0, for_steps=2),
    "clip_saturated": RuleSettings(threshold=0.3, for_steps=3),
    "flat_groups": RuleSettings(threshold=0.9, for_steps=5),
    "length_clipped": RuleSettings(threshold=0.3, for_steps=3),
    "reward_val_diverge": RuleSettings(points=4, threshold=0.05),
    "rollout_mismatch": RuleSettings(threshold=0.1, for_steps=3),
    "non_finite": RuleSettings(),
    "stalled": RuleSettings(ratio=5.0, threshold=60.0),
    "tracker_down": RuleSettings(threshold=60.0),
    "lane_behind": RuleSettings(threshold=300.0),
}
"""Every rule and its defaults (docs/health.md explains each)."""

ERROR_RULES = frozenset({"non_finite", "stalled", "tracker_down"})
"""Rules whose alert is an ``ERROR`` (the run is broken or losing time); the others' are ``WARN``."""

_KEYS: dict[str, tuple[str, ...]] = {
    "entropy_collapse": ("actor/entropy",),
    "kl_blowup": ("actor/kl_loss", "actor/ppo_kl"),
    "clip_saturated": ("actor/pg_clipfrac",),
    "flat_groups": ("critic/score/flat_group_ratio",),
    "length_clipped": ("response_length/clip_ratio",),
    "rollout_mismatch": ("training/rollout_probs_diff_mean", "rollout_corr/k3_kl"),
    "non_finite": ("*loss*", "*grad_norm*"),
}
LANE = "health"
"""The health lane's name (workers/sinks/health.py): like the reduce lane, added by Tracking, never a tracker."""
TRAIN_REWARD = "critic/score/mean"
VALIDATION = "val-core/*/mean@*"


def rule_settings(section: Mapping[str, Any] | None) -> dict[str, RuleSettings]:
    """The defaults with ``trainer.health.rules`` over them; a ConfigError names an unknown rule or field."""
    rules = {name: dataclasses.replace(settings) for name, settings in DEFAULTS.items()}
    for name, changes in dict(section or {}).items():
        if name not in rules:
            raise ConfigError(f"trainer.health.rules: unknown rule {name!r}; rules are: {', '.join(DEFAULTS)}")
        for key, value in dict(changes or {}).items():
            if key not in RuleSettings.__slots__:
                raise ConfigError(f"trainer.health.rules.{name}: unknown setting {key!r}")
            if key == "enabled" and not isinstance(value, bool):
                raise ConfigError(f"trainer.health.rules.{name}.{key} must be true or false, got {value!r}")
            number = not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0
            if key != "enabled" and not number:
                raise ConfigError(f"trainer.health.rules.{name}.{key} must be a number >= 0, got {value!r}")
            setattr(rules[name], key, int(value) if key in ("for_steps", "warmup", "points") else value)
    return rules


@dataclass(slots=True)
class _Streak:
    """How many steps in a row a rule's condition held on a key, and whether this episode has fired."""

    steps: int = 0
    clear: int = 0  # steps in a row it did not hold
    fired: bool = False

    def step(self, holds: bool, for_steps: int) -> bool:
        """One step's verdict; True when the rule fires now."""
        self.steps, self.clear = (self.steps + 1, 0) if holds else (0, self.clear + 1)
        if self.fired and self.clear >= max(1, for_steps):
            self.fired = False  # the episode is over: the next one fires again
        if holds and not self.fired and self.steps >= max(1, for_steps):
            self.fired = True
            return True
        return False


@dataclass(slots=True)
class HealthRules:
    """The rules' state over one run's steps."""

    settings: dict[str, RuleSettings] = field(default_factory=lambda: rule_settings(None))
    _streaks: dict[tuple[str, str], _Streak] = field(default_factory=dict)
    _baseline: dict[str, list[float]] = field(default_factory=dict)
    _train_reward: float | None = None
    _validations: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))

    def observe(self, step: int, values: Mapping[str, Any]) -> list[Alert]:
        """One step's metrics (of any number of calls); the alerts that started to hold with them."""
        alerts: list[Alert] = []
        for name, on in self.settings.items():
            if on.enabled and name in _KEYS:
                for key in _matching(_KEYS[name], values):
                    alerts += self._judge(name, on, step, key, values[key])
        if self.settings["reward_val_diverge"].enabled:
            alerts += self._diverging(step, values)
        return alerts

    def _judge(self, name: str, on: RuleSettings, step: int, key: str, raw: Any) -> list[Alert]:
        value = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
        baseline = self._baseline.setdefault(key, []) if name == "entropy_collapse" else []
        holds, why = _condition(name, on, value, baseline)
        if not self._streaks.setdefault((name, key), _Streak()).step(holds, on.for_steps):
            return []
        return [Alert(rule=name, step=step, key=key, value=value, message=f"{key} = {value:.4g} at step {step}: {why}")]

    def _diverging(self, step: int, values: Mapping[str, Any]) -> list[Alert]:
        reward = values.get(TRAIN_REWARD)
        if isinstance(reward, (int, float)) and math.isfinite(reward):
            self._train_reward = float(reward)
        val_keys = _matching((VALIDATION,), values)
        if not val_keys or self._train_reward is None:
            return []
        val = float(values[val_keys[0]])
        self._validations.append((self._train_reward, val))
        on = self.settings["reward_val_diverge"]
        recent = list(self._validations)[-on.points:]
        holds = len(recent) == on.points >= 2 and recent[0][1] - recent[-1][1] >= on.threshold \
            and all(b[0] > a[0] and b[1] < a[1] for a, b in pairwise(recent))
        if not self._streaks.setdefault(("reward_val_diverge", val_keys[0]), _Streak()).step(holds, 1):
            return []
        return [Alert(rule="reward_val_diverge", step=step, key=val_keys[0], value=val,
                      message=f"{val_keys[0]} fell at each of the last {on.points} validations (now {val:.4g}, step "
                              f"{step}) while {TRAIN_REWARD} rose: the policy may be overfitting the reward")]


def _condition(name: str, on: RuleSettings, value: float, baseline: list[float]) -> tuple[bool, str]:
    """Whether ``name``'s condition holds for ``value``, and why in words."""
    if name == "non_finite":
        return not math.isfinite(value), "not a finite number"
    if not math.isfinite(value):
        return False, ""
    if name == "entropy_collapse":
        if len(baseline) < max(1, on.warmup):
            baseline.append(value)
            return False, ""
        floor = on.ratio * statistics.median(baseline)
        return value < floor, f"below {on.ratio:g} x its early median ({floor:.4g}): the policy's entropy collapsed"
    return value > on.threshold, f"above {on.threshold:g} for {on.for_steps} step(s)"


def _matching(patterns: Iterable[str], values: Mapping[str, Any]) -> list[str]:
    """The keys of ``values`` a pattern names (exact names are looked up, not scanned)."""
    out: list[str] = []
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            out += [key for key in values if fnmatchcase(key, pattern) and not key.startswith("tracklane/")]
        elif pattern in values:
            out.append(pattern)
    return out


class LaneHealth(NamedTuple):
    """What rank 0's rules look at in a lane (shipping/lane.py ``lane_down``, the small stream's lag)."""

    down_s: float
    """How long its tracker has been out of reach (0: it takes batches)."""
    lag_s: float
    """Age of its oldest record not handed to its tracker."""
    down: str = ""
    """Why, in words: "not started after 95 s (pending: waiting for resource logging_node)"."""


@dataclass(slots=True)
class RunRules:
    """The rules rank 0 judges: the trainer's pace and the lanes, looked at every round of the shipper thread."""

    settings: dict[str, RuleSettings] = field(default_factory=lambda: rule_settings(None))
    _last_step: int | None = None
    _last_at: float = 0.0
    _gaps: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    _fired: set[tuple[str, str]] = field(default_factory=set)

    def look(self, now: float, step: int | None, lanes: Mapping[str, LaneHealth | tuple[float, float]]) -> list[Alert]:
        """``now`` (time.monotonic), the trainer's latest step, and each lane's ``LaneHealth``."""
        alerts = self._stalled(now, step)
        for name, figures in lanes.items():
            lane = LaneHealth(*figures)
            why = f"{lane.down} (its records wait in the spool)" if lane.down else \
                "its tracker has been down (retried, the records waiting in the spool)"
            alerts += self._over("tracker_down", name, lane.down_s, step, why, said=bool(lane.down))
            alerts += self._over("lane_behind", name, lane.lag_s, step, "its oldest record waits to be handed to its "
                                 "tracker")
        return alerts

    def _stalled(self, now: float, step: int | None) -> list[Alert]:
        on = self.settings["stalled"]
        if step != self._last_step:
            if self._last_step is not None:
                self._gaps.append(now - self._last_at)
            self._last_step, self._last_at = step, now
            self._fired.discard(("stalled", ""))
            return []
        if not on.enabled or step is None or len(self._gaps) < 3 or ("stalled", "") in self._fired:
            return []
        idle = now - self._last_at
        limit = max(on.threshold, on.ratio * statistics.median(self._gaps))
        if idle < limit:
            return []
        self._fired.add(("stalled", ""))
        return [Alert(rule="stalled", step=step, key="trainer", value=idle,
                      message=f"no step after step {step} for {idle:.0f} s ({on.ratio:g} x the median "
                              f"{statistics.median(self._gaps):.2f} s between steps): the trainer looks stuck")]

    def _over(self, rule: str, lane: str, seconds: float, step: int | None, why: str, said: bool = False) -> list[Alert]:
        """``said``: ``why`` tells how long already."""
        on = self.settings[rule]
        if seconds < on.threshold:
            self._fired.discard((rule, lane))
            return []
        if not on.enabled or (rule, lane) in self._fired:
            return []
        self._fired.add((rule, lane))
        return [Alert(rule=rule, step=step or 0, key=lane, value=seconds,
                      message=f"lane {lane}: {why}" if said else f"lane {lane}: {why} for {seconds:.0f} s")]
