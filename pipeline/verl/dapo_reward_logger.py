"""``DapoFilteredRewardTableLogger``: a drop-in for verl's, routed through the live ``Tracking``.

verl's DAPO trainer calls ``DapoFilteredRewardTableLogger(project, experiment).log(config.trainer.logger,
reward_counts, step)`` with the counts of the groups its dynamic sampling filtered out (no signal: every
response of the group scored the same), by reward value. verl keeps a wandb table of one row per step,
``(step, "value:count, ...")``, under ``training/filter_groups/filtered_reward_counts``, and skips every
other backend (a table of that shape renders usefully only there). Here the row is one ``text`` record for
wandb, which the wandb sink appends to its incremental table of ``(step, text)`` rows: the same view, off
the trainer's thread. Inside a Ray actor, give it a producer (``producer=tracking.producer("dapo")``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracklane.tracking import active_tracking

log = logging.getLogger("tracklane")

KEY = "training/filter_groups/filtered_reward_counts"
"""verl's key for the table."""


@dataclass
class DapoFilteredRewardTableLogger:
    project_name: str | None = None
    experiment_name: str | None = None
    producer: Any = None
    """A ``Producer`` (``Tracking.producer``) to log through instead of this process's ``Tracking``."""

    def log(self, loggers: str | Sequence[str], reward_counts: Mapping[Any, Any], step: int) -> None:
        """``reward_counts``: reward value -> groups filtered out at this step (merged across mini-batches)."""
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        if "wandb" not in names:
            return  # as verl: the table is wandb's only
        tracking = self.producer if self.producer is not None else active_tracking(self.project_name,
                                                                                   self.experiment_name)
        if tracking is None:
            log.warning("tracklane: DapoFilteredRewardTableLogger.log() with no unfinished Tracking for %s/%s; "
                        "the row of step %s not logged", self.project_name, self.experiment_name, step)
            return
        if "wandb" not in tracking.backends:
            return
        try:
            text = counts_text(reward_counts)
        except (AttributeError, TypeError, ValueError):  # not value -> count: skipped, warned, counted (rejected)
            tracking._reject("DapoFilteredRewardTableLogger.log", reward_counts)
            return
        tracking.log_text(KEY, text, step, backend="wandb")


def counts_text(reward_counts: Mapping[Any, Any]) -> str:
    """verl's cell: ``"value:count"`` pairs by increasing value, values in ``%g``."""
    row = {float(value): int(count) for value, count in reward_counts.items()}
    return ", ".join(f"{value:g}:{row[value]}" for value in sorted(row))
