"""``ValidationGenerationsLogger``: a drop-in for verl's, routed through the live ``Tracking``.

verl's trainer calls ``ValidationGenerationsLogger(project, experiment).log(config.trainer.logger,
samples, step)`` with rows of (input, output, score), and verl then rebuilds a whole wandb table
at every validation. Here the samples become one ``generations`` record in the pipeline: each
tracker stores them natively and incrementally (see the sinks), off the trainer's thread when
``log_async`` is on. Inside a Ray actor or task, give it a producer
(``ValidationGenerationsLogger(producer=tracking.producer("rollouter"))``): the samples then go
through that producer into the same run, with no ``Tracking`` in that process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracklane.tracking import active_tracking

log = logging.getLogger("tracklane")


@dataclass
class ValidationGenerationsLogger:
    project_name: str | None = None
    experiment_name: str | None = None
    producer: Any = None
    """A ``Producer`` (``Tracking.producer``) to log through instead of this process's ``Tracking``."""

    def log(self, loggers: str | Sequence[str], samples: Sequence[Sequence[Any]], step: int) -> None:
        tracking = self.producer if self.producer is not None else active_tracking(self.project_name,
                                                                                   self.experiment_name)
        if tracking is None:
            log.warning("tracklane: ValidationGenerationsLogger.log() with no unfinished Tracking for %s/%s; "
                        "%d samples not logged", self.project_name, self.experiment_name, len(samples))
            return
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        backends = [name for name in names if name in tracking.backends]
        if backends:
            tracking.log_generations(samples, step, backend=backends)
