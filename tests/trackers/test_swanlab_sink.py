"""SwanlabSink against the real swanlab SDK, offline, read back from what swanlab stored."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import msgpack
import pytest

pytest.importorskip("swanlab")

from tracklane.core.errors import SinkError
from tracklane.core.params import REDACTED, plain_config
from tracklane.core.records import Metrics, RunSpec
from tracklane.workers.sinks.swanlab import SwanlabSink
from tracklane.workers.testing.readers.swanlab_reader import list_swanlab_runs, read_swanlab_media, read_swanlab_run

REPO = Path(__file__).resolve().parents[2]
API_KEY = "swl-key-must-not-leak-0123456789"
STEPS = 300


@pytest.fixture
def logdir(tmp_path, monkeypatch):
    """Offline swanlab writing only under tmp_path: log folder, its home folder, the cwd."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SWANLAB_ROOT", str(home / ".swanlab"))
    monkeypatch.setenv("SWANLAB_SAVE_DIR", str(home / ".swanlab"))
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(tmp_path / "swanlog"))
    monkeypatch.setenv("SWANLAB_API_KEY", API_KEY)
    monkeypatch.chdir(tmp_path)  # swanlab also reads .env and swanlab.yaml from the cwd
    return tmp_path / "swanlog"


@pytest.fixture
def sinks():
    """Sinks opened by a test, closed afterwards even if it fails: swanlab allows one live run per process."""
    opened: list[SwanlabSink] = []
    yield opened
    for sink in opened:
        sink.close(1)


def _config() -> dict:
    return {
        "trainer": {"project_name": "p", "experiment_name": "e", "total_epochs": 3, "logger": ["console", "swanlab"]},
        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "ppo_mini_batch_size": 256}},
        "data": {"max_prompt_length": 512, "train_files": "/data/gsm8k/train.parquet"},
        "auth": {"wandb_api_key": "sk-secret", "hf_token": "sk-secret"},
    }


def _open(sinks: list, params: dict | None = None, resume: dict | None = None) -> tuple[SwanlabSink, dict]:
    run = RunSpec(project="p", experiment="e", params=plain_config(params or _config()), run_id="abc123")
    sink = SwanlabSink(run, SwanlabSink.resolve(run, os.environ, {}))
    sinks.append(sink)
    return sink, sink.open(resume)


def _verl_keys() -> list[str]:
    keys = [f"actor/{k}" for k in ("pg_loss", "entropy", "kl_loss", "pg_clipfrac", "ppo_kl", "grad_norm", "lr")]
    for group in ("score", "rewards", "advantages", "returns", "values"):
        keys += [f"critic/{group}/{stat}" for stat in ("mean", "max", "min")]
    for group in ("response_length", "prompt_length"):
        keys += [f"{group}/{stat}" for stat in ("mean", "max", "min", "clip_ratio")]
    stages = ("gen", "ref", "old_log_prob", "adv", "update_actor", "reward", "testing", "step")
    keys += [f"timing_s/{s}" for s in stages] + [f"timing_per_token_ms/{s}" for s in stages]
    keys += [f"perf/{k}" for k in ("throughput", "time_per_step", "max_memory_allocated_gb", "mfu/actor")]
    keys += [f"train/extra_{i}" for i in range(100 - len(keys) - 6)]
    return keys


def _step_values(rng: random.Random, step: int) -> list[dict]:
    """One step's metrics as verl logs them: training, timing, perf ints, and validation every 10 steps."""
    train = {k: rng.uniform(-5, 5) for k in _verl_keys()}
    train["actor/grad_norm"] = math.nan if step % 7 == 3 else train["actor/grad_norm"]
    train["actor/ppo_kl"] = math.inf if step % 50 == 1 else train["actor/ppo_kl"]
    train["actor/kl_loss"] = -math.inf if step == 42 else train["actor/kl_loss"]
    timing = {k: train.pop(k) for k in list(train) if k.startswith("timing")}
    counts = {"perf/total_num_tokens": rng.randrange(1, 2**40), "training/global_step": step,
              "training/epoch": step // 100}
    parts = [train, timing, counts]
    if step % 10 == 0:
        parts.append({"val-core/gsm8k/acc/mean@4": rng.random(), "val-aux/gsm8k/reward/std@4": rng.random()})
    return parts


def _same(stored: float, sent: float | int) -> bool:
    """Equal (ints come back as floats), NaN counting as equal to NaN."""
    return stored == sent or (math.isnan(sent) and math.isnan(stored))


def test_resolve_reads_verl_variables_and_stays_plain(tmp_path, monkeypatch):
    """resolve() uses verl's defaults (cloud, ./swanlog made absolute), never carries the API key (it travels
    as Ray actor arguments; the sink reads the key from its own environment), and msgpack can carry it."""
    monkeypatch.chdir(tmp_path)
    run = RunSpec(project="p", experiment="e")
    settings = SwanlabSink.resolve(run, {}, {})
    assert settings == {"mode": "cloud", "logdir": str(tmp_path / "swanlog")}
    settings = SwanlabSink.resolve(run, {"SWANLAB_MODE": "offline", "SWANLAB_API_KEY": API_KEY}, {})
    assert msgpack.unpackb(msgpack.packb(settings)) == settings == {"mode": "offline", "logdir": str(tmp_path / "swanlog")}
    assert API_KEY not in repr(settings)


def test_metrics_round_trip_record_by_record(logdir, sinks):
    """300 steps x ~100 verl keys written in batches come back once per (step, key), NaN and +-Inf kept as sent."""
    sink, state = _open(sinks)
    rng = random.Random(0)
    records = [Metrics(step=s, values=part, time=float(s)) for s in range(STEPS) for part in _step_values(rng, s)]
    for start in range(0, len(records), 17):  # batches cut across steps, as a lane may cut them
        sink.write(records[start:start + 17])
    sink.close(0)

    expected: dict[int, dict] = {}
    for record in records:
        expected.setdefault(record.step, {}).update(record.values)
    back = read_swanlab_run(logdir, run_id=state["id"])
    assert back.duplicates() == []
    assert len(back.points) == sum(len(values) for values in expected.values())
    stored = back.scalars()
    assert sorted(stored) == list(range(STEPS))
    for step, values in expected.items():
        assert stored[step].keys() == values.keys(), step
        bad = [k for k, v in values.items() if not _same(stored[step][k], v)]
        assert bad == [], (step, bad)
    # swanlab's policy, asserted: NaN and +-Inf are stored as given and nothing is skipped.
    assert math.isnan(stored[3]["actor/grad_norm"]) and stored[1]["actor/ppo_kl"] == math.inf
    assert stored[42]["actor/kl_loss"] == -math.inf and sink.counts.cuts == {}
    assert back.status == "FINISHED"


def test_config_once_and_no_secret_anywhere(logdir, sinks, caplog, capfd):
    """The config arrives once with FRAMEWORK set, redacted secrets stay redacted, the API key is written nowhere."""
    sink, state = _open(sinks)
    sink.write([Metrics(step=0, values={"actor/pg_loss": 0.5}, time=0.0)])
    line = sink.where()
    sink.close(0)

    assert state == {"id": "abc123"}
    assert str(logdir) in line and "swanlab sync" in line
    back = read_swanlab_run(logdir, experiment="e")
    assert back.params == {"FRAMEWORK": "tracklane", **plain_config(_config())}
    assert back.params["auth"] == {"wandb_api_key": REDACTED, "hf_token": REDACTED}
    assert len(list(logdir.rglob("config.yaml"))) == 1
    files = [p for p in logdir.parent.rglob("*") if p.is_file()]
    assert files and not (logdir.parent / "home").exists()
    for path in files:
        content = path.read_bytes()
        assert b"sk-secret" not in content, path
        assert API_KEY.encode() not in content, path
    out, err = capfd.readouterr()
    assert API_KEY not in out + err + caplog.text + line + repr(sink.settings)


def test_close_nonzero_marks_run_crashed_once(logdir, sinks):
    """close(1) records a CRASHED finish, and calling close again changes nothing."""
    sink, state = _open(sinks)
    sink.write([Metrics(step=5, values={"actor/pg_loss": 1.0}, time=0.0)])
    sink.close(1)
    sink.close(0)
    back = read_swanlab_run(logdir, run_id=state["id"])
    assert back.status == "CRASHED"
    assert back.points == [(5, "actor/pg_loss", 1.0)]


def test_records_of_one_step_keep_a_keys_first_value(logdir, sinks):
    """Records sharing a step in one batch are a log call each, as verl logs each call: one point per key, the first
    value (swanlab skips a later one at the same step; tests/e2e/test_verl_oracle_trackers.py)."""
    sink, _ = _open(sinks)
    sink.write([
        Metrics(step=1, values={"actor/pg_loss": 1.0}, time=0.0),
        Metrics(step=1, values={"actor/pg_loss": 2.0, "timing_s/gen": 3}, time=0.1),
        Metrics(step=2, values={"actor/pg_loss": 4.0}, time=0.2),
    ])
    sink.close(0)
    points = read_swanlab_run(logdir).points
    assert points == [(1, "actor/pg_loss", 1.0), (1, "timing_s/gen", 3.0), (2, "actor/pg_loss", 4.0)]


def test_one_live_run_per_process(logdir, sinks):
    """A second sink opened while one is live fails with SinkError and the first keeps logging."""
    first, _ = _open(sinks)
    second = SwanlabSink(first.run, SwanlabSink.resolve(first.run, os.environ, {}))
    with pytest.raises(SinkError, match="inactive Run"):
        second.open(None)
    first.write([Metrics(step=0, values={"a": 1.0}, time=0.0)])
    first.close(0)
    assert read_swanlab_run(logdir).points == [(0, "a", 1.0)]


_KILLED_ACTOR = """
import os, sys
sys.path.insert(0, {repo!r})
from tracklane.core.records import Metrics, RunSpec
from tracklane.workers.sinks.swanlab import SwanlabSink
run = RunSpec(project="p", experiment="e", params={{"lr": 0.1}}, run_id="abc123")
sink = SwanlabSink(run, SwanlabSink.resolve(run, os.environ, {{}}))
print(sink.open(None)["id"])
sink.write([Metrics(step=s, values={{"loss": float(s)}}, time=0.0) for s in range(5)])
os._exit(9)  # killed: no close(), no atexit hook
"""


@pytest.mark.slow
def test_resume_in_fresh_process_reuses_the_run_id(logdir, sinks):
    """After the first process dies, open(resume) makes a new segment of the same run id with the full config."""
    killed = subprocess.run([sys.executable, "-c", _KILLED_ACTOR.format(repo=str(REPO))],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 9, killed.stderr
    first_id = killed.stdout.strip().splitlines()[-1]

    sink, state = _open(sinks, params={"lr": 0.1}, resume={"id": first_id})
    sink.write([Metrics(step=s, values={"loss": float(s)}, time=0.0) for s in range(5, 10)])
    sink.close(0)

    assert state == {"id": first_id} == {"id": "abc123"}
    assert len(list(logdir.glob("run-*-abc123"))) == 2  # one folder per init, the same id
    assert {r.run_id for r in list_swanlab_runs(logdir)} == {"abc123"}
    back = read_swanlab_run(logdir, run_id="abc123")
    assert back.params == {"FRAMEWORK": "tracklane", "lr": 0.1}  # not the empty config of a bare init
    assert back.status == "FINISHED"
    # swanlab writes its store through a file buffer flushed only at finish (or every 8 KiB), so
    # the killed process's last records are usually lost; what came after the restart is all there.
    assert [p for p in back.points if p[0] >= 5] == [(s, "loss", float(s)) for s in range(5, 10)]
    assert back.duplicates() == []


_FLUSHED_THEN_KILLED = """
import os, sys, time
sys.path.insert(0, {repo!r})
from tracklane.core.records import Metrics, RunSpec, Text
from tracklane.workers.sinks.swanlab import SwanlabSink
run = RunSpec(project="p", experiment="e", params={{"lr": 0.1}}, run_id="flush1")
sink = SwanlabSink(run, SwanlabSink.resolve(run, os.environ, {{}}))
sink.open(None)
for start in range(0, {steps}, 25):  # several batches, as a lane hands them over
    steps = range(start, start + 25)
    sink.write([Metrics(step=s, values={{"loss": float(s), "acc": s / 1000}}, time=0.0) for s in steps])
    sink.write([Text(step=s, name="note", text=f"step {{s}}", time=0.0) for s in steps if s % 50 == 0])
sink.flush()
print("flushed", flush=True)
time.sleep(300)  # killed by the test long before this ends
"""
FLUSHED_STEPS = 200


def _run_until(script: str, line: str, timeout: float) -> tuple[subprocess.Popen, list[str]]:
    """Start ``script`` and read its output (stderr merged, so no pipe fills up) until ``line``;
    a watchdog kills it if that never comes. Returns the process, still running, and what it printed."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        for out in iter(proc.stdout.readline, ""):
            printed.append(out)
            if out.strip() == line:
                break
    finally:
        watchdog.cancel()
    return proc, printed


def test_flush_is_durable_across_sigkill(logdir):
    """Every step written before flush() is in the store after the process is SIGKILLed right after it
    (no close, no atexit hook): flush() waits for swanlab's consumer thread and empties its file buffer."""
    proc, printed = _run_until(_FLUSHED_THEN_KILLED.format(repo=str(REPO), steps=FLUSHED_STEPS), "flushed", 120)
    try:
        assert printed and printed[-1].strip() == "flushed", "".join(printed)[-3000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # only the child this test started
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    back = read_swanlab_run(logdir, run_id="flush1")
    expected = [(s, key, value) for s in range(FLUSHED_STEPS) for key, value in (("loss", float(s)), ("acc", s / 1000))]
    assert sorted(back.points) == sorted(expected)
    assert back.duplicates() == [] and back.status is None  # no finish record: it was killed
    assert read_swanlab_media(logdir, run_id="flush1").texts("note") == {s: f"step {s}" for s in range(0, FLUSHED_STEPS, 50)}


def test_hardware_monitor_is_off(logdir):
    """swanlab's hardware monitor is disabled in every mode: its thread would write into the run store
    beside the consumer thread, and swanlab 0.10.3's store writer has no lock (README, Known issues)."""
    import swanlab

    for mode in ("offline", "cloud"):  # the fixture sets SWANLAB_API_KEY: the cloud branch passes it on
        run = RunSpec(project="p", experiment="e")
        settings = SwanlabSink(run, SwanlabSink.resolve(run, {"SWANLAB_MODE": mode}, {}))._sdk_settings(swanlab)
        assert settings.probe.monitor is False and settings.interactive is False, mode
