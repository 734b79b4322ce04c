"""``tracklane view PATH [PATH ...] [--host H] [--port P]``: serve a run's rollouts (and up to 3 more runs to compare
with it) to a local browser until Ctrl-C."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TextIO

from tracklane.core.errors import ConfigError
from tracklane.view.run_data import RunData
from tracklane.view.server import make_server

log = logging.getLogger("tracklane")
DEFAULT_PORT = 8765
MAX_RUNS = 4


def view_run(paths: str | Sequence[str], host: str, port: int, out: TextIO = sys.stdout) -> int:
    """Serve each of ``paths`` (a spool, or a file tracker's .jsonl or folder; the first is the one browsed, the
    others compared with it); ConfigError if one is neither, or more than MAX_RUNS are named."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    if not 1 <= len(paths) <= MAX_RUNS:
        raise ConfigError(f"tracklane view compares 1 to {MAX_RUNS} runs, got {len(paths)}")
    runs = [RunData(path) for path in paths]
    data = runs[0]
    server = make_server(runs, host, port)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("tracklane view: serving on %s: anyone who reaches this machine can read the run", host)
    others = "".join(f"\n  compared with {other.kind} {other.path}" for other in runs[1:])
    print(f"tracklane view: {data.kind} {data.path}{others}\n  open http://{host}:{server.server_port}/  (Ctrl-C stops it)",
          file=out, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
