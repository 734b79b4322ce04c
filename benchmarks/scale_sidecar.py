"""The sidecar of one tracklane.benchmarks.scale run, a process of its own: it watches the file tracker and plays the slow one.

    python -m tracklane.benchmarks.scale_sidecar <metrics.jsonl> <rollout rows a step> <out.json> [<mlflow host:port> <delay s>]

Every 20 ms it reads what the file tracker appended and notes, per step, when the step's scalars first appeared
in ``metrics.jsonl`` and when its rollout file held every row (``time.time()``, the clock the trainer's process
stamps its calls with). With an MLflow address it also runs a loopback proxy in front of that server whose every
answer waits ``delay s`` (``TcpProxy.delay_s``): a slow tracker, for real. It prints the proxy's address, then
runs until its stdin closes, and writes what it saw to ``out.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

_POLL_S = 0.02


class FileWatch:
    """When each step's scalars and rollout rows reached the file tracker's files."""

    def __init__(self, metrics: Path, rows_per_step: int) -> None:
        self.metrics = metrics
        self.rollouts = Path(f"{metrics.with_suffix('')}_rollouts")
        self.rows_per_step = rows_per_step
        self.scalars_at: dict[int, float] = {}
        self.rows_at: dict[int, float] = {}
        self._offset = 0
        self._partial = b""
        self._rows: dict[int, int] = {}  # step -> newlines counted so far in its rollout file
        self._row_offsets: dict[int, int] = {}

    def poll(self) -> None:
        now = time.time()
        self._read_metrics(now)
        if self.rows_per_step:
            self._read_rollouts(now)

    def _read_metrics(self, now: float) -> None:
        try:
            with open(self.metrics, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            row = json.loads(line)
            step = row.get("step")
            if step is not None and row.get("axis") is None and any(k.startswith("scale/") for k in row["data"]):
                self.scalars_at.setdefault(int(step), now)

    def _read_rollouts(self, now: float) -> None:
        try:
            names = os.listdir(self.rollouts)
        except FileNotFoundError:
            return
        for name in names:
            step = int(name.split(".")[0])
            if step in self.rows_at:
                continue
            with open(self.rollouts / name, "rb") as handle:
                handle.seek(self._row_offsets.get(step, 0))
                data = handle.read()
            self._row_offsets[step] = self._row_offsets.get(step, 0) + len(data)
            self._rows[step] = self._rows.get(step, 0) + data.count(b"\n")
            if self._rows[step] >= self.rows_per_step:
                self.rows_at[step] = now


def main(argv: list[str]) -> None:
    metrics, rows, out = Path(argv[0]), int(argv[1]), Path(argv[2])
    proxy = None
    if len(argv) > 3:
        from tracklane.testing.tcp_proxy import TcpProxy

        host, port = argv[3].rsplit(":", 1)
        proxy = TcpProxy(host, int(port)).start()
        proxy.delay_s = float(argv[4])
        print(proxy.address, flush=True)
    else:
        print("-", flush=True)
    watch = FileWatch(metrics, rows)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        watch.poll()
        time.sleep(_POLL_S)
    watch.poll()
    out.write_text(json.dumps({"scalars_at": watch.scalars_at, "rows_at": watch.rows_at}))
    if proxy is not None:
        proxy.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
