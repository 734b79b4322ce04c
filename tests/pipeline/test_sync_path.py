"""The synchronous path (log_async false, verl's default): same sinks in-process, failures isolated."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.conftest import log_verl_steps, same_value
from tracklane import ConfigError, Tracking
from tracklane.workers.testing.memory import memory_records


def test_console_prints_verl_lines(capsys):
    """The console backend prints one verl-style line per step: step:N - key:value - ..."""
    with Tracking("p", "e", "console") as tracking:
        tracking.log({"actor/pg_loss": 0.25, "n": 3, "nested": {"a": 1.5}}, step=7)
    assert "step:7 - actor/pg_loss:0.25 - n:3 - nested/a:1.5" in capsys.readouterr().out


def test_every_value_arrives(offline_trackers):
    """300 steps x ~100 keys arrive in the memory and file sinks exactly as logged."""
    tracking = Tracking("p", "e", ["memory", "file"], config={"trainer": {"log_async": False}})
    logged = log_verl_steps(tracking, 300)
    report = tracking.finish()
    assert report.complete, report.summary()
    memory = {r.step: r.values for r in memory_records(tracking.run_id)}
    lines = [json.loads(line) for line in open(offline_trackers["file"], encoding="utf-8")]
    in_file = {line["step"]: {k: math.nan if v is None else v for k, v in line["data"].items()} for line in lines}
    for got in (memory, in_file):  # the file's NaN is verl's: orjson writes null
        assert list(got) == list(range(300))
        for step, values in logged.items():
            assert set(got[step]) == set(values) and all(same_value(got[step][k], v) for k, v in values.items())


def test_file_run_json_holds_redacted_config_and_the_jsonl_only_verls_lines(offline_trackers):
    """The config goes beside verl's file (``<name>_tracklane/run.json``), once, with secrets redacted; the
    ``.jsonl`` holds only verl's lines."""
    config = {"trainer": {"wandb_api_key": "sk-secret", "lr": 0.1}}
    tracking = Tracking("p", "e", "file", config=config)
    tracking.log({"a": 1.0}, step=0)
    tracking.finish()
    path = str(offline_trackers["file"])
    identity = open(os.path.join(path[: -len(".jsonl")] + "_tracklane", "run.json"), encoding="utf-8").read()
    assert json.loads(identity)["config"]["trainer"]["lr"] == 0.1
    assert "sk-secret" not in identity
    assert open(path, "rb").read() == b'{"step":0,"data":{"a":1.0}}\n'


def test_failing_sink_does_not_stop_others(offline_trackers, caplog):
    """A sink raising on every write is counted and warned once; the file sink still gets every step."""
    config = {"trainer": {"memory_sink": {"fail_writes": True}, "async_log": {"retry_backoff_s": 0.0}}}
    tracking = Tracking("p", "e", ["memory", "file"], config=config)
    for step in range(20):
        tracking.log({"x": float(step)}, step=step)
    report = tracking.finish()
    assert report.lanes["memory"].failed_records == 20 and report.lanes["file"].complete
    assert sum("backend memory failed" in r.getMessage() for r in caplog.records) == 1
    lines = open(offline_trackers["file"], encoding="utf-8").read().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(20))


def test_sink_failing_to_open_is_reported(offline_trackers):
    """A tracker that cannot open is reported and its records counted as failed; the run goes on."""
    config = {"trainer": {"memory_sink": {"fail_open": True}, "async_log": {"retry_backoff_s": 0.0}}}
    tracking = Tracking("p", "e", ["memory", "file"], config=config)
    tracking.log({"x": 1.0}, step=0)
    report = tracking.finish()
    assert report.lanes["memory"].failed_records == 1 and "fail on open" in report.lanes["memory"].error


def test_bad_input_never_raises(offline_trackers, caplog):
    """Garbage data, steps and backends are warned about and skipped; the loop keeps running."""
    tracking = Tracking("p", "e", ["memory"])
    tracking.log(None, step=1)
    tracking.log({"x": 1.0}, step="not a step")
    tracking.log({"x": 2.0, "s": "x" * 10_000_000, "o": object()}, step=2)
    report = tracking.finish()
    assert [(r.step, r.values) for r in memory_records(tracking.run_id)] == [(2, {"x": 2.0})]
    assert report.skipped_values == 2 and report.rejected_records == 1 and report.dropped_records == 1


@pytest.mark.slow
def test_resume_continues_the_run_by_id(offline_trackers):
    """resume=True with the first run's id appends to its file log and reopens its MLflow run."""
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids, read_mlflow_run

    config = {"trainer": {"log_async": False}}
    first = Tracking("p", "e", ["file", "mlflow"], config=config)
    first.log({"x": 1.0}, step=1)
    first.finish()
    second = Tracking("p", "e", ["file", "mlflow"], config=config, run_id=first.run_id, resume=True)
    second.log({"x": 2.0}, step=2)
    second.finish()
    assert second.run_id == first.run_id and second.vitals() == {}
    lines = [json.loads(line) for line in open(offline_trackers["file"], encoding="utf-8")]
    assert [line["step"] for line in lines] == [1, 2]
    identity = os.path.join(str(offline_trackers["file"])[: -len(".jsonl")] + "_tracklane", "run.json")
    assert json.loads(open(identity, encoding="utf-8").read())["resumed"] is True
    (run_id,) = find_mlflow_run_ids(offline_trackers["mlflow_uri"], "p", "e")
    run = read_mlflow_run(offline_trackers["mlflow_uri"], run_id)
    assert sorted(step for step, key, _ in run.points if key == "x") == [1, 2] and run.status == "FINISHED"


def test_resume_needs_a_valid_run_id():
    """A resume without an id, or an id a tracker would refuse, is a clear error before anything opens."""
    with pytest.raises(ConfigError, match="needs the run_id"):
        Tracking("p", "e", "console", resume=True)
    with pytest.raises(ConfigError, match="run_id must be 1-64 letters"):
        Tracking("p", "e", "console", run_id="team/run 1")
