"""tracklane against verl itself, driven by verl's own trainer code: every point verl's ``Tracking`` stores.

Each cell runs verl's real fit loop (tests/verl_fit.py: verl's ``RayPPOTrainer.fit`` with its local
``Tracking`` and no ``finish()``, or the v1 trainer with ``TaskRunnerV1.run``'s ``finally: finish``) on CPU
fakes, once with verl's own tracking classes (the reference, one per style and place) and once with
tracklane's swapped in by ``tracklane.verl.dropin`` (in the actor through Ray's worker_process_setup_hook,
as the README's command line does), with ``log_async`` absent, false and true. In-process runs end as a
plain script's trainer does (the dropped ``Tracking`` finished by the garbage collector); actor runs go
through verl's ``run_ppo`` into a ``TaskRunner`` actor whose driver exits at once (``os._exit``).

Every tracker is read back (console lines, the file logger, TensorBoard event files, MLflow on sqlite
in-process and on a real ``mlflow server`` in the actor, wandb's run file, SwanLab's run store, trackio's
store) and compared point by point with verl's: every (step, key) verl stored is there with the same value
(time-measured keys: present, values differ run to run), nothing twice, runs ended as verl's did; the only
keys tracklane adds are its ``tracklane/*`` vitals (system metrics are off in the tests). verl's
validation generations and (v1) DAPO counts are compared in wandb, where verl puts both.
"""

from __future__ import annotations

import fnmatch
import gc
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("verl") is None or importlib.util.find_spec("transfer_queue") is None:
    pytest.skip("verl 0.9.1 and TransferQueue are not installed (.ci/run installs them)", allow_module_level=True)

from tests.verl_stores import TRACKERS, RunStores, Stored  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
TIME_DEPENDENT = ("timing_s/*", "timing_per_token_ms/*", "perf/time_per_step", "perf/throughput")
"""verl's wall-clock figures (tests/verl_fit.py): their values differ between any two runs."""
TRACKLANE_KEYS = ("tracklane/*",)
"""What tracklane adds to a run, and nothing else (its system/* metrics are off in the tests)."""
STYLES = {"v0": "trainer.use_v1=false", "v1": "trainer.use_v1=true"}
MODES = {"absent": [], "false": ["+trainer.log_async=false"], "true": ["+trainer.log_async=true"]}
EXPERIMENT = "sbs"


def overrides(style: str, project: str) -> list[str]:
    return [STYLES[style], f"trainer.logger=[{','.join(TRACKERS)}]", f"trainer.project_name={project}",
            f"trainer.experiment_name={EXPERIMENT}", f"trainer.total_training_steps={STEPS}"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The stores every run of the module shares, keyed by project: one sqlite MLflow database, one trackio folder."""
    root = tmp_path_factory.mktemp("side_by_side")
    return {"root": root, "sqlite": f"sqlite:///{root / 'mlflow.db'}", "trackio": root / "trackio"}


@pytest.fixture(scope="module")
def references():
    """verl's own runs, one per (style, place), made the first time a cell needs one."""
    return {}


def run_in_process(stores: RunStores, args: list[str], dropin: bool, capfd, monkeypatch) -> str:
    """verl's fit loop in this process; the run ends as in a script: collected (verl's __del__), here at once."""
    from tests.verl_fit import compose_verl_config, run_fit
    from tracklane.verl import dropin as verl_dropin

    for key, value in stores.env().items():
        monkeypatch.setenv(key, value)
    if "trackio" in sys.modules:  # trackio reads TRACKIO_DIR once, at import: an earlier test's import points elsewhere
        from tracklane.workers.sinks.trackio import point_trackio_at

        point_trackio_at(stores.trackio_dir)
    stores.prepare()
    capfd.readouterr()
    if dropin:
        verl_dropin.install()
    try:
        run_fit(compose_verl_config(args))
        gc.collect()
    finally:
        verl_dropin.uninstall()
    return capfd.readouterr().out


def run_in_actor(stores: RunStores, args: list[str], dropin: bool, ray_join: dict[str, str]) -> str:
    """verl's run_ppo into a TaskRunner actor of the test session's Ray; its driver exits right after."""
    stores.prepare()
    env = {**os.environ, **stores.env(), **ray_join, "PYTHONPATH": str(REPO)}
    joined = ["--address", ray_join["RAY_ADDRESS"]] if "RAY_ADDRESS" in ray_join else []  # else run_ppo starts one
    command = [sys.executable, "-m", "tests.verl_fit", *joined, *(["--dropin"] if dropin else []), "--", *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return actor_stdout(done.stdout + done.stderr)


def actor_stdout(driver_output: str) -> str:
    """What the TaskRunner printed, from its own log file in Ray's session folder: Ray forwards an actor's lines
    to its driver a little later, and this driver is gone by then (verl's console lines are its stdout)."""
    import ray

    pids = set(re.findall(r"\(FakeTaskRunner pid=(\d+)\)", driver_output))
    assert len(pids) == 1, f"expected one TaskRunner, found pids {pids}"
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    [out] = logs.glob(f"worker-*-{pids.pop()}.out")
    return out.read_text(errors="replace")


class Cell:
    """One run: where it writes, how it ran, and what each tracker holds of it."""

    def __init__(self, shared, mlflow_uri: str, name: str) -> None:
        self.project = name
        self.stores = RunStores(shared["root"] / name, mlflow_uri, shared["trackio"])
        self.output = ""

    def run(self, place: str, style: str, extra: list[str], dropin: bool, capfd, monkeypatch, ray_join) -> None:
        args = overrides(style, self.project) + extra
        if place == "in_process":
            self.output = run_in_process(self.stores, args, dropin, capfd, monkeypatch)
        else:
            self.output = run_in_actor(self.stores, args, dropin, ray_join)

    def read(self, tracker: str) -> Stored:
        return self.stores.read(tracker, self.project, EXPERIMENT, self.output)


def _timed(key: str) -> bool:
    return any(fnmatch.fnmatch(key, pattern) for pattern in TIME_DEPENDENT)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def assert_holds_every_point(tracker: str, verl: Stored, ours: Stored, logged: Stored) -> None:
    """Every (step, key) verl stored, with verl's value (time-measured keys: present); nothing twice. What tracklane
    holds beyond verl's store is its own ``tracklane/*`` or what verl logged and its store lost (``logged``: verl's
    file logger, written unbuffered at each call; verl's wandb in a killed TaskRunner loses its tail when no garbage
    collection finished verl's run first: README, "Use it from verl"), with the logged value."""
    missing = sorted(point for point in verl.points if point not in ours.points)
    assert not missing, f"{tracker}: {len(missing)} of verl's {len(verl.points)} points missing, e.g. {missing[:5]}"
    differ = [(point, verl.points[point], ours.points[point]) for point in verl.points
              if not _timed(point[1]) and not _same(verl.points[point], ours.points[point])]
    assert not differ, f"{tracker}: {len(differ)} values differ from verl's, e.g. {differ[:5]}"
    extra = [point for point in ours.points if point not in verl.points
             and not any(fnmatch.fnmatch(point[1], pattern) for pattern in TRACKLANE_KEYS)]
    unlogged = [point for point in extra if point not in logged.points]
    assert not unlogged, f"{tracker}: points verl neither stored nor logged: {unlogged[:10]}"
    changed = [point for point in extra if not _timed(point[1]) and not _same(logged.points[point], ours.points[point])
               and not _same(float(np.float32(logged.points[point])), ours.points[point])]  # TensorBoard keeps float32
    assert not changed, f"{tracker}: values differ from what verl logged: {changed[:5]}"
    twice = [point for point in ours.twice if point in verl.points]  # tracklane/* are samples: one a shipped batch
    assert not twice, f"{tracker}: {len(twice)} of verl's points stored twice, e.g. {twice[:5]}"


def reference_lacks(verl: Cell) -> str:
    """What verl's own run lacks of the validation at step 0, every training step and the last validation's table
    ("" if nothing): the comparison must not be vacuous. verl's wandb run in a TaskRunner ends unfinished (the
    actor is killed with its driver), and wandb-core has sometimes not yet stored the last table then."""
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_media

    steps = {step for step, _ in verl.read("file").points}
    if steps != set(range(STEPS + 1)):
        return f"file steps {sorted(steps)}"
    tables = read_wandb_media(verl.stores.root / "wandb").table_rows("val/generations")
    return "" if STEPS in tables else f"wandb val/generations tables at steps {sorted(tables)}, not {STEPS}"


def verl_reference(shared, mlflow_uri: str, style: str, place: str, capfd, monkeypatch, ray_join) -> Cell:
    """verl's own run of (style, place), made again (at most twice more) where verl's trackers lost its end."""
    lacks = []
    for attempt in range(3):
        verl = Cell(shared, mlflow_uri, f"{style}-{place.replace('_', '-')}-verl{attempt or ''}")
        verl.run(place, style, [], False, capfd, monkeypatch, ray_join)
        lacks.append(reference_lacks(verl))
        if not lacks[-1]:
            return verl
    raise AssertionError(f"verl's own run lacked its end three times: {lacks}")


FINISHED = {"mlflow": "FINISHED", "wandb": "exit_code=0", "swanlab": "FINISHED"}
"""How each tracker that keeps a run's end says it ended cleanly."""


def assert_ended_as_verl(tracker: str, verl: Stored, ours: Stored) -> None:
    """tracklane's run ended cleanly (wandb: its exit record), as verl's did where verl's was ended at all."""
    if tracker in FINISHED:
        assert ours.status == FINISHED[tracker], f"{tracker}: tracklane's run ended {ours.status}"
        assert verl.status in (FINISHED[tracker], None, "RUNNING"), f"{tracker}: verl's run ended {verl.status}"


def assert_same_wandb_tables(verl: Cell, ours: Cell, style: str) -> None:
    """verl's validation generations (and v1's DAPO counts) reach tracklane's wandb run, row for row."""
    from tracklane.verl.dapo_reward_logger import KEY as DAPO_KEY
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_media

    theirs = read_wandb_media(verl.stores.root / "wandb")
    mine = read_wandb_media(ours.stores.root / "wandb")
    tables = theirs.table_rows("val/generations")  # verl re-logs its whole table at each validation
    last = tables[max(tables)]
    verl_rows = sorted((row[0], *row[1 + 3 * i:4 + 3 * i]) for row in last for i in range((len(row) - 1) // 3))
    our_rows = sorted(tuple(row) for rows in mine.table_rows("val/generations").values() for row in rows)
    assert our_rows == verl_rows and len(verl_rows) == 2 * len(last)
    if style == "v1":
        verl_dapo = {step: [row[1] for row in rows] for step, rows in theirs.table_rows(DAPO_KEY).items()}
        our_dapo = {step: [row[1] for row in rows] for step, rows in mine.table_rows(DAPO_KEY).items()}
        assert our_dapo == verl_dapo and verl_dapo


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("place", ["in_process", "actor"])
@pytest.mark.parametrize("style", list(STYLES))
def test_tracklane_stores_every_point_verls_tracking_stores(style, place, mode, shared, references, mlflow_server_uri,
                                                           ray_session, ray_join, capfd, monkeypatch):
    """verl's own trainer code, tracklane swapped in: each tracker holds every point verl's Tracking stored."""
    mlflow_uri = shared["sqlite"] if place == "in_process" else mlflow_server_uri
    key = (style, place)
    if key not in references:
        references[key] = verl_reference(shared, mlflow_uri, style, place, capfd, monkeypatch, ray_join)
    verl = references[key]
    ours = Cell(shared, mlflow_uri, f"{style}-{place.replace('_', '-')}-{mode}")
    ours.run(place, style, MODES[mode], True, capfd, monkeypatch, ray_join)
    assert "Connection lost" not in ours.output
    logged = verl.read("file")
    for tracker in TRACKERS:
        theirs, mine = verl.read(tracker), ours.read(tracker)
        assert_holds_every_point(tracker, theirs, mine, logged)
        assert_ended_as_verl(tracker, theirs, mine)
    assert_same_wandb_tables(verl, ours, style)


def test_a_verl_config_naming_rl_insight_runs_with_one_warning(shared, capfd, monkeypatch, caplog, ray_session):
    """verl's trainer with ``rl_insight`` among its loggers (no rl-insight package here) runs under tracklane as
    under verl: every step in the file, one warning that the prometheus backend serves it instead."""
    cell = Cell(shared, shared["sqlite"], "rl-insight")
    cell.run("in_process", "v0", ["trainer.logger=[console,file,rl_insight]", "+trainer.log_async=true"], True,
             capfd, monkeypatch, {})
    assert {step for step, _ in cell.read("file").points} == set(range(STEPS + 1))
    warned = [r.getMessage() for r in caplog.records if "backend rl_insight" in r.getMessage()]
    assert len(warned) == 1 and "served by tracklane's `prometheus` backend instead" in warned[0]
