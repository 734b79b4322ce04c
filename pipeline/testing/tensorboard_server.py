"""A real local ``tensorboard --logdir`` server for tests: start it on a free loopback port, stop it.

    from pipeline.testing.tensorboard_server import start_server, stop_server
    proc, url = start_server(LOGDIR, loader="python"); ...; stop_server(proc)

Written against tensorboard 2.21.0 (with tensorboard-data-server 0.7.2 installed beside it). Its two loaders:

    "python"  ``--load_fast=false``: the Python multiplexer. With ``--reload_interval=0 --reload_task=blocking``
              (tensorboard/backend/event_processing/data_ingester.py ``start``) the whole log directory is read
              once *before* the HTTP server binds, so when ``/data/plugins_listing`` answers everything is there.
    "rust"    ``--load_fast=true``: the Rust ``tensorboard-data-server`` child process (what the default
              ``--load_fast=auto`` picks when that package is installed, as pip installs it). It loads in the
              background (``--reload=once``): the HTTP server answers before the data may be there, so a caller
              polls for what it expects.

``--samples_per_plugin`` is raised above the defaults (tensorboard/backend/event_processing/data_ingester.py
``DEFAULT_TENSOR_SIZE_GUIDANCE``: 10 images, 500 histograms, 1000 scalars; text falls back to 10 tensors) so a
test reads every event; 0 is no good: the plugins then ask the data provider for 0 samples and get none
(tensorboard/backend/event_processing/data_provider.py ``_downsample``). The server runs in its own process
group, so stopping it also ends the Rust data server it started.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pipeline.testing.mlflow_server import free_port
from pipeline.testing.mlflow_server import stop_server as stop_group

START_TIMEOUT_S = 60.0
SAMPLES_PER_PLUGIN = "scalars=100000,histograms=10000,images=10000,text=10000"
LOADER_FLAGS = {
    "python": ["--load_fast=false", "--reload_interval=0", "--reload_task=blocking"],
    "rust": ["--load_fast=true", "--reload_interval=0"],
}


def start_server(logdir: Path, loader: str = "python", timeout: float = START_TIMEOUT_S) -> tuple[subprocess.Popen, str]:
    """Start ``tensorboard --logdir logdir`` on 127.0.0.1; return (process, base url) once it answers.

    Its output goes to ``<logdir>.tensorboard.log`` (beside the log directory, not in it)."""
    if loader not in LOADER_FLAGS:
        raise ValueError(f"loader must be one of {sorted(LOADER_FLAGS)}, got {loader!r}")
    logdir = Path(logdir).resolve()
    port = free_port()
    cli = Path(sys.executable).with_name("tensorboard")
    command = [str(cli) if cli.exists() else "tensorboard", "--logdir", str(logdir), "--host", "127.0.0.1",
               "--port", str(port), f"--samples_per_plugin={SAMPLES_PER_PLUGIN}", *LOADER_FLAGS[loader]]
    log_path = logdir.with_name(logdir.name + ".tensorboard.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_answering(proc, url, log_path, timeout)
    except BaseException:
        stop_server(proc)
        raise
    return proc, url


def _wait_answering(proc: subprocess.Popen, url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not answering after {timeout:.0f} s"
    raise RuntimeError(f"tensorboard at {url} {state}; its log ({log_path}):\n{log_path.read_text(errors='replace')[-4000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """End the server's process group (SIGTERM, then SIGKILL) and reap the server."""
    stop_group(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
