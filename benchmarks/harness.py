"""What every benchmark shares: the tracker environment, percentiles, memory, output files.

``BenchEnv`` keeps every tracker offline and under one temp folder, starts a real local
``mlflow server`` (unless a URI is given) and Ray (actor output not forwarded, so tables stay
readable), and gives each run folders of its own so its trackers can be read back alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tracklane.benchmarks.readback import RunPlace

ALL_TRACKERS = ["console", "wandb", "mlflow", "swanlab", "tensorboard", "file"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def common_args(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--quick", action="store_true", help="a smoke-test sized run (under 2 minutes)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks") / "results" / name,
                        help="folder for the JSON and PNG results")
    parser.add_argument("--mlflow-uri", default=os.environ.get("TRACKLANE_TEST_MLFLOW_URI"),
                        help="a running MLflow server (default: start one here)")


class BenchEnv:
    """Offline trackers, a real MLflow server and Ray, for the length of a ``with`` block."""

    def __init__(self, mlflow_uri: str | None, name: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"tracklane-{name}-"))
        self.mlflow_uri = mlflow_uri
        self._server = None
        self._runs = 0

    def __enter__(self) -> BenchEnv:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so __exit__ still stops the server
        if self.mlflow_uri is None:
            from tracklane.testing.mlflow_server import start_server

            self._server, self.mlflow_uri = start_server(self.root / "mlflow")
        os.environ.update({
            "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DATA_DIR": str(self.root / "wandb-data"),
            "WANDB_CACHE_DIR": str(self.root / "wandb-cache"), "WANDB_CONFIG_DIR": str(self.root / "wandb-config"),
            "SWANLAB_MODE": "offline", "SWANLAB_SAVE_DIR": str(self.root / "swanlab-home"),
            "MLFLOW_TRACKING_URI": self.mlflow_uri, "MLFLOW_DISABLE_TELEMETRY": "true",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        })
        os.environ.pop("MLFLOW_RUN_ID", None)
        # Only the async path samples system/* metrics (every 10 s): a run that outlives that would be read back
        # with points nobody logged, and the modes would not log the same records.
        os.environ.setdefault("TRACKLANE_SYSTEM_METRICS_S", "0")
        import ray

        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS", "local") != "local":  # join that Ray (the smoke tests pass the test session's)
                ray.init(log_to_driver=False)
            else:  # the lane actors take no CPU slot; 2 leaves room for the trainer's own
                ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        ray.shutdown()
        if self._server is not None:
            from tracklane.testing.mlflow_server import stop_server

            stop_server(self._server.pid)

    def place(self, label: str) -> RunPlace:
        """Fresh folders (and a fresh MLflow experiment) for one run; points the env variables at them."""
        self._runs += 1
        slug = f"{self._runs:03d}-{label}"
        place = RunPlace(root=self.root / "runs" / slug, project=f"bench-{os.getpid()}-{slug}", experiment=label,
                         mlflow_uri=self.mlflow_uri or "")
        for folder in (place.wandb, place.swanlog, place.tensorboard, place.rollout_dump):
            folder.mkdir(parents=True, exist_ok=True)
        os.environ.update({"WANDB_DIR": str(place.wandb), "SWANLAB_LOG_DIR": str(place.swanlog),
                           "TENSORBOARD_DIR": str(place.tensorboard), "VERL_FILE_LOGGER_PATH": str(place.file)})
        return place


# -- figures ------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def p50_p99(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    return {"p50": percentile(values, 0.5) * scale, "p99": percentile(values, 0.99) * scale, "n": len(values)}


def proc_kib(pid: int | str, field: str) -> int:
    """A ``/proc/<pid>/status`` memory figure in KiB (VmRSS now, VmHWM the peak); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """The synchronous console trackers print on the caller's thread: keep that off the tables."""
    saved, devnull = sys.stdout, open(os.devnull, "w")
    sys.stdout = devnull
    try:
        yield
    finally:
        sys.stdout = saved
        devnull.close()


class Clock:
    """Wall time of the whole benchmark, printed at the end."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


# -- output -------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """Where the figures come from; the load average says how busy the machine was with other work."""
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "loadavg_1_5_15": os.getloadavg()}


def write_json(out: Path, name: str, data: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=_plain, allow_nan=True))
    return path


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain aligned text table."""
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
