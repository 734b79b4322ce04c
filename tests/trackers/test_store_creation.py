"""A SIGKILL at any moment while a sink creates its tracker's store leaves a store that tracker's own client
opens, and that tracklane opens again (as a restarted lane or a resumed run would) and logs into.

Each case runs a child process (this module: ``python -m tests.trackers.test_store_creation <spec>``) that builds one sink
with every tracker offline under tmp_path, opens it and logs a record, and is SIGKILLed at one moment of that:

- a moment the child reports, observed without touching the tracker: an audit hook sees files and folders
  created, opened for writing, renamed, linked and removed; a trace callback on each sqlite connection sees every
  statement (MLflow's migration, trackio's schema); a profile hook sees each ``write`` call on a store's file.
  At the chosen one the child says so and waits, and the test kills it there;
- a time: a fraction of how long the open took in an unkilled child of the same tracker (measured first);
- for wandb, whose run file wandb-core (not Python) writes: times, and the moment the run file appears.

Then the store is opened with the tracker's own reader: MLflow ``MlflowClient``; TensorBoard's
``EventAccumulator``; swanlab's ``DataStoreReader``; trackio's ``Api`` and storage; ClearML's
``import_offline_session``, as far as it goes offline (it reads the session, then needs a server), and
``clearml_reader``; wandb, which ships no reader, through ``wandb_reader`` with wandb's record schema; the file
tracker's lines with ``json``. Then the sink opens the run again in this process, logs, and the record is read
back.

The default run takes a few named moments per tracker (25 tests, ~55 s on 2 cores). ``TRACKLANE_FAULT_SWEEP=1``
adds moments spread over the events of each creation and over its duration (208 tests, ~5 minutes).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from tracklane.core.records import Metrics, RunSpec
from tracklane.host.registry import backend_class

REPO = Path(__file__).resolve().parents[2]
SWEEP = os.environ.get("TRACKLANE_FAULT_SWEEP") == "1"
RUN_ID = "storerun01"
PROJECT = "p"
PARAMS = {"trainer": {"project_name": PROJECT, "total_steps": 3}, "lr": 1e-6}
CHILD_TIMEOUT_S = 60.0
HELPERS_GONE_S = 15.0  # a killed child's helper (wandb-core) closes the store by itself: measured ~0.1 s
pytestmark = pytest.mark.filterwarnings("ignore:'parseAll' argument is deprecated:DeprecationWarning")


# -- the moments ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Moment:
    """When the child dies: at an event it reports (the ``nth`` whose description ``match`` finds, then ``after``
    more events), at ``at`` times the measured open, when ``appears`` (a glob under the root) first exists, or
    (a sweep) at the event ``of_events`` of the way through the open."""

    name: str
    match: str = ""
    nth: int = 1
    after: int = 0
    at: float | None = None
    appears: str = ""
    of_events: float | None = None
    unstarted: bool = False
    """swanlab: inside ``swanlab.init`` before its store's first flush, where swanlab's own reader refuses the
    run folder until tracklane's next open of the run sets it aside (workers/sinks/swanlab.py)."""


@dataclass(frozen=True)
class Tracker:
    name: str
    moments: tuple[Moment, ...]
    watch_writes: bool = False
    """Report each ``write`` call on the store's files (a profile hook; it slows the child: not for MLflow)."""
    resumed: bool = True
    """Open again as a resumed run (it reads what the store holds); else as a restarted lane. wandb's resumed
    open waits 3 s for a killed run's files to be still (``QUIET_S``), so here it opens as a restarted lane."""
    unstarted_heals: bool = False
    """A kill may leave a run its reader refuses until tracklane's next open of the run (swanlab only)."""


# What each kill left before workers/*_sink.py handled it, measured with these children (mlflow 3.17, clearml
# 2.1.12, swanlab 0.10.3, trackio 0.43, tensorboard 2.21, wandb 0.31):
TRACKERS = {tracker.name: tracker for tracker in (
    # In place, 19 of 24 statements spread over the migration left a database MLflow refuses ever after.
    Tracker("mlflow", (
        Moment("new-database", match=r"^sql \S+: CREATE TABLE experiments"),
        Moment("alembic-tmp-experiments", match=r"^sql \S+: INSERT INTO _alembic_tmp_experiments"),  # the issue's
        Moment("migrated-not-linked", match=r"^os\.link "),
        Moment("linked-temp-not-removed", match=r"^os\.remove \S+\.creating$"),  # the db has two names
        Moment("half-the-open", at=0.5),
    )),
    # Every statement of trackio's init_db is safe to run again (IF NOT EXISTS, columns added once checked):
    # kills at all 48 of its moments left a store trackio opens. Nothing to handle.
    Tracker("trackio", (
        Moment("new-database", match=r"^sql \S+: CREATE TABLE IF NOT EXISTS metrics"),
        Moment("first-added-column", match=r"^sql \S+: ALTER TABLE \S+ ADD COLUMN"),
        Moment("schema-savepoint", match=r"^sql \S+: SAVEPOINT"),
        Moment("half-the-open", at=0.5),
    )),
    # task.json rewritten in place: each of its 6 rewrites, killed at its first write, left it empty.
    Tracker("clearml", (
        Moment("task-json-first-write", match=r"^open \S*task\.json\S* w", after=1),
        Moment("task-json-third-rewrite", match=r"^open \S*task\.json\S* w", nth=3, after=1),
        Moment("half-the-open", at=0.5),
    ), watch_writes=True),
    # The store stayed 0 bytes from its creation to the first flush: 40 of 52 moments of an open.
    Tracker("swanlab", (
        Moment("store-created-empty", match=r"^open \S+\.swanlab x", after=1, unstarted=True),
        Moment("metadata-written", match=r"^open \S+swanlab-metadata\.json", after=1),
        Moment("half-the-open", at=0.5),
    ), watch_writes=True, unstarted_heals=True),
    # A new file per open; every byte prefix of an event file reads (a cut last record is skipped). Its open
    # takes ~5 ms: the events are the moments worth naming. Nothing to handle.
    Tracker("tensorboard", (
        Moment("event-file-created", match=r"^open \S+tfevents\S* ", after=1),
        Moment("version-written", match=r"^write \S+tfevents", nth=2),
    ), watch_writes=True),
    # The header is one write of one line. Nothing to handle (and workers/sinks/file.py is not ours to change).
    Tracker("file", (
        Moment("file-created", match=r"^open \S+\.jsonl ", after=1),
        Moment("header-written", match=r"^opened$"),
    ), watch_writes=True),
    # wandb-core writes the run file, in 32 KiB blocks: a kill left no file or its 7-byte header, and a restarted
    # lane's run gets a folder of its own. Nothing to handle.
    Tracker("wandb", (
        Moment("run-file-appeared", appears="wandb/wandb/*run-*/run-*.wandb"),
        Moment("quarter-of-the-open", at=0.25),
        Moment("half-the-open", at=0.5),
        Moment("three-quarters-of-the-open", at=0.75),
    ), resumed=False),
)}
SWEEP_TIMES = (0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0)
SWEEP_EVENTS = 20


def cases() -> list[Any]:
    out = []
    for tracker in TRACKERS.values():
        moments = list(tracker.moments)
        if SWEEP:
            moments += [Moment(f"t{at}", at=at) for at in SWEEP_TIMES]
            if tracker.name != "wandb":  # its Python side reports almost nothing
                moments += [Moment(f"event{i}of{SWEEP_EVENTS}", of_events=i / SWEEP_EVENTS)
                            for i in range(1, SWEEP_EVENTS + 1)]
        out += [pytest.param(tracker.name, moment, id=f"{tracker.name}-{moment.name}") for moment in moments]
    return out


# -- the environment: conftest's offline_trackers variables, for child processes too -----------------------
_FOLDERS = ("wandb", "wandb-data", "wandb-cache", "wandb-config", "swanlog", "swanlab-home", "tensorboard",
            "trackio", "clearml-cache", "fake-home", "child-logs")
_UNSET = ("MLFLOW_RUN_ID", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID",
          "TRACKIO_TRACE_SESSIONS_DIR", "TRACKIO_STORAGE_MODE", "CLEARML_API_HOST", "CLEARML_API_ACCESS_KEY",
          "CLEARML_API_SECRET_KEY", "CLEARML_AUTH_TOKEN", "CLEARML_TASK_ID", "CLEARML_PROC_MASTER_ID",
          "CLEARML_SET_ITERATION_OFFSET", "CLEARML_DEFERRED_TASK_INIT")


def tracker_env(root: Path) -> dict[str, str]:
    """Every tracker offline and writing under ``root`` (its folders made)."""
    for name in _FOLDERS:
        (root / name).mkdir(parents=True, exist_ok=True)
    return {
        "WANDB_MODE": "offline", "WANDB_DIR": str(root / "wandb"), "WANDB_DATA_DIR": str(root / "wandb-data"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"), "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_SILENT": "true", "SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": str(root / "swanlog"),
        "SWANLAB_SAVE_DIR": str(root / "swanlab-home"), "TENSORBOARD_DIR": str(root / "tensorboard"),
        "VERL_FILE_LOGGER_PATH": str(root / "metrics.jsonl"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "TRACKIO_DIR": str(root / "trackio"), "CLEARML_OFFLINE_MODE": "1",
        "CLEARML_CACHE_DIR": str(root / "clearml-cache"), "CLEARML_CONFIG_FILE": str(root / "clearml.conf"),
        "HOME": str(root / "fake-home"),
    }


@pytest.fixture
def store_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the trackers' root, for the children and for the sinks this process opens."""
    for key, value in tracker_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    for key in _UNSET:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


# -- a child, from this side -----------------------------------------------------------------------------
class Child:
    """The child process: its stdout lines on a queue (read by a thread), its stderr in a file under the root."""

    def __init__(self, spec: dict[str, Any], root: Path, tag: str = "") -> None:
        env = {key: value for key, value in os.environ.items() if key not in _UNSET}
        env.update(tracker_env(root), STORE_ROOT=str(root), PYTHONPATH=str(REPO))
        self.root = root
        self.stderr = root / "child-logs" / f"{spec['tracker']}{tag}.stderr"
        with open(self.stderr, "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.trackers.test_store_creation", json.dumps(spec)],
                                         cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout: float) -> str | None:
        """The next line (None: the child closed its stdout); raises queue.Empty after ``timeout``."""
        return self.lines.get(timeout=timeout)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc.poll() is None:  # a test that failed before its kill leaves no child behind
            self.kill()

    def kill(self) -> None:
        """SIGKILL the child, then wait until no helper process it started (wandb-core) holds a file of the store."""
        helpers = _descendants(self.proc.pid)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(CHILD_TIMEOUT_S)
        deadline = time.monotonic() + HELPERS_GONE_S
        while any(_holds_file_under(pid, self.root) for pid in helpers) and time.monotonic() < deadline:
            time.sleep(0.02)

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def tail(self) -> str:
        return "\n--- child stderr ---\n" + self.stderr.read_text(errors="replace")[-3000:]


def read_until(child: Child, last: str | None) -> list[str]:
    """The child's lines up to ``last`` (None: to the end of its output)."""
    lines: list[str] = []
    while (line := child.line(CHILD_TIMEOUT_S)) is not None:
        lines.append(line)
        if line == last:
            break
    return lines


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc): ours, started by the child."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path("/proc", entry, "stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        out += below
        todo += below
    return out


def _holds_file_under(pid: int, root: Path) -> bool:
    """Whether process ``pid`` has a file of a store under ``root`` open, logs aside (wandb-core closes the run file
    ~0.1 s after the child died; wandb-symon, which holds only its log, lives on ~5 s)."""
    try:
        targets = [os.readlink(fd) for fd in Path("/proc", str(pid), "fd").iterdir()]
    except OSError:  # gone (or going)
        return False
    return any(target.startswith(f"{root}/") and not target.endswith((".log", ".stderr")) for target in targets)


@dataclass
class ChildRun:
    events: list[tuple[float, str]] = field(default_factory=list)
    """(seconds since the open began, description) of each event the child reported."""
    killed_at: str = ""
    """Where it was killed: an event's description, a time, a file that appeared ("" when it finished)."""
    state: dict[str, Any] = field(default_factory=dict)
    """What the sink's open() returned, from a child that finished."""

    def opened_after(self) -> float:
        return next(t for t, description in self.events if description == "opened")

    def creation_events(self) -> int:
        return next(i for i, (_, description) in enumerate(self.events, 1) if description == "opened")


def run_child(tracker: str, root: Path, moment: Moment | None = None, *, window: float = 0.0,
              bare: bool = False) -> ChildRun:
    """Run the child of ``tracker`` under ``root``, SIGKILLed at ``moment`` (None: it finishes)."""
    if moment is not None and (moment.at is not None or moment.appears):
        moment_of_child = Moment("", match="^opened$")  # an open faster than that time waits to be killed there
    else:
        moment_of_child = moment or Moment("", nth=0)
    spec = {"tracker": tracker, "bare": bare, "watch_writes": TRACKERS[tracker].watch_writes,
            "match": moment_of_child.match, "nth": moment_of_child.nth, "after": moment_of_child.after}
    with Child(spec, root) as child:
        run = _follow(child, moment, window)
        if moment is None:
            assert child.proc.wait(CHILD_TIMEOUT_S) == 0, child.tail()
        else:
            assert run.killed_at, f"moment {moment} never came: the child ended{child.tail()}"
            child.kill()
    return run


def _follow(child: Child, moment: Moment | None, window: float) -> ChildRun:
    """Read the child's lines until its moment (a time, a file that appeared, its HOLD) or its end."""
    run = ChildRun()
    first = child.line(CHILD_TIMEOUT_S)
    assert first == "OPENING", f"{first!r}{child.tail()}"
    began = time.monotonic()
    kill_time = began + moment.at * window if moment is not None and moment.at is not None else None
    appears = moment.appears if moment is not None else ""
    while True:
        now = time.monotonic()
        if kill_time is not None and now >= kill_time:
            run.killed_at = f"{kill_time - began:.3f} s into the open"
            return run
        found = sorted(child.root.glob(appears)) if appears else []
        if found:
            run.killed_at = f"{found[0].name} appeared, {now - began:.3f} s into the open"
            return run
        polling = kill_time is not None or bool(appears)
        wait = CHILD_TIMEOUT_S if not polling else 0.002 if kill_time is None else min(0.002, max(kill_time - now, 0.0))
        try:
            line = child.line(wait)
        except queue.Empty:
            assert polling, f"the child said nothing for {CHILD_TIMEOUT_S} s{child.tail()}"
            continue
        if line is None:
            return run
        kind, _, rest = line.partition(" ")
        if kind == "EVENT":
            seconds, _, description = rest.partition(" ")
            run.events.append((float(seconds), description))
        elif kind == "HOLD":  # the child waits at its moment
            run.killed_at = run.events[-1][1]
            return run
        elif kind == "DONE":
            run.state = json.loads(rest)


# -- the tracker's own readers -----------------------------------------------------------------------------
class Unstarted(AssertionError):
    """A swanlab run folder whose store holds no start record (the case workers/sinks/swanlab.py sets aside)."""


def open_mlflow(root: Path) -> str:
    """No database, or one with no migration left half-done that ``MlflowClient`` opens and searches."""
    database = root / "mlflow.db"
    if not database.exists():  # MlflowClient would create it: the sink's next open does, and is checked then
        return "no database"
    with contextlib.closing(sqlite3.connect(database)) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not {name for name in tables if name.startswith("_alembic_tmp_")}, sorted(tables)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    experiments = client.search_experiments()
    runs = client.search_runs([experiment.experiment_id for experiment in experiments])
    return f"{len(experiments)} experiment(s), {len(runs)} run(s)"


def open_trackio(root: Path) -> str:
    """Each run of the project, listed by ``trackio.Api`` and read through trackio's storage."""
    from tracklane.workers.testing.readers.trackio_reader import list_trackio_runs, read_trackio_run

    runs = list_trackio_runs(root / "trackio", PROJECT)  # trackio.Api().runs
    for run in runs:
        read_trackio_run(root / "trackio", PROJECT, run_id=run.run_id)
    return f"{len(runs)} run(s)"


def open_clearml(root: Path) -> str:
    """Each session (a folder with a task.json): ClearML's ``import_offline_session`` reads it and stops only where
    it needs a server (offline: ``UsageError``; an unreadable task.json: ``ValueError``), and so does our reader."""
    from clearml import Task
    from clearml.errors import UsageError

    from tracklane.workers.testing.readers.clearml_reader import clearml_sessions, read_clearml_session

    sessions = clearml_sessions(root / "clearml-cache")
    Task.set_offline(True)  # as the environment says (CLEARML_OFFLINE_MODE=1); set_offline(False) would change it
    for folder in sessions:
        with pytest.raises(UsageError, match="offline mode"):
            Task.import_offline_session(str(folder))
        read_clearml_session(folder)
    return f"{len(sessions)} session(s)"


def open_swanlab(root: Path) -> str:
    """Each run folder's store, through swanlab's own reader: it opens, and its first record is the start."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    folders = sorted(path for path in (root / "swanlog").glob("run-*") if path.is_dir())
    for folder in folders:
        stores = list(folder.glob("run-*.swanlab"))
        if not stores:
            raise Unstarted(f"{folder.name} holds no store")
        reader = DataStoreReader()
        try:
            reader.open(stores[0])
        except AssertionError as exc:  # "header is 0 bytes instead of the expected 7"
            raise Unstarted(f"{folder.name}: {exc}") from exc
        payloads = list(reader)
        reader.close()
        if not payloads:
            raise Unstarted(f"{folder.name}: no record")
        first = Record()
        first.ParseFromString(payloads[0])
        assert first.HasField("start"), f"{folder.name}: the first record is {first.WhichOneof('record_type')}"
    return f"{len(folders)} run folder(s)"


def open_tensorboard(root: Path) -> str:
    """Every event file, each through an ``EventAccumulator``."""
    from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

    return f"{len(read_tensorboard_dir(root / 'tensorboard').points)} point(s)"  # an EventAccumulator per file


def open_wandb(root: Path) -> str:
    """Every run file: each record CRC-checked and parsed with wandb's own schema (wandb ships no reader)."""
    from tracklane.workers.sinks.wandb_store import run_files
    from tracklane.workers.testing.readers.wandb_reader import read_run_file

    files = [path for run_id in {path.stem[4:] for path in (root / "wandb").glob("wandb/*run-*/run-*.wandb")}
             for path in run_files(root / "wandb", run_id)]
    for path in files:
        read_run_file(path)
    return f"{len(files)} run file(s)"


def open_file(root: Path) -> str:
    """Every line of the JSON-lines file parses."""
    path = root / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for line in lines:
        json.loads(line)
    return f"{len(lines)} line(s)"


OWN_CLIENT: dict[str, Callable[[Path], str]] = {
    "mlflow": open_mlflow, "trackio": open_trackio, "clearml": open_clearml, "swanlab": open_swanlab,
    "tensorboard": open_tensorboard, "wandb": open_wandb, "file": open_file,
}


def logged_x(tracker: str, root: Path, state: dict[str, Any]) -> float:
    """The value of "x" at step 1 in the run ``state`` names, read back."""
    if tracker == "file":
        lines = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
        return float(next(line["data"]["x"] for line in lines if line.get("step") == 1))
    if tracker == "mlflow":
        from tracklane.workers.testing.readers.mlflow_reader import read_mlflow_run
        back = read_mlflow_run(f"sqlite:///{root / 'mlflow.db'}", state["run_id"])
    elif tracker == "trackio":
        from tracklane.workers.testing.readers.trackio_reader import read_trackio_run
        back = read_trackio_run(root / "trackio", PROJECT, run_id=state["id"])
    elif tracker == "clearml":
        from tracklane.workers.testing.readers.clearml_reader import read_clearml_run
        back = read_clearml_run(root / "clearml-cache", task_id=state["task_id"])
    elif tracker == "swanlab":
        from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run
        back = read_swanlab_run(root / "swanlog", run_id=state["id"])
    elif tracker == "tensorboard":
        from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir
        back = read_tensorboard_dir(root / "tensorboard")
    else:
        from tracklane.workers.testing.readers.wandb_reader import read_wandb_run
        back = read_wandb_run(root / "wandb", state["id"])
    return back.scalars()[1]["x"]


def reopen_and_log(tracker: str) -> dict[str, Any]:
    """Open the run again in this process (a resumed run or a restarted lane), log x=2 at step 1, close."""
    cls = backend_class(tracker)
    run = RunSpec(project=PROJECT, experiment="e", params=PARAMS, run_id=RUN_ID, resume=TRACKERS[tracker].resumed)
    sink = cls(run, cls.resolve(run, os.environ, {}))
    state = sink.open(None)
    try:
        sink.write([Metrics(step=1, values={"x": 2.0}, time=time.time())])
        sink.flush()
    finally:
        sink.close(0)
    return state


# -- the tests -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ChildRun]:
    """An unkilled child's run per tracker (its events and how long its open took), made once."""
    runs: dict[str, ChildRun] = {}

    def get(tracker: str) -> ChildRun:
        if tracker not in runs:
            runs[tracker] = run_child(tracker, tmp_path_factory.mktemp(f"{tracker}-unkilled"))
        return runs[tracker]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(("tracker", "moment"), cases())
def test_kill_during_creation_leaves_a_store_its_client_opens(tracker, moment, store_root, measured):
    """Killed at this moment of its open, the sink leaves a store its tracker's own reader opens, and the sink's next
    open of the run logs into it."""
    sdk = backend_class(tracker).sdk_module
    if sdk:
        pytest.importorskip(sdk)
    unkilled = measured(tracker)
    if moment.match:
        assert any(re.search(moment.match, description) for _, description in unkilled.events), \
            f"no event of an unkilled open matches {moment.match!r}: {[d for _, d in unkilled.events][:40]}"
    if moment.of_events is not None:
        moment = replace(moment, match=".", nth=max(1, round(moment.of_events * unkilled.creation_events())))

    killed = run_child(tracker, store_root, moment, window=unkilled.opened_after())
    try:
        OWN_CLIENT[tracker](store_root)
        unstarted = False
    except Unstarted:
        if not TRACKERS[tracker].unstarted_heals:
            raise
        unstarted = True
    except Exception as exc:
        raise AssertionError(f"{tracker}: after a kill at {killed.killed_at!r} its own reader fails") from exc
    if moment.unstarted:  # the window swanlab leaves inside its init: shown, then healed below
        assert unstarted, f"expected a run folder without its start record after a kill at {killed.killed_at!r}"

    state = reopen_and_log(tracker)
    OWN_CLIENT[tracker](store_root)
    assert logged_x(tracker, store_root, state) == 2.0
    if tracker == "mlflow":  # the killed child's half-built database, and a second name of a complete one, are gone
        assert sorted(path.name for path in store_root.glob(".mlflow.db.*")) == []


@pytest.mark.slow
def test_mlflow_migrating_a_new_database_in_place_is_what_a_kill_breaks(store_root):
    """Killed at the same moment of MLflow's own creation of a new database (in place, as MlflowClient does it),
    the database is left half-migrated and MLflow refuses it ever after: why the sink builds it aside."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    moment = next(m for m in TRACKERS["mlflow"].moments if m.name == "alembic-tmp-experiments")
    run_child("mlflow", store_root, moment, bare=True)
    database = store_root / "mlflow.db"
    with contextlib.closing(sqlite3.connect(database)) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "_alembic_tmp_experiments" in tables
    for _ in range(2):  # the error, at every open
        with pytest.raises(Exception, match="_alembic_tmp_experiments already exists"):
            MlflowClient(tracking_uri=f"sqlite:///{database}")


@pytest.mark.slow
def test_mlflow_two_lanes_creating_one_database_at_once_both_open_it(store_root):
    """Two processes that create the same new database at once both open it: one links its copy in, the other
    finds it there and discards its own; both runs are in it and no temporary file is left."""
    pytest.importorskip("mlflow")
    spec = {"tracker": "mlflow", "bare": False, "watch_writes": False, "match": "", "nth": 0, "after": 0,
            "pause": r"^os\.link "}
    states = []
    with Child(spec, store_root, tag="0") as first, Child(spec, store_root, tag="1") as second:
        for child in (first, second):  # both hold a complete database of their own, not linked yet
            assert "PAUSE" in read_until(child, "PAUSE"), child.tail()
        for child in (first, second):
            child.release()
        for child in (first, second):
            done = [line for line in read_until(child, None) if line.startswith("DONE ")]
            assert child.proc.wait(CHILD_TIMEOUT_S) == 0 and done, child.tail()
            states.append(json.loads(done[0].removeprefix("DONE ")))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store_root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(PROJECT)
    assert sorted(run.info.run_id for run in client.search_runs([experiment.experiment_id])) == \
        sorted(state["run_id"] for state in states)
    assert sorted(path.name for path in store_root.glob(".mlflow.db.*")) == []


# -- the child -----------------------------------------------------------------------------------------------
PRELOAD = {  # what an open imports, imported first: the measured open is the creation
    "mlflow": ("mlflow.tracking", "mlflow.store.db.utils", "mlflow.store.tracking.sqlalchemy_store"),
    "trackio": ("trackio.sqlite_storage",),
    "tensorboard": ("tensorboard.summary.writer.event_file_writer", "tensorboard.compat.proto.event_pb2",
                    "tensorboard.plugins.text.summary_v2"),
    "swanlab": ("swanlab.sdk.internal.core_python.store",),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR
_PATH_EVENTS = ("os.rename", "os.link", "os.symlink", "os.remove", "os.mkdir", "os.rmdir", "os.truncate",
                "shutil.copyfile", "shutil.move")


class Watch:
    """Reports each change the child makes under the root as an event; holds (to be killed) or pauses at one."""

    def __init__(self, root: str, spec: dict[str, Any]) -> None:
        self.root = root.rstrip("/") + "/"
        self.match, self.nth, self.after = spec["match"], spec["nth"], spec["after"]
        self.pause = spec.get("pause", "")
        self.armed = False
        self.began = 0.0
        self._count = self._matched = 0
        self._target: int | None = None
        self._lock = threading.RLock()
        sys.addaudithook(self._audit)
        import sqlite3.dbapi2 as dbapi2

        connect = sqlite3.connect

        def traced(database: Any, *args: Any, **kwargs: Any) -> Any:  # SQLAlchemy calls dbapi2's, trackio sqlite3's
            connection = connect(database, *args, **kwargs)
            if self._mine(database):
                name = os.path.basename(os.fsdecode(database))
                connection.set_trace_callback(lambda sql: self._statement(name, sql))
            return connection

        sqlite3.connect = dbapi2.connect = traced

    def arm(self, writes: bool) -> None:
        if writes:
            threading.setprofile(self._profile)
            sys.setprofile(self._profile)
        self.began, self.armed = time.monotonic(), True

    def disarm(self) -> None:
        self.armed = False
        sys.setprofile(None)
        threading.setprofile(None)

    def event(self, description: str) -> None:
        if not self.armed:
            return
        with self._lock:  # other threads wait here while the child holds: nothing more happens
            self._count += 1
            if self.match and self._target is None and re.search(self.match, description):
                self._matched += 1
                if self._matched == self.nth:
                    self._target = self._count + self.after
            print(f"EVENT {time.monotonic() - self.began:.4f} {description}", flush=True)
            if self._count == self._target:
                print("HOLD", flush=True)
                time.sleep(CHILD_TIMEOUT_S)  # the test kills it now; an orphan (the test itself died) ends here
                os._exit(3)
            if self.pause and re.search(self.pause, description):
                self.pause = ""
                print("PAUSE", flush=True)
                sys.stdin.readline()

    def _mine(self, path: Any) -> bool:
        with contextlib.suppress(TypeError, ValueError):
            return os.path.abspath(os.fsdecode(path)).startswith(self.root)
        return False

    def _rel(self, path: Any) -> str:
        return os.path.relpath(os.fsdecode(path), self.root)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.armed:
            return
        if event == "open":
            path, mode, flags = args
            if not isinstance(path, int) and self._mine(path) and (flags or 0) & _WRITE_FLAGS:
                self.event(f"open {self._rel(path)} {mode or oct(flags)}")
        elif event in _PATH_EVENTS:
            paths = [arg for arg in args if isinstance(arg, (str, bytes, os.PathLike))]
            if any(map(self._mine, paths)):
                self.event(" ".join([event, *map(self._rel, paths)]))

    def _statement(self, database: str, sql: str) -> None:
        text = " ".join(sql.split())
        if not re.match(r"(?i)(SELECT|PRAGMA [^=]*$)", text):  # reads change nothing
            self.event(f"sql {database}: {text[:100]}")

    def _profile(self, frame: Any, kind: str, arg: Any) -> None:
        if kind == "c_call" and getattr(arg, "__name__", "") == "write":
            name = getattr(getattr(arg, "__self__", None), "name", None)
            if isinstance(name, (str, bytes)) and self._mine(name):  # TensorBoard opens by bytes path
                self.event(f"write {self._rel(name)}")


def child_main(spec: dict[str, Any]) -> None:
    """Open the sink (or, ``bare``, MLflow's own client on the database), log a record, close; report events."""
    tracker = spec["tracker"]
    cls = backend_class(tracker)
    for module in (*PRELOAD.get(tracker, ()), *([cls.sdk_module] if cls.sdk_module else [])):
        importlib.import_module(module)
    watch = Watch(os.environ["STORE_ROOT"], spec)
    run = RunSpec(project=PROJECT, experiment="e", params=PARAMS, run_id=RUN_ID)
    sink = cls(run, cls.resolve(run, os.environ, {}))
    watch.arm(writes=spec["watch_writes"])
    print("OPENING", flush=True)
    if spec["bare"]:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])  # creates and migrates the database in place
        watch.event("opened")
        watch.disarm()
        print("DONE {}", flush=True)
        return
    state = sink.open(None)
    watch.event("opened")
    sink.write([Metrics(step=0, values={"x": 1.0}, time=time.time())])
    sink.flush()
    watch.event("wrote")
    sink.close(0)
    watch.event("closed")
    watch.disarm()
    print("DONE " + json.dumps(state), flush=True)


if __name__ == "__main__":
    child_main(json.loads(sys.argv[1]))


def test_a_resumed_file_run_starts_on_a_line_of_its_own_after_a_torn_last_line(tmp_path):
    """A kill that tore the file's last line (a huge header) never glues the next run's lines onto it."""
    from tracklane.workers.sinks.file import FileSink

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": null, "data": {}, "config": {"huge": "cut here')  # torn mid-line
    run = RunSpec(project=PROJECT, experiment="e", params={}, run_id=RUN_ID, resume=True)
    sink = FileSink(run, FileSink.resolve(run, {"VERL_FILE_LOGGER_PATH": str(path)}, {}))
    sink.open(None)
    sink.write([Metrics(step=1, values={"x": 1.0}, time=0.0)])
    sink.close(0)
    lines = path.read_text().splitlines()
    assert lines[0].endswith("cut here") and [json.loads(line)["step"] for line in lines[1:]] == [1]
