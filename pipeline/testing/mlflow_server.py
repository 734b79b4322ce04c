"""A real local ``mlflow server`` for tests and benchmarks: start/stop functions and a tiny CLI for CI.

    Python:   from tracklane.testing.mlflow_server import start_server, stop_server
              proc, uri = start_server(DIR); ...; stop_server(proc.pid)
    pytest:   the session fixture ``mlflow_server_uri`` (tests/conftest.py) is built on these
    CI:       python -m tracklane.testing.mlflow_server start DIR   -> prints the URI, writes DIR/server.pid
              export TRACKLANE_TEST_MLFLOW_URI=...                 (the fixture then reuses that server)
              python -m tracklane.testing.mlflow_server stop DIR

The server runs with one worker, a sqlite backend store in DIR and proxied artifacts, in its own
process group so stopping it also ends the workers it forked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tracklane.testing.server_process import START_TIMEOUT_S, free_port, start, stop_group

URI_ENV = "TRACKLANE_TEST_MLFLOW_URI"
"""When set, the URI of a running server that the tests reuse instead of starting their own."""


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
    return start("mlflow server", command, port, "/health", root / "server.log", timeout=timeout, env=env, cwd=root)


def stop_server(pid: int, timeout: float = 10.0) -> None:
    """Kill the server's process group: SIGTERM, then SIGKILL after ``timeout``."""
    stop_group(pid, timeout)


def main(argv: list[str]) -> int:
    """The CLI: ``start DIR`` starts a server and prints its URI, ``stop DIR`` stops the one started there."""
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python -m tracklane.testing.mlflow_server start|stop DIR", file=sys.stderr)
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
