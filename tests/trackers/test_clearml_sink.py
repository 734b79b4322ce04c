"""ClearmlSink against the real clearml SDK in offline mode, read back from the session folder ClearML wrote.

Everything stays under tmp_path (the ``clearml_env`` fixture: HOME, CLEARML_CONFIG_FILE, CLEARML_CACHE_DIR,
CLEARML_OFFLINE_MODE); ``test_no_server_no_process_nothing_outside_tmp`` watches a whole sink life with an
audit hook to show that nothing reaches the network, forks, or writes elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("clearml")

from tests.conftest import same_value, verl_metrics
from tests.rich_setup import (
    GENERATION_STEPS,
    RUN_ID,
    assert_generation_tables,
    assert_trajectory_tables,
    media,
    png,
    write_artifacts,
    write_generations,
    write_trajectories,
)
from tracklane.core.errors import SinkError
from tracklane.core.params import REDACTED, plain_config
from tracklane.core.records import Image, Metrics, RunSpec
from tracklane.workers.sinks.clearml import CONFIG_NAME, ClearmlSink
from tracklane.workers.sinks.media import GENERATION_COLUMNS
from tracklane.workers.testing.readers.clearml_reader import read_clearml_run, read_clearml_session

# clearml 2.1.12 bundles a pyhocon that calls pyparsing's old names: ~25 warnings per config it reads or writes.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:clearml.utilities.pyhocon.config_parser",
                                        "ignore:'parseAll' argument is deprecated:DeprecationWarning")
REPO = Path(__file__).resolve().parents[2]
SECRET_KEY = "clearml-secret-must-not-leak-0123456789"
STEPS = 300
# Variables that would send ClearML to a server, make it think an agent runs it, or shift iterations.
_CLEARML_UNSET = ("CLEARML_API_HOST", "CLEARML_WEB_HOST", "CLEARML_FILES_HOST", "CLEARML_API_ACCESS_KEY",
                  "CLEARML_AUTH_TOKEN", "CLEARML_TASK_ID", "CLEARML_PROC_MASTER_ID", "CLEARML_SET_ITERATION_OFFSET",
                  "CLEARML_DEFERRED_TASK_INIT", "CLEARML_LOG_ENVIRONMENT", "TRAINS_PROC_MASTER_ID", "TRAINS_TASK_ID")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Offline ClearML writing only under tmp_path: its cache (offline sessions), config file lookup, home."""
    env = {"HOME": tmp_path / "home", "CLEARML_CONFIG_FILE": tmp_path / "clearml.conf",
           "CLEARML_CACHE_DIR": tmp_path / "clearml-cache", "CLEARML_OFFLINE_MODE": "1",
           "CLEARML_API_SECRET_KEY": SECRET_KEY}  # present but unused offline: must be written nowhere
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    for key in _CLEARML_UNSET:
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "clearml-cache"


@pytest.fixture
def sinks(cache):
    """Sinks opened by a test, closed afterwards even if it fails: ClearML allows one main task per process."""
    opened: list[ClearmlSink] = []
    yield opened
    for sink in opened:
        sink.close(1)


def _config() -> dict:
    return {
        "trainer": {"project_name": "p", "experiment_name": "e", "total_epochs": 3, "logger": ["console", "clearml"]},
        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "ppo_mini_batch_size": 256}},
        "data": {"max_prompt_length": 512, "train_files": "/data/gsm8k/train.parquet"},
        "auth": {"wandb_api_key": "sk-secret", "hf_token": "sk-secret"},
    }


def _open(sinks: list, params: dict | None = None, resume: dict | None = None, run_id: str = "abc123",
          resumed: bool = False) -> tuple[ClearmlSink, dict]:
    run = RunSpec(project="p", experiment="e", params=plain_config(params or _config()), run_id=run_id, resume=resumed)
    sink = ClearmlSink(run, ClearmlSink.resolve(run, os.environ, {}))
    sinks.append(sink)
    return sink, sink.open(resume)


def _plain(values: dict) -> dict:
    """verl's dict as ``Tracking`` hands it over: plain Python numbers."""
    return {key: float(value) if isinstance(value, np.floating) else value for key, value in values.items()}


# -- settings ---------------------------------------------------------------------------------
def test_resolve_is_offline_unless_a_server_is_configured(tmp_path):
    """Offline with no server configured; online for an API host, a key or a config file with credentials;
    CLEARML_OFFLINE_MODE overrides both; the settings hold no secret and pass through msgpack."""
    run = RunSpec(project="p", experiment="e")
    bare = {"HOME": str(tmp_path), "CLEARML_CONFIG_FILE": str(tmp_path / "none.conf")}
    assert ClearmlSink.resolve(run, bare, {}) == {"offline": True, "cache_dir": "",
                                                  "config_file": str(tmp_path / "none.conf")}
    assert ClearmlSink.resolve(run, {**bare, "CLEARML_API_HOST": "http://127.0.0.1:8008"}, {})["offline"] is False
    assert ClearmlSink.resolve(run, {**bare, "CLEARML_API_ACCESS_KEY": "k"}, {})["offline"] is False
    for flag, offline in (("1", True), ("true", True), ("0", False), ("off", False)):
        env = {**bare, "CLEARML_API_HOST": "http://127.0.0.1:8008", "CLEARML_OFFLINE_MODE": flag}
        assert ClearmlSink.resolve(run, env, {})["offline"] is offline, flag
    conf = tmp_path / "clearml.conf"
    conf.write_text("sdk { development { worker { report_period_sec: 5 } } }\n", encoding="utf-8")
    assert ClearmlSink.resolve(run, {"HOME": str(tmp_path)}, {})["offline"] is True  # a config without a server
    conf.write_text('api { credentials { access_key: "k", secret_key: "' + SECRET_KEY + '" } }\n', encoding="utf-8")
    assert ClearmlSink.resolve(run, {"HOME": str(tmp_path)}, {})["offline"] is False
    env = {"HOME": str(tmp_path / "none"), "CLEARML_CACHE_DIR": "rel/cache", "CLEARML_CONFIG_FILE": "rel/c.conf",
           "CLEARML_API_SECRET_KEY": SECRET_KEY}
    settings = ClearmlSink.resolve(run, env, {})
    assert settings == {"offline": True, "cache_dir": os.path.abspath("rel/cache"),
                        "config_file": os.path.abspath("rel/c.conf")}
    assert msgpack.unpackb(msgpack.packb(settings)) == settings and SECRET_KEY not in repr(settings)


# -- metrics -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_300_verl_steps_round_trip_record_by_record(cache, sinks):
    """300 verl-shaped steps in batches cut across steps come back once per (step, key) with the value sent;
    NaN is skipped and counted (ClearML would chart it as 0.0); events carry ClearML's report time."""
    sink, state = _open(sinks)
    records = [Metrics(step=s, values=_plain(verl_metrics(s)), time=0.0) for s in range(STEPS)]
    started_ms = time.time() * 1000
    for start in range(0, len(records), 7):
        sink.write(records[start:start + 7])
    sink.flush()
    flushed_ms = time.time() * 1000
    sink.close(0)

    expected = {(r.step, k): float(v) for r in records for k, v in r.values.items() if math.isfinite(v)}
    back = read_clearml_run(cache, task_id=state["task_id"])
    assert back.duplicates() == []
    stored = {(step, key): value for step, key, value in back.points}
    assert stored.keys() == expected.keys()
    assert [k for k, v in expected.items() if not same_value(stored[k], v)] == []
    nans = sum(1 for r in records for v in r.values.values() if not math.isfinite(v))
    assert nans == len(range(0, STEPS, 7)) and sink.counts.cuts == {"scalar_nonfinite": nans}
    # verl's split at the first "/": title and series as ClearML shows them.
    names = {(e.title, e.series) for e in back.scalar_events}
    assert ("actor", "pg_loss") in names and ("val-core", "gsm8k/acc/mean@4") in names
    # The record's time (0.0 here) is not kept: ClearML stamps each event when it is reported.
    assert all(started_ms - 1000 <= e.timestamp <= flushed_ms + 1000 for e in back.scalar_events)
    assert back.exit_code == 0 and back.name == "e" and back.project == "p"


def test_keys_without_slash_axis_records_and_a_name_clash(cache, sinks):
    """A key without "/" is its own title and series; a producer's axis keeps its step as the iteration; a key
    that would land on another key's graph line is skipped and counted; records of one step merge, later wins."""
    sink, state = _open(sinks)
    sink.write([
        Metrics(step=1, values={"loss": 1.0, "a/b/c": 2.0}, time=0.0),
        Metrics(step=1, values={"loss": 1.5}, time=0.0),
        Metrics(step=7, values={"system/cpu_percent": 30.0}, time=0.0, axis="system/elapsed_s"),
        Metrics(step=2, values={"loss/loss": 9.0, "loss": 2.0}, time=0.0),
    ])
    sink.close(0)
    back = read_clearml_run(cache, task_id=state["task_id"])
    assert sorted(back.points) == [(1, "a/b/c", 2.0), (1, "loss", 1.5), (2, "loss", 2.0), (7, "system/cpu_percent", 30.0)]
    assert {(e.title, e.series) for e in back.scalar_events} == {("loss", "loss"), ("a", "b/c"), ("system", "cpu_percent")}
    assert sink.counts.cuts == {"scalar_name_clash": 1}


def test_config_once_and_no_secret_anywhere(cache, sinks, caplog, capfd, tmp_path):
    """The config is stored once as verl's "Hyperparameters" object, redacted secrets stay redacted, and the
    ClearML secret key in the environment is written nowhere."""
    sink, state = _open(sinks)
    sink.write([Metrics(step=0, values={"actor/pg_loss": 0.5}, time=0.0)])
    line = sink.where()
    sink.close(0)

    assert list(state) == ["task_id"] and state["task_id"].startswith("offline-")
    assert "offline task" in line and str(cache) in line and "clearml-task --import-offline-session" in line
    back = read_clearml_run(cache, run_id="abc123")
    assert back.params == plain_config(_config())
    assert back.params["auth"] == {"wandb_api_key": REDACTED, "hf_token": REDACTED}
    assert back.configuration_types == {CONFIG_NAME: "dictionary"}
    assert "tracklane.run_id:abc123" in back.tags
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "task.json" for p in files)
    for path in files:
        content = path.read_bytes()
        assert b"sk-secret" not in content, path
        assert SECRET_KEY.encode() not in content, path
    out, err = capfd.readouterr()
    assert SECRET_KEY not in out + err + caplog.text + line + repr(sink.settings)


def test_close_tags_exit_code_once_and_the_zip_reads_the_same(cache, sinks):
    """close(1) tags exit code 1 (offline ClearML keeps no status), a second close changes nothing, and the zip
    ClearML writes at close holds the same task as the folder."""
    sink, state = _open(sinks)
    sink.write([Metrics(step=5, values={"actor/pg_loss": 1.0}, time=0.0)])
    sink.close(1)
    sink.close(0)
    back = read_clearml_run(cache, task_id=state["task_id"])
    assert back.exit_code == 1 and back.status is None  # offline: no status change reaches task.json
    assert back.points == [(5, "actor/pg_loss", 1.0)]
    zipped = read_clearml_session(str(back.folder) + ".zip")
    assert (zipped.points, zipped.params, zipped.tags) == (back.points, back.params, back.tags)


def test_reopen_in_one_process_and_one_task_at_a_time(cache, sinks):
    """After close a new sink opens a new task in the same process; while one is open a second fails clearly."""
    first, one = _open(sinks, run_id="one")
    second = ClearmlSink(first.run, ClearmlSink.resolve(first.run, os.environ, {}))
    with pytest.raises(SinkError, match="one main task per process"):
        second.open(None)
    first.write([Metrics(step=0, values={"a/x": 1.0}, time=0.0)])
    first.close(0)
    third, two = _open(sinks, run_id="two")
    third.write([Metrics(step=0, values={"a/x": 2.0}, time=0.0)])
    third.close(0)
    assert one != two
    assert read_clearml_run(cache, run_id="one").points == [(0, "a/x", 1.0)]
    assert read_clearml_run(cache, run_id="two").points == [(0, "a/x", 2.0)]
    assert "CLEARML_PROC_MASTER_ID" not in os.environ  # close() leaves no marker for child processes


def test_an_inherited_master_marker_does_not_make_a_stub(cache, sinks, monkeypatch):
    """A CLEARML_PROC_MASTER_ID inherited from another process (which makes Task.init return a do-nothing
    stub) is dropped: the sink gets a real task and its metrics arrive."""
    monkeypatch.setenv("CLEARML_PROC_MASTER_ID", "1:")
    sink, state = _open(sinks)
    sink.write([Metrics(step=3, values={"a/x": 3.0}, time=0.0)])
    sink.close(0)
    assert read_clearml_run(cache, task_id=state["task_id"]).points == [(3, "a/x", 3.0)]


# -- resume ------------------------------------------------------------------------------------
_KILLED_ACTOR = """
import io, json, os, sys
sys.path.insert(0, {repo!r})
import numpy as np
from PIL import Image
from tracklane.core.records import Image as ImageRecord, Metrics, RunSpec
from tracklane.workers.sinks.clearml import ClearmlSink
run = RunSpec(project="p", experiment="e", params={{"lr": 0.1}}, run_id="abc123")
sink = ClearmlSink(run, ClearmlSink.resolve(run, os.environ, {{}}))
state = sink.open(None)
buf = io.BytesIO(); Image.fromarray(np.full((3, 4, 3), 7, dtype=np.uint8)).save(buf, format="PNG")
sink.write([Metrics(step=s, values={{"train/loss": float(s)}}, time=0.0) for s in range(5)])
sink.write([ImageRecord(step=4, name="samples/picture", png=buf.getvalue(), time=0.0)])
sink.flush()  # batches up to here acknowledged
mark = sink.mark([])
sink.write([Metrics(step=s, values={{"train/loss": float(s)}}, time=0.0) for s in range(5, 7)])
sink.flush()  # this batch was written but the actor dies before acknowledging it
print(json.dumps({{"state": state, "mark": mark}}), flush=True)
os._exit(9)  # killed: no close(), no atexit hook
"""


def _killed_actor() -> dict:
    killed = subprocess.run([sys.executable, "-c", _KILLED_ACTOR.format(repo=str(REPO))],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == 9, killed.stderr[-3000:]
    return json.loads(killed.stdout.strip().splitlines()[-1])


def test_restarted_actor_reattaches_to_the_same_offline_task(cache, sinks):
    """After the first actor dies, rollback + open(resume) continue the same task folder: config once,
    steps unshifted, the unacknowledged batch not doubled, the first actor's debug sample file intact."""
    first = _killed_actor()
    first_png = next((cache / "offline").rglob("*.png")).read_bytes()
    sink = ClearmlSink(RunSpec(project="p", experiment="e", params={"lr": 0.1}, run_id="abc123"),
                       ClearmlSink.resolve(RunSpec(project="p", experiment="e"), os.environ, {}))
    sinks.append(sink)
    sink.rollback(first["mark"])
    state = sink.open(first["state"])
    blank = png(np.zeros((2, 2, 3), dtype=np.uint8))
    sink.write([Metrics(step=s, values={"train/loss": float(s)}, time=0.0) for s in range(5, 10)])
    sink.write([Image(step=9, name="samples/picture", png=blank, time=0.0)])
    sink.close(0)

    assert state == first["state"]
    assert len([p for p in (cache / "offline").iterdir() if p.is_dir()]) == 1
    back = read_clearml_run(cache, task_id=state["task_id"])
    assert back.points == [(s, "train/loss", float(s)) for s in range(10)]
    assert back.params == {"lr": 0.1} and back.configuration_types == {CONFIG_NAME: "dictionary"}
    samples = back.samples_of("samples", "picture")
    assert {step: [s.content for s in items] for step, items in samples.items()} == {4: [first_png], 9: [blank]}
    assert back.exit_code == 0


def test_resumed_run_finds_its_task_by_run_id(cache, sinks):
    """A trainer resumed from a checkpoint (RunSpec.resume, no resume state) continues the task tagged with its
    run id instead of starting a new one."""
    first, state = _open(sinks, params={"lr": 0.1})
    first.write([Metrics(step=0, values={"train/loss": 0.0}, time=0.0)])
    first.close(0)
    again, resumed = _open(sinks, params={"lr": 0.1}, resumed=True)
    again.write([Metrics(step=1, values={"train/loss": 1.0}, time=0.0)])
    again.close(0)
    assert resumed == state
    assert read_clearml_run(cache, run_id="abc123").points == [(0, "train/loss", 0.0), (1, "train/loss", 1.0)]


def test_reattach_without_the_session_folder_fails_clearly(cache, sinks):
    """Re-attaching to an offline task whose session folder is not on this node raises SinkError (ClearML would
    silently start an empty task under the old id)."""
    sink = ClearmlSink(RunSpec(project="p", experiment="e"), ClearmlSink.resolve(RunSpec(project="p", experiment="e"),
                                                                                os.environ, {}))
    sinks.append(sink)
    with pytest.raises(SinkError, match="cannot re-attach to offline task offline-0123.*not on this node"):
        sink.open({"task_id": "offline-0123"})
    assert not (cache / "offline" / "offline-0123").exists()


# -- durability --------------------------------------------------------------------------------
_FLUSHED_THEN_KILLED = """
import os, sys, time
sys.path.insert(0, {repo!r})
from tracklane.core.records import Metrics, RunSpec, Text
from tracklane.workers.sinks.clearml import ClearmlSink
run = RunSpec(project="p", experiment="e", params={{"lr": 0.1}}, run_id="flush1")
sink = ClearmlSink(run, ClearmlSink.resolve(run, os.environ, {{}}))
sink.open(None)
for start in range(0, {steps}, 25):  # several batches, as a lane hands them over, each flushed
    steps = range(start, start + 25)
    sink.write([Metrics(step=s, values={{f"train/k{{i}}": s + i / 10 for i in range(12)}}, time=0.0) for s in steps])
    sink.write([Text(step=s, name="notes/prompt", text=f"step {{s}}", time=0.0) for s in steps if s % 50 == 0])
    sink.flush()
print("flushed", flush=True)
time.sleep(300)  # killed by the test long before this ends
"""
FLUSHED_STEPS = 200


def test_flush_is_durable_across_sigkill(cache):
    """Every scalar and debug sample written before flush() is in the session folder when the process is
    SIGKILLed right after it (no close, no atexit hook, no zip)."""
    script = _FLUSHED_THEN_KILLED.format(repo=str(REPO), steps=FLUSHED_STEPS)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        for out in iter(proc.stdout.readline, ""):
            printed.append(out)
            if out.strip() == "flushed":
                os.kill(proc.pid, signal.SIGKILL)  # only the child this test started
                break
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert printed and printed[-1].strip() == "flushed", "".join(printed)[-3000:]
    assert proc.returncode == -signal.SIGKILL

    back = read_clearml_run(cache, run_id="flush1")
    expected = sorted((s, f"train/k{i}", s + i / 10) for s in range(FLUSHED_STEPS) for i in range(12))
    assert sorted(back.points) == expected and back.duplicates() == []
    texts = {step: [s.content for s in items] for step, items in back.samples_of("notes", "prompt").items()}
    assert texts == {s: [f"step {s}".encode()] for s in range(0, FLUSHED_STEPS, 50)}
    assert back.exit_code is None and not list((cache / "offline").glob("*.zip"))  # it never closed


# -- isolation ---------------------------------------------------------------------------------
_WATCHED = """
import json, os, signal, sys, threading, time
root = os.environ["WATCH_ROOT"]
seen = []
def writes(mode, flags):
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return bool(isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
def hook(event, args):
    if event.startswith(("socket.connect", "socket.getaddrinfo", "socket.gethostby", "socket.sendto")) or event in (
            "os.fork", "os.forkpty", "os.posix_spawn", "subprocess.Popen", "os.system", "os.exec"):
        seen.append([event, repr(args)[:200]])
    elif event == "open" and isinstance(args[0], str) and writes(args[1], args[2]) and not (
            os.path.abspath(args[0]).startswith(root) or args[0] == os.devnull):
        seen.append([event, args[0]])
    elif event in ("os.mkdir", "os.rename", "os.remove") and isinstance(args[0], str) and not os.path.abspath(
            args[0]).startswith(root):
        seen.append([event, args[0]])
sys.addaudithook(hook)
sys.path.insert(0, {repo!r})
import psutil
before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.excepthook)
tic = time.perf_counter()
import clearml
import_s = time.perf_counter() - tic
from tracklane.core.records import Artifact, Image, Metrics, RunSpec, Text
from tracklane.workers.sinks.clearml import ClearmlSink
run = RunSpec(project="p", experiment="e", params={{"lr": 0.1}}, run_id="watch1")
sink = ClearmlSink(run, ClearmlSink.resolve(run, os.environ, {{}}))
tic = time.perf_counter()
sink.open(None)
open_s = time.perf_counter() - tic
threads = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
children = len(psutil.Process().children(recursive=True))
sink.write([Metrics(step=s, values={{"train/loss": float(s)}}, time=0.0) for s in range(50)])
sink.write([Text(step=1, name="notes/a", text="x", time=0.0)])
open(os.path.join(root, "ckpt.bin"), "wb").write(b"weights")
os.makedirs(os.path.join(root, "tok"), exist_ok=True)
open(os.path.join(root, "tok", "v.json"), "w").write("{{}}")
sink.write([Artifact(step=2, path=os.path.join(root, "ckpt.bin"), name="ckpt", type="model", time=0.0),
            Artifact(step=2, path=os.path.join(root, "tok"), name="tok", type="dataset", time=0.0)])
tic = time.perf_counter()
sink.flush()
flush_s = time.perf_counter() - tic
sink.close(0)
time.sleep(0.2)
after = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.excepthook)
print(json.dumps({{"seen": seen, "import_s": import_s, "open_s": open_s, "flush_s": flush_s, "threads": threads,
                   "children_while_open": children, "children_after": len(psutil.Process().children(recursive=True)),
                   "threads_after": [t.name for t in threading.enumerate() if t is not threading.main_thread()],
                   "hooks_restored": after == before, "master_marker": os.environ.get("CLEARML_PROC_MASTER_ID")}}))
"""


@pytest.mark.slow
def test_no_server_no_process_nothing_outside_tmp(cache, tmp_path):
    """A whole sink life (open, metrics, text, artifacts, flush, close) contacts no network, starts no process,
    writes nothing outside tmp_path, and leaves no thread, child, signal hook or process marker behind."""
    env = {**os.environ, "WATCH_ROOT": str(tmp_path), "TMPDIR": str(tmp_path / "tmp"), "PYTHONDONTWRITEBYTECODE": "1"}
    (tmp_path / "tmp").mkdir()
    done = subprocess.run([sys.executable, "-c", _WATCHED.format(repo=str(REPO))], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print("clearml figures:", {k: report[k] for k in ("import_s", "open_s", "flush_s", "threads")})
    assert report["seen"] == []
    assert report["children_while_open"] == 0 and report["children_after"] == 0
    assert report["threads"] and report["threads_after"] == []
    assert report["hooks_restored"] and report["master_marker"] is None
    back = read_clearml_run(cache, run_id="watch1")
    assert len(back.points) == 50 and sorted(back.artifacts) == ["dataset/tok/step_2", "model/ckpt/step_2"]


# -- rich records ------------------------------------------------------------------------------
@pytest.fixture
def sink(cache, sinks):
    """An opened sink on run "rich1"; closed at the end if the test did not."""
    opened, _ = _open(sinks, params={"lr": 0.1}, run_id=RUN_ID)
    return opened


def number(cell) -> float:
    """A score cell as a float: the sink writes non-finite ones as "NaN", "Inf", "-Inf"."""
    return float(cell)


def test_generations_are_one_table_per_key_and_step(sink, cache):
    """Each step's table holds exactly that step's rows under verl's title/series split (unicode, "", NaN, full
    float precision, 1 MB kept); a step without samples stores nothing; metrics read back unchanged."""
    steps = {**GENERATION_STEPS, 0: [["héllo 中文 🚀", "", math.nan], ["", "out", 0.12345678901234567]]}
    want = write_generations(sink, steps)
    sink.close(0)

    back = read_clearml_run(cache, run_id=RUN_ID)
    tables = back.tables("val", "generations")
    assert_generation_tables(tables, want, score=number)
    assert tables[0][1][0][3] == "NaN" and tables[3][1][1][3] == "Inf"
    assert back.tables("val", "other") == {3: (GENERATION_COLUMNS, [[3, "other", "key", 2.0]])}
    assert back.points == [(s, "val/score", float(s)) for s in steps]


def test_trajectories_keep_messages_tool_calls_rewards_and_token_counts(sink, cache):
    """Each trajectory is one row of its step's table whose JSON cells parse back to what was written."""
    written = write_trajectories(sink)
    sink.close(0)

    assert_trajectory_tables(read_clearml_run(cache, run_id=RUN_ID).tables("rollout", "trajectories"), written, score=number)


def test_histogram_text_and_image_come_back_as_written(sink, cache):
    """Bars are np.histogram of the finite values at the bin centres, with summary scalars and the non-finite
    values counted; text bytes are equal; the PNG bytes are stored as given; no kind is unsupported."""
    written = media([math.nan, math.inf, -math.inf, math.nan])
    sink.write(written.records(grey_name="grey"))
    sink.close(0)

    back = read_clearml_run(cache, run_id=RUN_ID)
    bars = back.bars("rollout", "kl")
    scalars = back.scalars()
    assert sorted(bars) == [1, 2]
    for step, array in written.values.items():
        finite = array[np.isfinite(array)]
        counts, edges = np.histogram(finite, bins=30)
        assert bars[step] == (((edges[:-1] + edges[1:]) / 2).tolist(), counts.tolist())
        assert scalars[step] == {"rollout/kl/mean": finite.mean(), "rollout/kl/std": finite.std(),
                                 "rollout/kl/min": finite.min(), "rollout/kl/max": finite.max(),
                                 "rollout/kl/count": finite.size}
    assert back.bars("rollout", "empty") == {} and scalars[3] == {"rollout/empty/count": 0.0}
    assert sink.counts.cuts == {"histogram_nonfinite": 5} and sink.counts.unsupported == {}  # 4 at step 2, 1 empty

    stored_texts = {step: [s.content for s in items] for step, items in back.samples_of("notes", "prompt").items()}
    assert stored_texts == {step: [text.encode("utf-8")] for step, text in written.texts.items()}
    stored_pngs = {step: [s.content for s in items] for step, items in back.samples_of("samples", "picture").items()}
    assert stored_pngs == {step: [png(array)] for step, array in written.images.items()}
    assert [s.content for s in back.samples_of("grey", "grey")[3]] == [png(written.grey)]
    assert all(s.key.endswith((".png", ".txt")) for s in back.samples)


def test_artifacts_are_copied_into_the_session(sink, cache, tmp_path):
    """A file and a directory (zipped by ClearML) are stored under "<type>/<name>/step_<N>" with their bytes and
    metadata, the copy outlives the source, and a missing path is counted."""
    content = write_artifacts(sink, tmp_path)  # the file is gone afterwards: the session kept a copy
    sink.close(0)

    artifacts = read_clearml_run(cache, run_id=RUN_ID).artifacts
    assert sorted(artifacts) == ["dataset/tokenizer/step_10", "model/actor ckpt/step:10/step_10"]
    model = artifacts["model/actor ckpt/step:10/step_10"]
    assert model.files() == {"model[1].bin": content}
    assert model.metadata == {"name": "actor ckpt/step:10", "type": "model", "step": "10"}
    assert artifacts["dataset/tokenizer/step_10"].files() == {"vocab.json": b'{"a": 1}', "sub/merges.txt": b"a b\n"}
    assert sink.counts.artifacts_missing == 1
