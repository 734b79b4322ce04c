"""A test server as a process group of its own: start a command, wait until its loopback port answers, stop the group.

``mlflow_server`` and ``tensorboard_server`` start theirs with it. The command runs in a new session (its own
process group), its output in a log file; ``start`` returns once an HTTP GET of a path on the port answers 200,
and fails (after stopping the group) when the process exits first or the deadline passes, with the log's tail
in the error. Stopping ends the whole group, so whatever the server forked (workers, a data server) ends too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

START_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 4000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(name: str, command: Sequence[str], port: int, probe: str, log_path: Path, *,
          timeout: float = START_TIMEOUT_S, probe_timeout: float = 2.0,
          env: Mapping[str, str] | None = None, cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Run ``command`` (serving on 127.0.0.1:``port``) as its own process group, its output in ``log_path``;
    return (process, ``http://127.0.0.1:<port>``) once ``GET <that><probe>`` answers 200.

    RuntimeError, naming the server ``name`` and quoting the log's tail, when the process exits first or
    ``timeout`` seconds pass (each probe waits ``probe_timeout``); the group is stopped before it is raised."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_answering(proc, name, url + probe, url, log_path, timeout, probe_timeout)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def _wait_answering(proc: subprocess.Popen, name: str, probe_url: str, url: str, log_path: Path,
                    timeout: float, probe_timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(probe_url, timeout=probe_timeout) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not answering after {timeout:.0f} s"
    log_tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    raise RuntimeError(f"{name} at {url} {state}; its log ({log_path}):\n{log_tail}")


def stop_group(pid: int, timeout: float = 10.0) -> None:
    """Kill the process group led by ``pid``: SIGTERM, then SIGKILL after ``timeout``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        try:  # reap the leader if it is our child, so the group can disappear
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop(proc: subprocess.Popen) -> None:
    """End the process group ``start`` began (``stop_group``) and reap its leader."""
    stop_group(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
