"""A real local ``tensorboard --logdir`` server for tests: start it on a free loopback port, stop it.

    from tracklane.testing.tensorboard_server import start_server, stop_server
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
from pathlib import Path

from tracklane.testing.server_process import START_TIMEOUT_S, free_port, start, stop

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
    return start("tensorboard", command, port, "/data/plugins_listing", log_path, timeout=timeout, probe_timeout=5)


def stop_server(proc: subprocess.Popen) -> None:
    """End the server's process group (SIGTERM, then SIGKILL) and reap the server."""
    stop(proc)
