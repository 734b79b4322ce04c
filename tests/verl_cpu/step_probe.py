"""Where each of verl's training steps ended, whatever its loggers: for the step-time benchmark.

verl's ``timing_s/step`` reaches a store only through a logger, and the benchmark compares logging with none
(``trainer.logger=[]``). This fixture, loaded by ``VERL_USE_EXTERNAL_MODULES`` when ``VERL_CPU_STEP_PROBE`` names a
file, appends one JSON line per step as verl's trainer computes the step's metrics: the step, its
``timing_s/step`` (the step's own work: rollout, old log-probs, update), and the wall clock. Consecutive lines'
clocks differ by a whole loop iteration, which includes the previous step's ``logger.log()``: what synchronous
logging costs the loop and ``timing_s/step`` leaves out.
"""

from __future__ import annotations

import json
import os
import time
from types import ModuleType
from typing import Any

from tests.verl_cpu.after_import import after_import

TARGET = "verl.trainer.ppo.v1.trainer_base"
ENV = "VERL_CPU_STEP_PROBE"


def _probe(module: ModuleType) -> None:
    trainer = module.PPOTrainer
    original = trainer._compute_metrics

    def _compute_metrics(self: Any, batch: Any, metrics: dict[str, Any], timing_raw: dict[str, float],
                         global_steps: int, epoch: int) -> Any:
        result = original(self, batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        line = {"step": int(global_steps), "timing_s/step": metrics.get("timing_s/step"), "time": time.time()}
        with open(os.environ[ENV], "a") as out:
            out.write(json.dumps(line) + "\n")
        return result

    trainer._compute_metrics = _compute_metrics


if os.environ.get(ENV):
    after_import(TARGET, _probe)
