"""``tracklane view PATH [--host H] [--port P]``: serve a run's rollouts to a local browser until Ctrl-C."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from tracklane.view.run_data import RunData
from tracklane.view.server import make_server

log = logging.getLogger("tracklane")
DEFAULT_PORT = 8765


def view_run(path: str, host: str, port: int, out: TextIO = sys.stdout) -> int:
    """Serve ``path`` (a spool, or a file tracker's .jsonl or folder); ConfigError if it is neither."""
    data = RunData(path)
    server = make_server(data, host, port)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("tracklane view: serving on %s: anyone who reaches this machine can read the run", host)
    print(f"tracklane view: {data.kind} {data.path}\n  open http://{host}:{server.server_port}/  (Ctrl-C stops it)",
          file=out, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
