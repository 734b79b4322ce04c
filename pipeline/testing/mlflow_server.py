"""A real local ``mlflow server`` for tests and benchmarks: start/stop functions and a tiny CLI for CI.

    Python:   from pipeline.testing.mlflow_server import start_server, stop_server
              proc, uri = start_server(DIR); ...; stop_server(proc.pid)
    pytest:   the session fixture ``mlflow_server_uri`` (tests/conftest.py) is built on these
    CI:       python -m pipeline.testing.mlflow_server start DIR   -> prints the URI, writes DIR/server.pid
              export TRACKLANE_TEST_MLFLOW_URI=...                 (the fixture then reuses that server)
              python -m pipeline.testing.mlflow_server stop DIR

The server runs with one worker, a sqlite backend store in DIR and proxied artifacts, in its own
process group so stopping it also ends the workers it forked.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

URI_ENV = "TRACKLANE_TEST_MLFLOW_URI"
"""When set, the URI of a running server that the tests reuse instead of starting their own."""
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(root: Path, timeout: float = START_TIMEOUT_S) -> tuple[subprocess.Popen, str]:
    """Start ``mlflow server`` with its state under ``root``; return (process, uri) once healthy."""
    root = root.resolve()
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    command = [
        str(mlflow_cli) if mlflow_cli.exists() else "mlflow", "server",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=root, start_new_session=True)
    log.close()
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, uri, root / "server.log", timeout)
    except BaseException:
        stop_server(proc.pid)
        raise
    return proc, uri


def _wait_healthy(proc: subprocess.Popen, uri: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not healthy after {timeout:.0f} s"
    log_tail = log_path.read_text(errors="replace")[-4000:]
    raise RuntimeError(f"mlflow server at {uri} {state}; its log ({log_path}):\n{log_tail}")


def stop_server(pid: int, timeout: float = 10.0) -> None:
    """Kill the server's process group: SIGTERM, then SIGKILL after ``timeout``."""
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


def main(argv: list[str]) -> int:
    """The CLI: ``start DIR`` starts a server and prints its URI, ``stop DIR`` stops the one started there."""
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python -m pipeline.testing.mlflow_server start|stop DIR", file=sys.stderr)
        return 2
    action, root = argv[0], Path(argv[1])
    pid_file = root / "server.pid"
    if action == "start":
        proc, uri = start_server(root)
        pid_file.write_text(f"{proc.pid}\n")
        print(uri)
        return 0
    if pid_file.exists():
        stop_server(int(pid_file.read_text()))
        pid_file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
