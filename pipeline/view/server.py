"""``tracklane view``'s HTTP server: the page (shipped in ``static/``) two JSON answers and an event stream, read-only.

    GET /                   the page (index.html, app.js, app.css: no CDN, no build step)
    GET /api/run            the run, its steps' summaries, its health alerts and charted step metrics (re-read
                            when the run's files changed)
    GET /api/step/<step>    that step's trajectories, validation generations and rollout traces
    GET /api/runs           every run served (the first, browsed, and up to 3 compared): its name, charted step
                            metrics and alerts, for the overlaid curves
    GET /api/events         server-sent events: the /api/run answer once, then again each time the run changed
                            (the page follows a run being written without asking every second)

Python's own ``http.server`` (``ThreadingHTTPServer``): a page, two GETs and one stream for a local browser need no
framework, and the viewer then installs nothing beyond tracklane. Anything but GET is refused (405); the server
never writes to the run.
"""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tracklane.core.values import finite_or_none
from tracklane.view.run_data import RunData

log = logging.getLogger("tracklane")
EVENTS_CHECK_S = 0.5  # how often an events stream looks whether the run was read again (RunData re-reads at most 1/s)
EVENTS_KEEPALIVE_S = 15.0  # a comment line this often keeps proxies and the browser from closing an idle stream
STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def make_server(data: RunData | list[RunData], host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A server for ``data`` (a run, or runs: the first browsed, the others compared with it; ``?run=K`` picks one
    for /api/step) bound to host:port (0: a free one, ``server.server_port``); call ``serve_forever``."""
    runs = data if isinstance(data, list) else [data]
    handler = type("ViewHandler", (_Handler,), {"runs": runs})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class _Handler(BaseHTTPRequestHandler):
    runs: list[RunData]
    server_version = "tracklane-view"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        route = parts.path
        if route == "/api/runs":
            self._json([self._overlay(index, run) for index, run in enumerate(self.runs)])
        elif route.startswith("/api/step/"):
            self._step(route.removeprefix("/api/step/"), parse_qs(parts.query).get("run", ["0"])[0])
        elif route == "/api/run":
            self._json(self._run_answer())
        elif route == "/api/events":
            self._events()
        else:
            self._static("index.html" if route == "/" else route.lstrip("/"))

    def _run_answer(self) -> dict[str, Any]:
        snapshot = self.runs[0].snapshot()
        return {"run": snapshot.run, "steps": list(snapshot.steps.values()), "read_at": snapshot.read_at,
                "error": snapshot.error, "skipped": snapshot.skipped, "alerts": snapshot.alerts, "charts": snapshot.charts}

    def _events(self) -> None:
        """An event ``run`` (the /api/run answer) now and whenever the run was read again or its error changed;
        ends when the browser goes (a write fails). One thread per open page (ThreadingHTTPServer)."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        sent: tuple[float, str] | None = None
        quiet_since = time.monotonic()
        try:
            while True:
                answer = self._run_answer()
                if (answer["read_at"], answer["error"]) != sent:
                    sent = (answer["read_at"], answer["error"])
                    self.wfile.write(b"event: run\ndata: " + json.dumps(finite_or_none(answer)).encode() + b"\n\n")
                    self.wfile.flush()
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= EVENTS_KEEPALIVE_S:
                    self.wfile.write(b": still here\n\n")
                    self.wfile.flush()
                    quiet_since = time.monotonic()
                time.sleep(EVENTS_CHECK_S)
        except (BrokenPipeError, ConnectionResetError):
            return  # the page was closed

    @staticmethod
    def _overlay(index: int, data: RunData) -> dict[str, Any]:
        snapshot = data.snapshot()
        return {"index": index, "run": snapshot.run, "charts": snapshot.charts, "alerts": snapshot.alerts,
                "steps": sorted(snapshot.steps)}

    def _step(self, text: str, run: str) -> None:
        """Step ``text`` of the run served as number ``run`` (0: the one browsed)."""
        if not run.isdigit() or int(run) >= len(self.runs):
            return self._error(HTTPStatus.NOT_FOUND, f"no run {run!r}: {len(self.runs)} served")
        try:
            step = int(text)
        except ValueError:
            return self._error(HTTPStatus.BAD_REQUEST, f"not a step: {text!r}")
        snapshot = self.runs[int(run)].snapshot()
        if step not in snapshot.steps:
            return self._error(HTTPStatus.NOT_FOUND, f"step {step} holds no rollouts, generations or traces")
        self._json({"step": step, "summary": snapshot.steps[step], "trajectories": snapshot.trajectories.get(step, []),
                    "generations": snapshot.generations.get(step, []), "traces": snapshot.traces.get(step, [])})

    def _static(self, name: str) -> None:
        path = STATIC / name
        if "/" in name or path.suffix not in _TYPES or not path.is_file():  # only the shipped files, no traversal
            return self._error(HTTPStatus.NOT_FOUND, f"no page {name!r}")
        self._send(HTTPStatus.OK, _TYPES[path.suffix], path.read_bytes())

    def _json(self, body: Any) -> None:
        self._send(HTTPStatus.OK, "application/json", json.dumps(finite_or_none(body)).encode())

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, "application/json", json.dumps({"error": message}).encode())

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the viewer only reads")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.debug("tracklane view: " + format, *args)

