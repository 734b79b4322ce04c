"""``trainer.console``: how the console backend prints (verl's line per step, or a compact aligned one).

    trainer:
      console:
        format: verl        # verl: "step:N - key:value - ..." (drop-in); compact: chosen keys, aligned
        keys: [...]         # compact: the keys of each step's line (fnmatch patterns, in this order)
        every: 10           # compact: the other keys every this many steps (0: never)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracklane.config.keys import refuse_unknown_keys
from tracklane.core.errors import ConfigError

FORMATS = ("verl", "compact")
COMPACT_KEYS = ["critic/score/mean", "critic/rewards/mean", "actor/pg_loss", "actor/entropy", "actor/kl_loss",
                "actor/grad_norm", "response_length/mean", "timing_s/step", "val-core/*"]
"""The headline figures of a verl PPO/GRPO step, then the validation's core figures when there are some."""


@dataclass(slots=True, kw_only=True)
class ConsoleConfig:
    format: str = "verl"
    """"verl": verl's own line per step; "compact": ``keys`` aligned on one line, the rest every ``every`` steps."""
    keys: list[str] = field(default_factory=lambda: list(COMPACT_KEYS))
    """compact: the keys of each step's line, fnmatch patterns, in this order."""
    every: int = 10
    """compact: the other keys too, every this many steps (0: never)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"trainer.console.format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if not isinstance(self.keys, list) or not all(isinstance(k, str) and k for k in self.keys):
            raise ConfigError(f"trainer.console.keys must be a list of key names or patterns, got {self.keys!r}")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ConfigError(f"trainer.console.every must be an int >= 0, got {self.every!r}")

    def to_plain(self) -> dict[str, Any]:
        return {"format": self.format, "keys": list(self.keys), "every": self.every}


def console_config(section: Mapping[str, Any] | None) -> ConsoleConfig:
    section = dict(section or {})
    refuse_unknown_keys(section, ConsoleConfig.__slots__, "trainer.console")
    if "keys" in section and section["keys"] is not None and not isinstance(section["keys"], (str, bytes)):
        section["keys"] = list(section["keys"])  # an OmegaConf ListConfig
    return ConsoleConfig(**section)
