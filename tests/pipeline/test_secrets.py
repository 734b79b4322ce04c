"""No secret leaves the trainer: not to a tracker, the spool, a log line, or Ray's actor arguments."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tracklane import Tracking
from tracklane.config.placement import lane_env
from tracklane.wire.opening import LaneOpening

pytestmark = pytest.mark.usefixtures("ray_session")

SECRETS = {
    "WANDB_API_KEY": "wandbkey-0f3c9a1e7d5b4c2a",
    "SWANLAB_API_KEY": "swankey-8e2d6b0a4c1f3e5d",
    "MLFLOW_TRACKING_TOKEN": "mlflowtok-5a7c9e1b3d0f2468",
}
CONFIG_SECRETS = {"hf_token": "hftok-1b3d5f7a9c0e2468", "db_password": "dbpw-13579bdf02468ace",
                  "openai_api_key": "sk-7f1e3d5c9b0a2468"}


def _grep(root: Path, needles: list[bytes]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}: {needle.decode()}" for needle in needles if needle in data]
    return hits


def test_no_secret_reaches_a_tracker_the_spool_a_log_line_or_ray(tmp_path, offline_trackers, monkeypatch, caplog,
                                                                  capfd):
    """Secret env vars and secret-like config keys: their values are in none of the trackers' files, the spool,
    the log output, the lane actors' start arguments or their runtime env, and Ray's session logs."""
    import ray

    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    spool = tmp_path / "spool"
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": str(spool), "flush_interval_s": 0.1}},
              "model": {"path": "m", **CONFIG_SECRETS}}
    backends = ["console", "file", "tensorboard", "mlflow", "wandb", "swanlab"]
    caplog.set_level(logging.DEBUG, logger="tracklane")
    with Tracking("secrets", "exp", backends, config=config) as tracking:
        for step in range(1, 6):
            tracking.log({"loss": 1.0 / step}, step=step)
        tracking.log_text("note", "a text record", step=5)
        tracking.flush(timeout=120)
        openings = [LaneOpening(backend=name, run=tracking.run, settings=settings, state_dir=str(spool),
                                sink_retries=1, retry_backoff_s=0.1, env=lane_env({}, os.environ)).pack()
                    for name, settings in _settings(tracking).items()]
    needles = [value.encode() for value in [*SECRETS.values(), *CONFIG_SECRETS.values()]]
    assert tracking.run.params["model"]["hf_token"] == "***REDACTED***"
    assert not _grep(tmp_path, needles)  # every tracker's store, the file logger, the spool, the mlflow db
    captured = capfd.readouterr()
    text = (captured.out + captured.err + caplog.text).encode()
    assert not [n for n in needles if n in text]  # console lines, warnings, the summary
    assert not [n for n in needles if any(n in blob for blob in openings)]  # the actors' start arguments
    forwarded = lane_env({}, os.environ)
    assert not set(SECRETS) & set(forwarded) and "WANDB_MODE" in forwarded  # the opening's env keeps only settings
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    assert not _grep(session / "logs", needles)  # Ray's own logs of this session (actor specs, runtime env)


def _settings(tracking: Tracking) -> dict:
    from tracklane.host.registry import resolve_backends

    return {name: settings for name, (_, settings) in
            resolve_backends(tracking.backends, tracking.run, os.environ, {}).items()}
