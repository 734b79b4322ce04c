"""Shared fixtures: one Ray session for the whole test run, trackers kept offline and inside tmp."""

from __future__ import annotations

import os
import tempfile

import pytest

from tracklane.testing.mlflow_server import URI_ENV, start_server, stop_server

# Every Ray process the tests start (here, in Tracking, in subprocesses) binds 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# A ray.init() without an address (here, and in every child process a test starts) starts its own Ray: without
# this it joins the cluster named in /tmp/ray/ray_current_cluster, which a two-node test's Cluster writes while it
# runs (with pytest-xdist, beside the other workers' tests). A child meant to join names its address (ray_join).
os.environ.setdefault("RAY_ADDRESS", "local")
# Spools of runs whose config names no folder go under one temp folder, not the checkout.
os.environ.setdefault("TRACKLANE_SPOOL_ROOT", tempfile.mkdtemp(prefix="tracklane-test-spools-"))
# Tests compare every point logged; system metrics (on by default, every 10 s) are checked by the tests
# that ask for them in their config.
os.environ.setdefault("TRACKLANE_SYSTEM_METRICS_S", "0")
# A prometheus backend (or rl_insight, served by it) a test does not give a port serves on one the OS picks: two
# test workers never race for the default port.
os.environ.setdefault("TRACKLANE_PROMETHEUS_PORT", "0")


@pytest.fixture(scope="session")
def mlflow_server_uri(tmp_path_factory: pytest.TempPathFactory):
    """The URI of a running MLflow tracking server, shared by the whole test session."""
    if os.environ.get(URI_ENV):
        yield os.environ[URI_ENV]
        return
    proc, uri = start_server(tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield uri
    finally:
        stop_server(proc.pid)
        proc.wait(timeout=5)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every test that needs it: startup costs seconds on this machine."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_join(ray_session) -> dict[str, str]:
    """The environment for a child process (a benchmark, a verl driver) to join the test session's Ray instead of
    starting its own (~4 s each here).

    Ray's token authentication reads the token from $HOME, which a test may have moved since this Ray started,
    so the session's own token goes along; with no token to give, each benchmark starts its own Ray as before."""
    env = {"RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return env
    try:
        from ray._raylet import AuthenticationTokenLoader  # the token this process authenticates with
    except ImportError:
        return {}
    return {**env, "RAY_AUTH_TOKEN": AuthenticationTokenLoader.instance().get_raw_token()}


@pytest.fixture
def offline_trackers(tmp_path, monkeypatch):
    """Every tracker offline and writing under tmp_path; returns the folders used."""
    dirs = {name: tmp_path / name for name in ("wandb", "wandb-data", "wandb-cache", "wandb-config",
                                                "swanlog", "swanlab-home", "tensorboard", "trackio",
                                                "clearml-cache", "fake-home")}
    for folder in dirs.values():
        folder.mkdir()
    env = {
        "WANDB_MODE": "offline", "WANDB_DIR": dirs["wandb"], "WANDB_DATA_DIR": dirs["wandb-data"],
        "WANDB_CACHE_DIR": dirs["wandb-cache"], "WANDB_CONFIG_DIR": dirs["wandb-config"],
        "WANDB_SILENT": "true", "SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": dirs["swanlog"],
        "SWANLAB_SAVE_DIR": dirs["swanlab-home"], "TENSORBOARD_DIR": dirs["tensorboard"],
        "VERL_FILE_LOGGER_PATH": tmp_path / "metrics.jsonl",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "TRACKIO_DIR": dirs["trackio"],
        # ClearML offline, its sessions in <tmp>/clearml-cache/offline/<task id>/, no config file read, and its
        # $HOME/.clearml/.session.json under tmp (no variable moves that one).
        "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": dirs["clearml-cache"],
        "CLEARML_CONFIG_FILE": tmp_path / "clearml.conf", "HOME": dirs["fake-home"],
    }
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    for name in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID",
                 "TRACKIO_TRACE_SESSIONS_DIR", "TRACKIO_STORAGE_MODE",  # trackio stays in its local store under tmp
                 "CLEARML_API_HOST", "CLEARML_API_ACCESS_KEY", "CLEARML_API_SECRET_KEY", "CLEARML_AUTH_TOKEN",
                 "CLEARML_TASK_ID", "CLEARML_PROC_MASTER_ID", "CLEARML_SET_ITERATION_OFFSET",
                 "CLEARML_DEFERRED_TASK_INIT"):  # ClearML never thinks a server or an agent is there
        monkeypatch.delenv(name, raising=False)
    dirs["file"] = tmp_path / "metrics.jsonl"
    dirs["mlflow_uri"] = env["MLFLOW_TRACKING_URI"]
    return dirs


def verl_metrics(step: int, keys: int = 100) -> dict:
    """A verl-shaped metrics dict: families as verl names them, numpy floats, ints, a NaN."""
    import numpy as np

    families = ["actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm", "critic/score/mean",
                "critic/rewards/max", "response_length/mean", "timing_s/gen", "timing_s/update_actor",
                "timing_per_token_ms/gen", "perf/throughput", "val-core/gsm8k/acc/mean@4"]
    out: dict = {}
    for i in range(keys):
        name = families[i % len(families)] + ("" if i < len(families) else f"_{i}")
        value = (step + 1) * 0.001 * (i + 1)
        out[name] = np.float64(value) if i % 3 == 0 else value
    out["training/global_step"] = step
    out["actor/pg_clipfrac"] = float("nan") if step % 7 == 0 else 0.5
    return out


def log_verl_steps(tracking, steps: int) -> dict[int, dict[str, float]]:
    """Log ``steps`` verl-shaped dicts; return what was logged, as floats, for comparing with what arrived."""
    logged = {}
    for step in range(steps):
        data = verl_metrics(step)
        logged[step] = {k: float(v) for k, v in data.items()}
        tracking.log(data, step=step)
    return logged


def same_value(a: float, b: float) -> bool:
    """Equality that treats NaN as equal to NaN (and tolerates float32 storage when asked)."""
    if a != a and b != b:
        return True
    return a == b


def write_two_artifact_versions(sink, folder, time: float) -> None:
    """A file (``config.yaml``) and a folder (``global_step/actor/model.pt``) written to ``sink`` under one name
    each at steps 50 and 100, with contents that tell the steps apart; then the sink is closed."""
    from tracklane.core.records import Artifact

    for step in (50, 100):
        logged = folder / f"logged_{step}"
        (logged / "global_step" / "actor").mkdir(parents=True)
        (logged / "config.yaml").write_text(f"step: {step}")
        (logged / "global_step" / "actor" / "model.pt").write_bytes(bytes([step]) * 8)
        sink.write([Artifact(step=step, path=str(logged / "config.yaml"), name="config", type="config", time=time),
                    Artifact(step=step, path=str(logged / "global_step"), name="checkpoint", type="checkpoint",
                             time=time)])
    sink.close(0)


# The longest modules first (measured with --durations, 2026-12-03), so pytest-xdist's loadscope hands them out
# at the start and the short ones fill in around them: started last, the verl cells (~4 min) ran alone at the end.
_LONGEST_FIRST = ("test_verl_side_by_side.py", "test_benchmarks.py", "test_faults.py", "test_async_pipeline.py",
                  "test_delivery.py", "test_store_creation.py", "test_migrate.py", "test_trainer.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: every module keeps its own order


@pytest.fixture
def mlflow_proxy(mlflow_server_uri, offline_trackers, monkeypatch):
    """A started loopback proxy in front of the session's MLflow server, MLflow's client pointed at it: cut it to
    make the real server "go down"."""
    from urllib.parse import urlsplit

    from tracklane.testing.tcp_proxy import TcpProxy

    server = urlsplit(mlflow_server_uri)
    with TcpProxy(server.hostname, server.port) as proxy:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://{proxy.address}")
        # MLflow's HTTP client retries a failed request itself (7 times, exponential backoff: minutes) and waits
        # up to 120 s for a response: either would hide an outage from tracklane's own retries, under test here.
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        yield proxy
