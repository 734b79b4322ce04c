"""A real Prometheus server for tests (Debian's ``prometheus`` package): scrape targets on loopback, query back.

    from tracklane.testing.prometheus_server import start_server, query, stop_server
    proc, url = start_server(FOLDER, ["127.0.0.1:9464"]); ...; query(url, '{experiment="e"}'); stop_server(proc)

It scrapes every target each ``SCRAPE_INTERVAL`` on 127.0.0.1 only, keeps its TSDB under the folder, and answers
its HTTP API on a free loopback port; ``/-/ready`` says when it is up. Written against Prometheus 2.42 (Debian 12).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracklane.testing.server_process import free_port, start, stop

SCRAPE_INTERVAL = "1s"
BINARY_PATHS = ("/usr/bin/prometheus", "/usr/local/bin/prometheus")


def binary() -> str | None:
    """Where the ``prometheus`` server binary is, or None if it is not installed."""
    return shutil.which("prometheus") or next((path for path in BINARY_PATHS if Path(path).exists()), None)


def start_server(folder: Path, targets: Sequence[str], rule_files: Sequence[Path] = ()) -> tuple[subprocess.Popen, str]:
    """Start Prometheus scraping ``targets`` ("host:port") every second, evaluating the alerting rules of
    ``rule_files`` as often; return (process, base url) once ready."""
    program = binary()
    if program is None:
        raise RuntimeError("no prometheus binary: apt-get install -y prometheus")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                   "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(Path(path).absolute()) for path in rule_files],
        "scrape_configs": [{"job_name": "tracklane", "static_configs": [{"targets": list(targets)}]}],
    }))
    port = free_port()
    command = [program, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}"]
    return start("prometheus", command, port, "/-/ready", folder / "prometheus.log")


def query(url: str, promql: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The instant vector ``promql`` gives now (its API's ``data.result``): [{"metric": labels, "value": [t, "v"]}]."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(address, timeout=timeout) as response:
        answer = json.load(response)
    if answer.get("status") != "success":
        raise RuntimeError(f"prometheus query {promql!r} failed: {answer}")
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def alerts(url: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The alerts its rules hold now (``/api/v1/alerts``): [{"labels", "annotations", "state", "value", ...}]."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=timeout) as response:
        answer = json.load(response)
    if answer.get("status") != "success":
        raise RuntimeError(f"prometheus alerts failed: {answer}")
    result: list[dict[str, Any]] = answer["data"]["alerts"]
    return result


def stop_server(proc: subprocess.Popen) -> None:
    """End the server (SIGTERM, then SIGKILL) and reap it."""
    stop(proc)
