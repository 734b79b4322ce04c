"""TrackioSink against the real trackio SDK (0.43), a local store under tmp_path, read back through trackio."""

from __future__ import annotations

import io
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from itertools import groupby
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("trackio")
from PIL import Image as PILImage

from tests.conftest import same_value, verl_metrics
from tracklane.core.errors import ConfigError, SinkError
from tracklane.core.histogram import histogram_figures
from tracklane.core.params import REDACTED, plain_config
from tracklane.core.records import Artifact, Generations, Histogram, Image, Metrics, RunSpec, Text, Trajectories, Trajectory
from tracklane.workers.sinks.trackio import EXIT_ALERT_TITLE, REMOTE_VARIABLES, TrackioSink
from tracklane.workers.testing.readers.trackio_reader import list_trackio_runs, read_trackio_run

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_token-must-not-leak-0123456789"
STEPS = 300
T0 = 1_750_000_000.0  # records' wall-clock times: far from "now", so a stamp of trackio's own would show


@pytest.fixture
def store(offline_trackers, tmp_path, monkeypatch):
    """The conftest's TRACKIO_DIR, and everything else trackio could reach moved into tmp_path: home, HF cache,
    cwd; no Space/server/bucket variable; an HF token set (it must be used and written nowhere)."""
    for name in (*REMOTE_VARIABLES, "TRACKIO_TRACE_SESSIONS_DIR", "TRACKIO_STORAGE_MODE", "SYSTEM"):
        monkeypatch.delenv(name, raising=False)
    for name, folder in {"HOME": "home", "HF_HOME": "hf-home", "XDG_CACHE_HOME": "xdg-cache"}.items():
        (tmp_path / folder).mkdir()
        monkeypatch.setenv(name, str(tmp_path / folder))
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return offline_trackers["trackio"]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every socket connect and name lookup during a test fails and is recorded: none may happen."""
    attempts: list[object] = []

    def refuse(*args, **kwargs):
        attempts.append(args[1:] if args and isinstance(args[0], socket.socket) else args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield attempts
    assert attempts == []


def _config() -> dict:
    return {
        "trainer": {"project_name": "p", "experiment_name": "e", "logger": ["console", "trackio"]},
        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "_target_": "verl.workers.config.ActorConfig"}},
        "auth": {"wandb_api_key": "sk-secret", "hf_token": "sk-secret"},
    }


def _sink(run_id: str = "abc123", params: dict | None = None, resume: bool = False) -> TrackioSink:
    run = RunSpec(project="p", experiment="e", params=plain_config(params or _config()), run_id=run_id, resume=resume)
    return TrackioSink(run, TrackioSink.resolve(run, os.environ, {}))


def _metric_records(steps: range, seed: int = 0) -> list[Metrics]:
    """verl-shaped steps, each as two records (training, then timing), with NaN, +-Inf and ints among them."""
    rng = random.Random(seed)
    records = []
    for step in steps:
        values = {k: (v if isinstance(v, int) else float(v)) for k, v in verl_metrics(step).items()}
        values["actor/ppo_kl"] = math.inf if step % 50 == 1 else rng.uniform(-1, 1)
        values["actor/kl_loss"] = -math.inf if step == 42 else rng.uniform(-1, 1)
        timing = {k: values.pop(k) for k in list(values) if k.startswith("timing")}
        records += [Metrics(step=step, values=values, time=T0 + step + 0.123456),
                    Metrics(step=step, values=timing, time=T0 + step + 0.5)]
    return records


def _expected(records: list[Metrics]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for record in records:
        out.setdefault(record.step, {}).update(record.values)
    return out


def _write_batches(sink: TrackioSink, records: list, size: int, first_seq: int = 1) -> None:
    """As a lane writes: batches cut across steps, each announced with begin_batch."""
    for seq, start in enumerate(range(0, len(records), size), start=first_seq):
        batch = records[start:start + size]
        sink.begin_batch("", seq, batch)
        sink.write(batch)


def test_resolve_gives_an_absolute_store_folder_and_no_secret(tmp_path, monkeypatch):
    """resolve() makes TRACKIO_DIR absolute (the actor may have another cwd), falls back to $HF_HOME/trackio as
    trackio does, never carries the HF token, and msgpack can carry what it returns."""
    monkeypatch.chdir(tmp_path)
    run = RunSpec(project="p", experiment="e")
    settings = TrackioSink.resolve(run, {"TRACKIO_DIR": "store", "HF_TOKEN": HF_TOKEN}, {})
    assert msgpack.unpackb(msgpack.packb(settings)) == settings == {"dir": str(tmp_path / "store")}
    assert HF_TOKEN not in repr(settings)
    assert TrackioSink.resolve(run, {"HF_HOME": "hf"}, {}) == {"dir": str(tmp_path / "hf" / "trackio")}
    assert TrackioSink.resolve(run, {"XDG_CACHE_HOME": "/c"}, {}) == {"dir": "/c/huggingface/trackio"}


@pytest.mark.parametrize("variable", REMOTE_VARIABLES)
def test_remote_variables_are_refused(store, monkeypatch, variable):
    """A Space, server, bucket or dataset variable is refused: by resolve() (ConfigError naming it) and by
    open() in a process that has it (SinkError), before anything is written."""
    run = RunSpec(project="p", experiment="e")
    with pytest.raises(ConfigError, match=variable):
        TrackioSink.resolve(run, {variable: "user/space"}, {})
    sink = _sink()
    monkeypatch.setenv(variable, "user/space")
    with pytest.raises(SinkError, match=variable):
        sink.open(None)
    assert not store.exists() or not any(store.iterdir())


def test_metrics_round_trip_record_by_record(store):
    """300 steps of verl metrics in batches cut across steps come back once per (step, key), equal (NaN, +-Inf
    and ints kept), stamped with their own records' time, and the run closes with exit code 0."""
    records = _metric_records(range(STEPS))
    sink = _sink()
    state = sink.open(None)
    _write_batches(sink, records, 17)
    sink.flush()
    sink.close(0)

    expected = _expected(records)
    back = read_trackio_run(store, "p", run_id=state["id"])
    assert state == {"id": "abc123"} and back.name == "e"
    assert back.duplicates() == []
    assert len(back.points) == sum(len(values) for values in expected.values())
    stored = back.scalars()
    assert sorted(stored) == list(range(STEPS))
    for step, values in expected.items():
        assert stored[step].keys() == values.keys(), step
        bad = [k for k, v in values.items() if not same_value(stored[step][k], v)]
        assert bad == [], (step, bad)
    assert isinstance(stored[7]["training/global_step"], int) and stored[7]["training/global_step"] == 7
    assert math.isnan(stored[0]["actor/pg_clipfrac"]) and stored[1]["actor/ppo_kl"] == math.inf
    assert stored[42]["actor/kl_loss"] == -math.inf
    # A row is a step's records within one batch, stamped with the last one's time (microseconds kept).
    times, split = back.point_times(), 0
    for start in range(0, len(records), 17):
        for step, group in groupby(records[start:start + 17], key=lambda r: r.step):
            rows = list(group)
            split += len(rows) == 1
            assert all(abs(times[(step, key)] - rows[-1].time) < 1e-6 for r in rows for key in r.values), step
    assert split > 0 and abs(times[(0, "actor/pg_loss")] - (T0 + 0.5)) < 1e-6
    assert back.status == "exit_code=0" and sink.counts.cuts == {} and sink.counts.unsupported == {}


def test_config_once_without_secrets_and_nothing_outside_the_store(store, tmp_path, capfd, caplog):
    """The config is the redacted params (a top-level "_" key renamed, trackio's own keys added), no secret and
    no HF token is written anywhere, and nothing lands outside TRACKIO_DIR (home, HF cache, cwd stay empty)."""
    params = {**_config(), "_private": 1}
    sink = _sink(params=params)
    sink.open(None)
    sink.write([Metrics(step=0, values={"actor/pg_loss": 0.5}, time=T0)])
    line = sink.where()
    sink.close(0)

    back = read_trackio_run(store, "p", run_id="abc123")
    expected = plain_config(params)
    expected["cfg_private"] = expected.pop("_private")
    assert back.params == expected
    assert back.params["auth"] == {"wandb_api_key": REDACTED, "hf_token": REDACTED}
    assert back.config["_Username"] is None and back.config["_Group"] is None and back.config["_Created"]
    assert str(store) in line and "trackio show --project p" in line
    for folder in ("home", "hf-home", "xdg-cache", "cwd"):
        assert list((tmp_path / folder).rglob("*")) == [], folder
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and [p for p in written if not p.is_relative_to(store)] == []
    assert not [p for p in store.iterdir() if p.name.startswith(".tracklane-staging-")]
    for path in written:
        content = path.read_bytes()
        assert b"sk-secret" not in content and HF_TOKEN.encode() not in content, path
    out, err = capfd.readouterr()
    assert HF_TOKEN not in out + err + caplog.text + line + repr(sink.settings)


def test_close_nonzero_records_a_failure_once(store):
    """close(1) stores an error alert "exit code 1" (trackio keeps no run status); a second close and a later
    write change nothing (the write raises SinkError)."""
    sink = _sink()
    sink.open(None)
    sink.write([Metrics(step=5, values={"actor/pg_loss": 1.0}, time=T0)])
    sink.close(1)
    sink.close(0)
    with pytest.raises(SinkError, match="after close"):
        sink.write([Metrics(step=6, values={"actor/pg_loss": 2.0}, time=T0)])
    back = read_trackio_run(store, "p")
    assert back.status == "exit_code=1"
    assert [(a["title"], a["text"], a["level"], a["step"]) for a in back.alerts] == \
        [(EXIT_ALERT_TITLE, "exit code 1", "error", 5)]
    assert back.points == [(5, "actor/pg_loss", 1.0)]


def _rich_batch(step: int) -> list:
    return [Metrics(step=step, values={"actor/pg_loss": float(step)}, time=T0 + step),
            Generations(step=step, samples=[["q", "a", 1.0], ["q2", "a2", 0.0]], time=T0 + step),
            Histogram(step=step, name="rewards", values=np.arange(10.0).astype("<f8").tobytes(), time=T0 + step),
            Text(step=step, name="notes", text=f"step {step}", time=T0 + step)]


def test_restarted_actor_reattaches_and_a_resent_batch_lands_once(store):
    """A new sink opened with the first's state (an actor restart, same process) writes to the same run, keeps its
    config as first stored, and the unacknowledged batch sent again (points, traces, histogram, text) lands once."""
    first = _sink()
    state = first.open(None)
    batch1 = _metric_records(range(0, 3)) + _rich_batch(3)
    _write_batches(first, batch1, len(batch1))
    created = read_trackio_run(store, "p").config["_Created"]
    # The actor dies without close(); its successor gets batch 1 again (never acknowledged), then batch 2.
    second = _sink()
    assert second.open(state) == state
    _write_batches(second, batch1, len(batch1))
    batch2 = _metric_records(range(4, 8)) + _rich_batch(8)
    _write_batches(second, batch2, len(batch2), first_seq=2)
    second.close(0)

    assert [(r.run_id, r.name) for r in list_trackio_runs(store, "p")] == [("abc123", "e")]
    back = read_trackio_run(store, "p")
    assert back.duplicates() == []
    assert sorted(back.scalars()) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert back.config["_Created"] == created and back.params == plain_config(_config())
    assert {step: len(traces) for step, traces in back.traces["val/generations"].items()} == {3: 2, 8: 2}
    assert sorted(back.histograms("rewards")) == [3, 8] and back.texts("notes") == {3: "step 3", 8: "step 8"}
    assert back.status == "exit_code=0"


def test_resumed_training_continues_the_run_by_id(store):
    """A later process resuming run "abc123" (RunSpec.resume, numbering its batches from 1 again, new times)
    appends to the same trackio run: nothing of it is taken for a re-sent batch."""
    first = _sink()
    first.open(None)
    _write_batches(first, [Metrics(step=s, values={"loss": float(s)}, time=T0 + s) for s in range(5)], 5)
    first.close(0)
    resumed = _sink(resume=True)
    assert resumed.open(None) == {"id": "abc123"}
    _write_batches(resumed, [Metrics(step=s, values={"loss": float(s)}, time=T0 + 100 + s) for s in range(5, 10)], 5)
    resumed.close(0)
    back = read_trackio_run(store, "p", run_id="abc123")
    assert back.points == [(s, "loss", float(s)) for s in range(10)]
    assert len(list_trackio_runs(store, "p")) == 1


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def test_generations_and_trajectories_are_traces(store):
    """Generations come back as verl's traces (user/assistant, source, sample_index running on across records of
    a key, score NaN kept); trajectories as traces with their messages, tool calls as spans, rewards and meta."""
    sink = _sink()
    sink.open(None)
    trajectory = Trajectory(messages=[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                            tool_calls=[{"name": "calc", "arguments": '{"x": "2+2"}', "result": "4", "latency_s": 0.25,
                                         "ok": True}],
                            rewards={"score": 1.0, "format": 0.5}, token_ids=np.arange(7, dtype="<i4").tobytes(),
                            meta={"sample_index": 3, "rollout_index": 1, "validation": False, "env": "math"})
    sink.write([Generations(step=2, samples=[["héllo 中文", "", math.nan], ["q", "out", 1.0]], time=T0),
                Generations(step=2, samples=[["q3", "a3", -0.5]], time=T0),
                Generations(step=4, samples=[], time=T0),
                Trajectories(step=2, trajectories=[trajectory, Trajectory()], time=T0)])
    sink.close(0)

    back = read_trackio_run(store, "p")
    generations = back.traces["val/generations"]
    assert sorted(generations) == [2]  # a step with no samples logs nothing
    got = [(t["messages"], t["metadata"]["sample_index"], t["metadata"]["score"]) for t in generations[2]]
    want = [("héllo 中文", "", math.nan), ("q", "out", 1.0), ("q3", "a3", -0.5)]
    assert len(got) == len(want)
    for index, ((messages, sample_index, score), (text_in, text_out, sent)) in enumerate(zip(got, want, strict=True)):
        assert messages == [{"role": "user", "content": text_in}, {"role": "assistant", "content": text_out}]
        assert sample_index == index and same_value(score, sent)
    assert {t["metadata"]["source"] for t in generations[2]} == {"validation_generations"}

    full, empty = back.traces["rollout/trajectories"][2]
    assert full["messages"] == trajectory.messages
    assert full["spans"] == [{"id": "tool-0", "name": "calc", "kind": "tool", "input": '{"x": "2+2"}', "output": "4",
                              "duration_ms": 250.0, "metadata": {"ok": True}}]
    assert full["metadata"] == {"source": "rollout_trajectories", "sample_index": 3, "rollout_index": 1,
                                "validation": False, "score": 1.0, "rewards": {"score": 1.0, "format": 0.5},
                                "num_tokens": 7, "meta": {"env": "math"}}
    assert empty["messages"] == [] and empty["spans"] == [] and math.isnan(empty["metadata"]["score"])


def test_histogram_text_image_and_artifacts_arrive_as_sent(store, tmp_path):
    """Histograms keep the shared bins of the finite values (non-finite ones counted; none finite: nothing), text
    is exact markdown, images are the PNG bytes (pixels equal), artifacts are trackio artifact versions whose
    files equal the sources; a missing artifact file is counted and nothing is unsupported."""
    values = np.concatenate([np.linspace(-3, 3, 101), [math.nan, math.inf]])
    image = np.random.default_rng(0).integers(0, 255, size=(6, 5, 4), dtype=np.uint8)
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "model.bin").write_bytes(b"\x00weights")
    (checkpoint / "sub" / "opt.txt").write_text("optim")
    text = "# step 1\n| a | b |\n|---|---|\n| 1 | ünï |"
    sink = _sink()
    sink.open(None)
    sink.write([Histogram(step=1, name="critic/rewards", values=values.astype("<f8").tobytes(), time=T0),
                Histogram(step=2, name="critic/rewards", values=np.array([math.nan]).tobytes(), time=T0),
                Text(step=1, name="notes", text=text, time=T0),
                Image(step=1, name="samples/picture", png=png(image), time=T0),
                Artifact(step=10, path=str(checkpoint), name="actor ckpt/10", type="checkpoint", time=T0),
                Artifact(step=10, path=str(checkpoint / "model.bin"), name="weights", type="model", time=T0),
                Artifact(step=10, path=str(tmp_path / "gone.bin"), name="gone", type="model", time=T0)])
    sink.close(0)

    back = read_trackio_run(store, "p")
    figures = histogram_figures(values)
    assert back.histograms("critic/rewards") == {1: (figures.bin_edges, figures.counts)}
    assert sink.counts.cuts == {"histogram_nonfinite": 3} and sink.counts.artifacts_missing == 1
    assert back.texts("notes") == {1: text}
    (stored_image,) = back.images("samples/picture").values()
    assert stored_image.read_bytes() == png(image) and stored_image.is_relative_to(store)
    assert np.array_equal(np.asarray(PILImage.open(stored_image)), image)
    artifacts = {a.name: a for a in back.artifacts}
    assert sorted(artifacts) == ["actor-ckpt-10", "weights"]
    ckpt = artifacts["actor-ckpt-10"]
    assert (ckpt.type, ckpt.version, ckpt.aliases) == ("checkpoint", 0, ["latest", "step-10"])
    assert ckpt.metadata == {"step": 10, "source": str(checkpoint)}
    assert {name: path.read_bytes() for name, path in ckpt.files.items()} == \
        {"model.bin": b"\x00weights", "sub/opt.txt": b"optim"}
    assert {name: path.read_bytes() for name, path in artifacts["weights"].files.items()} == {"model.bin": b"\x00weights"}
    assert sink.counts.unsupported == {} and sink.counts.failed_records == 0


def test_other_axes_keep_their_steps(store):
    """System metrics (axis system/elapsed_s) go to trackio's system metrics with their time; a producer's axis
    is the row's step and a key of its row (the dashboard's X-axis menu offers it); the trainer's rows are apart."""
    sink = _sink()
    sink.open(None)
    sink.write([Metrics(step=0, values={"actor/pg_loss": 1.0}, time=T0),
                Metrics(step=10, values={"system/node/cpu_percent": 50.0}, time=T0 + 10, axis="system/elapsed_s"),
                Metrics(step=20, values={"system/node/cpu_percent": 70.0}, time=T0 + 20, axis="system/elapsed_s"),
                Metrics(step=3, values={"rollout/reward": 0.5}, time=T0 + 30, axis="rollout/step")])
    sink.close(0)
    back = read_trackio_run(store, "p")
    assert sorted(back.points) == [(0, "actor/pg_loss", 1.0), (3, "rollout/reward", 0.5), (3, "rollout/step", 3)]
    assert back.system == [(T0 + 10, "system/node/cpu_percent", 50.0), (T0 + 10, "system/elapsed_s", 10),
                           (T0 + 20, "system/node/cpu_percent", 70.0), (T0 + 20, "system/elapsed_s", 20)]


def test_reserved_keys_are_renamed_as_trackio_renames_them(store):
    """Keys trackio reserves for its own columns ("step", "time", "__x") are stored with "__" in front, as
    trackio.log stores them, and do not clobber the row's step."""
    sink = _sink()
    sink.open(None)
    sink.write([Metrics(step=4, values={"step": 99, "time": 1.5, "__x": 2.0, "loss": 0.1}, time=T0)])
    sink.close(0)
    assert sorted(read_trackio_run(store, "p").points) == \
        [(4, "____x", 2.0), (4, "__step", 99), (4, "__time", 1.5), (4, "loss", 0.1)]


def test_two_stores_in_one_process_stay_apart(store, tmp_path):
    """trackio reads TRACKIO_DIR once at import; two sinks on two folders in one process (and a reader of one
    between their writes) each write only into their own folder."""
    other_dir = tmp_path / "other-trackio"
    here = _sink()
    run = RunSpec(project="p", experiment="e2", run_id="xyz")
    there = TrackioSink(run, TrackioSink.resolve(run, {"TRACKIO_DIR": str(other_dir)}, {}))
    here.open(None)
    there.open(None)
    for step in range(3):
        here.write([Metrics(step=step, values={"here": float(step)}, time=T0 + step)])
        read_trackio_run(store, "p")
        there.write([Metrics(step=step, values={"there": float(step)}, time=T0 + step)])
    here.close(0)
    there.close(0)
    assert read_trackio_run(store, "p").points == [(s, "here", float(s)) for s in range(3)]
    assert read_trackio_run(other_dir, "p").points == [(s, "there", float(s)) for s in range(3)]


_FLUSHED_THEN_KILLED = """
import socket, sys, time
blocked = []
def refuse(*args, **kwargs):
    blocked.append(args[1:])
    raise OSError("network disabled")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.getaddrinfo = lambda *args, **kwargs: refuse(None, *args)
sys.path.insert(0, {repo!r})
import os, threading
from tracklane.core.records import Metrics, RunSpec, Text
from tracklane.workers.sinks.trackio import TrackioSink
run = RunSpec(project="p", experiment="e", params={{"lr": 0.1}}, run_id="flush1")
sink = TrackioSink(run, TrackioSink.resolve(run, os.environ, {{}}))
sink.open(None)
for seq, start in enumerate(range(0, {steps}, 25), start=1):
    batch = [Metrics(step=s, values={{"loss": float(s), "acc": s / 1000}}, time=1.7e9 + s) for s in range(start, start + 25)]
    batch += [Text(step=s, name="note", text=f"step {{s}}", time=1.7e9 + s) for s in range(start, start + 25) if s % 50 == 0]
    sink.begin_batch("", seq, batch)
    sink.write(batch)
sink.flush()
print("flushed", len(blocked), threading.active_count(), flush=True)
time.sleep(300)  # killed by the test long before this ends
"""
FLUSHED_STEPS = 200


def _run_until(script: str, prefix: str, timeout: float) -> tuple[subprocess.Popen, list[str]]:
    """Start ``script`` and read its output (stderr merged) until a line starting with ``prefix``; a watchdog
    kills it if that never comes. Returns the process, still running, and what it printed."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        for out in iter(proc.stdout.readline, ""):
            printed.append(out)
            if out.startswith(prefix):
                break
    finally:
        watchdog.cancel()
    return proc, printed


def test_flush_is_durable_across_sigkill_and_the_process_stays_offline(store):
    """Everything written before flush() is in the store after the writing process is SIGKILLed right after it
    (no close); that process made no network attempt from `import trackio` on and ran no thread of trackio's."""
    proc, printed = _run_until(_FLUSHED_THEN_KILLED.format(repo=str(REPO), steps=FLUSHED_STEPS), "flushed", 120)
    try:
        assert printed and printed[-1].split() == ["flushed", "0", "1"], "".join(printed)[-3000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # only the child this test started
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    back = read_trackio_run(store, "p", run_id="flush1")
    expected = [(s, key, value) for s in range(FLUSHED_STEPS) for key, value in (("loss", float(s)), ("acc", s / 1000))]
    assert sorted(back.points) == sorted(expected) and back.duplicates() == []
    assert back.texts("note") == {s: f"step {s}" for s in range(0, FLUSHED_STEPS, 50)}
    assert back.params == {"lr": 0.1} and back.status is None  # no close: no exit alert
