"""``python -m tracklane.trainer`` for ``tracklane.benchmarks.main_job``: ``tracklane.trainer.main.main`` unchanged,
and the step times ``fit()`` measured written to ``$TRACKLANE_STEP_TIMES`` (JSON, step -> seconds) when it returns."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import tracklane.trainer.main


def _recording_fit(fit: Any) -> Any:
    def fit_and_record(*args: Any, **kwargs: Any) -> Any:
        result = fit(*args, **kwargs)
        with open(os.environ["TRACKLANE_STEP_TIMES"], "w", encoding="utf-8") as handle:
            json.dump(result.step_s, handle)
        return result
    return fit_and_record


if __name__ == "__main__":
    tracklane.trainer.main.fit = _recording_fit(tracklane.trainer.main.fit)  # main() looks fit up in its module when it runs
    sys.exit(tracklane.trainer.main.main(sys.argv[1:]))
