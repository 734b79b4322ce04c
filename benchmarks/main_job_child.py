"""``python -m tracklane.trainer`` for ``tracklane.benchmarks.main_job`` and ``busy``: ``tracklane.trainer.main.main``
unchanged, and the step times ``fit()`` measured written to ``$TRACKLANE_STEP_TIMES`` (JSON, step -> seconds) when it
returns. With ``$TRACKLANE_RUN_FIGURES`` set, also what the run's finish() said there (JSON): each lane's lag, time
to its first stored point, what it left in the spool and why; finish()'s own time; the peak RSS of the trainer's
process and of each lane actor's (read just before finish() ends them). With ``$TRACKLANE_LOGGED_POINTS`` set, every
numeric point ``log()`` was handed, as JSON lines ``[step, key, value]`` (the truth a test compares the trackers
with)."""

from __future__ import annotations

import json
import numbers
import os
import resource
import sys
import time
from typing import Any

import tracklane.trainer.main
from tracklane import Tracking


def _recording_fit(fit: Any) -> Any:
    def fit_and_record(*args: Any, **kwargs: Any) -> Any:
        result = fit(*args, **kwargs)
        with open(os.environ["TRACKLANE_STEP_TIMES"], "w", encoding="utf-8") as handle:
            json.dump(result.step_s, handle)
        return result
    return fit_and_record


def _peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM), MiB; 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _figures_finish(finish: Any, path: str) -> Any:
    def finish_and_write(self: Tracking, *args: Any, **kwargs: Any) -> Any:
        if self._report is not None:
            return finish(self, *args, **kwargs)
        lanes_rss = {name: _peak_rss_mib(info.pid) for name, info in self.lanes().items() if info.pid}
        started = time.monotonic()
        report = finish(self, *args, **kwargs)
        figures = {
            "finish_s": time.monotonic() - started, "complete": report.complete, "summary": report.summary(),
            "trainer_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "lanes_peak_rss_mib": lanes_rss, "alerts": report.alerts,
            "spool": report.spool.directory if report.spool is not None else None,
            "lanes": {name: {"lag_p50_s": lane.lag_p50_s, "lag_p99_s": lane.lag_p99_s, "started_s": lane.started_s,
                             "first_stored_s": lane.first_stored_s, "unstored_records": lane.unstored_records,
                             "dropped_records": lane.dropped_records, "down": lane.down, "gave_up": lane.gave_up}
                      for name, lane in report.lanes.items()},
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(figures, handle)
        return report
    return finish_and_write


def _recording_log(log: Any, path: str) -> Any:
    handle = open(path, "a", encoding="utf-8")  # open for the process's life, flushed at each call

    def log_and_record(self: Tracking, data: Any, step: Any, *args: Any, **kwargs: Any) -> Any:
        for key, value in data.items():
            if isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "size", 0) == 1):
                handle.write(json.dumps([int(step), key, float(value)]) + "\n")
        handle.flush()
        return log(self, data, step, *args, **kwargs)
    return log_and_record


if __name__ == "__main__":
    tracklane.trainer.main.fit = _recording_fit(tracklane.trainer.main.fit)  # main() looks fit up in its module when it runs
    if os.environ.get("TRACKLANE_RUN_FIGURES"):
        Tracking.finish = _figures_finish(Tracking.finish, os.environ["TRACKLANE_RUN_FIGURES"])  # type: ignore[method-assign]
    if os.environ.get("TRACKLANE_LOGGED_POINTS"):
        Tracking.log = _recording_log(Tracking.log, os.environ["TRACKLANE_LOGGED_POINTS"])  # type: ignore[method-assign]
    sys.exit(tracklane.trainer.main.main(sys.argv[1:]))
