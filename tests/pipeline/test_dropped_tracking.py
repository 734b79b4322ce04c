"""A dropped ``Tracking`` finishes where it is dropped, as verl's own does (``Tracking.__del__``).

verl's ``RayPPOTrainer.fit`` keeps its ``Tracking`` in a local and returns without ``finish()``; verl's
trainer relies on ``__del__`` to end every tracker run right there. These tests read the trackers back
right after the drop, before anything else could finish the run.
"""

from __future__ import annotations

import gc
import json
import weakref

import pytest

from tracklane import Tracking
from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

STEPS = 30


def _fit(log_async: bool, backends=("file", "mlflow")) -> str:
    """verl's fit() pattern: a local Tracking, steps logged, no finish(), return."""
    logger = Tracking("drop-proj", "drop-exp", list(backends), config={"trainer": {"log_async": log_async}})
    for step in range(STEPS):
        logger.log({"loss": 1.0 / (step + 1)}, step=step)
    return logger.run_id


def _assert_delivered_and_finished(trackers, run_name: str = "drop-exp") -> None:
    lines = [json.loads(line) for line in trackers["file"].read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(STEPS))
    [run_id] = find_mlflow_run_ids(trackers["mlflow_uri"], "drop-proj", run_name)
    back = read_mlflow_run(trackers["mlflow_uri"], run_id)
    assert back.status == "FINISHED"
    assert sorted(step for step, key, _ in back.points if key == "loss") == list(range(STEPS))


@pytest.mark.slow
@pytest.mark.parametrize("log_async", [False, True], ids=["sync", "async"])
def test_a_tracking_dropped_by_a_returning_function_has_finished_every_tracker(offline_trackers, log_async, request):
    """Right after fit() returns, every step is in the file and MLflow, and the MLflow run is FINISHED."""
    if log_async:
        request.getfixturevalue("ray_session")
    _fit(log_async)
    _assert_delivered_and_finished(offline_trackers)


@pytest.mark.slow
def test_del_and_collect_finish_the_run_at_once(offline_trackers):
    """``del logger; gc.collect()``: the MLflow run is FINISHED before the next line runs."""
    logger = Tracking("drop-proj", "drop-exp", ["file", "mlflow"], config={"trainer": {"log_async": False}})
    for step in range(STEPS):
        logger.log({"loss": 1.0 / (step + 1)}, step=step)
    view = logger.logger["file"]  # verl's Tracking.logger: views hold the run weakly
    del logger
    gc.collect()
    _assert_delivered_and_finished(offline_trackers)
    view.log({"loss": 0.0}, step=STEPS)  # after its run ended: a warning, never an exception


def test_a_live_tracking_is_found_by_verls_loggers_and_a_finished_one_is_forgotten(offline_trackers):
    """The registry of unfinished runs holds them weakly: dropped and finished, the run is gone from it."""
    from tracklane.tracking import active_tracking

    logger = Tracking("drop-proj", "drop-exp", ["file"], config={"trainer": {"log_async": False}})
    assert active_tracking("drop-proj", "drop-exp") is logger
    ref = weakref.ref(logger)
    del logger
    assert ref() is None and active_tracking("drop-proj", "drop-exp") is None


def test_verls_logger_and_console_logger_views_reach_their_backend_only(offline_trackers, capsys):
    """``logger[name].log`` and ``console_logger.log`` log to that one backend, as verl's objects do."""
    tracking = Tracking("drop-proj", "views", ["console", "file"], config={"trainer": {"log_async": False}})
    assert sorted(tracking.logger) == ["console", "file"]
    tracking.console_logger.log({"only/console": 1.0}, step=1)
    tracking.logger["file"].log({"only/file": 2.0}, step=2)
    tracking.finish()
    printed = capsys.readouterr().out
    assert "only/console" in printed and "only/file" not in printed
    lines = [json.loads(line) for line in offline_trackers["file"].read_text().splitlines()]
    assert lines == [{"step": 2, "data": {"only/file": 2.0}}]
    with pytest.raises(AttributeError, match="console_logger"):
        _ = Tracking("drop-proj", "no-console", ["file"], config={"trainer": {"log_async": False}}).console_logger


def _method_dropping_a_run_in_a_cycle(fail: bool) -> None:
    """verl's fit() as it really runs: its frame outlives the call in a reference cycle (an OmegaConf exception's
    traceback, in verl), so the local Tracking is not freed when the call returns."""
    import sys

    logger = Tracking("drop-proj", "drop-exp", ["file", "mlflow"], config={"trainer": {"log_async": False}})
    holder: dict = {"frame": sys._getframe()}  # the cycle: this frame -> holder -> this frame
    holder["self"] = holder
    for step in range(STEPS):
        logger.log({"loss": 1.0 / (step + 1)}, step=step)
    if fail:
        raise RuntimeError("boom in the actor method")


@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True], ids=["returns", "raises"])
def test_a_ray_actor_method_finishes_the_runs_it_dropped_before_it_counts_as_done(offline_trackers, fail):
    """Ray's executor, wrapped: a run held only by a garbage cycle is finished once the method returns (FINISHED),
    and a run left by a method that raised is finished as failed with the traceback in it (FAILED)."""
    from tracklane.verl.ray_methods import finishing_dropped_runs

    gc.collect()
    gc.disable()  # no collection may happen to finish it first
    try:
        method = _method_dropping_a_run_in_a_cycle
        run = finishing_dropped_runs(lambda actor, *args: method(*args), method)
        if fail:
            with pytest.raises(RuntimeError, match="boom"):
                run(object(), True)
        else:
            run(object(), False)
        [run_id] = find_mlflow_run_ids(offline_trackers["mlflow_uri"], "drop-proj", "drop-exp")
        back = read_mlflow_run(offline_trackers["mlflow_uri"], run_id)
    finally:
        gc.enable()
    assert back.status == ("FAILED" if fail else "FINISHED")
    assert sorted(step for step, key, _ in back.points if key == "loss") == list(range(STEPS))
    text = offline_trackers["file"].parent / "metrics_media" / "text"
    assert any(text.rglob("*.txt")) == fail  # the crash record (error/traceback) only when it raised
