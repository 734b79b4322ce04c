"""Per-node system metrics (CPU, memory, disk, network, this process, GPUs) sampled on a thread.

``SystemSampler`` reads them every ``interval_s`` and hands them to ``emit`` with the seconds since
the run started, for a wall-clock axis. ``claim_node`` makes it one sampler per node per run, however
many processes of the run share the node. A reading that fails is left out of its sample and warned
about once; nothing here raises into the training process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from tracklane.core.errors import ConfigError
from tracklane.core.files import same_file

log = logging.getLogger("tracklane")

_GB = float(1 << 30)  # binary units: GiB and MiB
_MB = float(1 << 20)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_LOOPBACK = ("lo", "lo0")  # traffic to the node itself (Ray's local gRPC) is not the network's
_NAME_LIMIT = 100  # keeps a lock file's name well under the 255 bytes a file name may have


def node_label(node_id: str | None = None) -> str:
    """This node's name inside a metric key: the hostname, plus ``-`` and 6 chars of the Ray node id.

    Only ``[A-Za-z0-9_.-]`` survive (the rest become ``_``): MLflow's metric names allow only
    alphanumerics, ``_ - . /`` and space, and ``/`` already separates the key's parts.
    """
    name = socket.gethostname() or "node"
    if node_id:
        name += "-" + node_id[:6]
    return _UNSAFE.sub("_", name)


class NodeClaim:
    """An exclusive ``flock`` on this node's lock file for one run; it dies with the process."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Give the slot back. The file goes first, while still locked, so no one locks a stale file."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):  # already gone; closing still frees the slot
            os.unlink(self.path)
        os.close(fd)


def claim_node(run_id: str, node: str) -> NodeClaim | None:
    """Take this node's sampler slot for run ``run_id``; None when another process (or another claim
    in this process: ``flock`` locks belong to the open file, not the process) already holds it."""
    name = f"tracklane-sysmetrics-{_safe(run_id)}-{_safe(node)}.lock"
    path = os.path.join(tempfile.gettempdir(), name)
    try:
        for _ in range(3):  # a holder that releases unlinks the file: lock the one now at the path
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if not _lock(fd):
                return None
            if same_file(fd, path):
                return NodeClaim(fd, path)
            os.close(fd)
    except OSError:  # e.g. the file is another user's: no metrics from here, but no crash either
        log.warning("tracklane: cannot lock %s; this process samples no system metrics", path, exc_info=True)
    return None


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)[:_NAME_LIMIT]


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        os.close(fd)
        return False
    except OSError:
        os.close(fd)
        raise


class SystemSampler:
    """Samples this node on a daemon thread and calls ``emit(values, elapsed_s)``.

    ``values`` are keyed ``system/<node>/<name>``; ``elapsed_s`` is whole seconds since ``started``
    (a ``time.time()``). Rates are per second over the time since the previous sample (or since
    construction, for the first). GPUs are every device NVML sees on the node, by NVML index.
    """

    def __init__(self, emit: Callable[[dict[str, float], int], None], node: str, interval_s: float,
                 started: float, disk_path: str = ".", claim: NodeClaim | None = None) -> None:
        """The first sample at once, though the run's trackers may not be open yet (the spool holds it): a node
        that is slow to open them is what its samples should show."""
        if not interval_s > 0:
            raise ConfigError(f"system metrics interval_s must be > 0, got {interval_s!r}")
        self._emit = emit
        self._prefix = f"system/{node}/"
        self._interval = float(interval_s)
        self._started = started
        self._disk_path = disk_path
        self._claim = claim  # the node's slot, given back by stop()
        self._warned: set[str] = set()
        self._emit_failed = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()
        self._take_reference_points()
        self._readers: list[_Reader] = [
            ("cpu/percent", self._cpu), _one("cpu/load_1m", lambda: os.getloadavg()[0]), ("memory", self._memory),
            _one("disk/percent", lambda: psutil.disk_usage(self._disk_path).percent),
            ("disk", lambda: self._rates("disk", _disk_bytes, "disk/read_mb_s", "disk/write_mb_s")),
            ("network", lambda: self._rates("network", _net_bytes, "network/sent_mb_s", "network/recv_mb_s")),
            _one("process/rss_gb", lambda: self._process.memory_info().rss / _GB), *_gpu_readers()]

    def _take_reference_points(self) -> None:
        """What the first sample's rates are measured from (CPU times, disk and network counters)."""
        # Our own reference point: psutil.cpu_percent(interval=None) keeps one per thread and returned 0.0 for the
        # sampler thread's first call (its priming in the constructor's thread did not count).
        self._cpu_before = psutil.cpu_times()
        self._counters: dict[str, tuple[float, tuple[int, int]]] = {}
        for group, read in (("disk", _disk_bytes), ("network", _net_bytes)):
            try:
                self._remember(group, read)
            except Exception:
                self._warn_once(group)

    def sample(self) -> dict[str, float]:
        """One reading, keyed without the ``system/<node>/`` prefix. Not for use beside a running thread.

        Cost: 0.7-0.9 ms on a busy 2-core VM (psutil 7.2, no GPU; 1000 calls averaged), half of it
        psutil's disk counters; every tick of a 10 s interval that is under 0.01% of one core.
        """
        values: dict[str, float] = {}
        for name, read in self._readers:
            try:
                values.update(read())
            except Exception:  # one failing reading costs its own keys only
                self._warn_once(name)
        return values

    def start(self) -> SystemSampler:
        """Emit one sample now and one every ``interval_s`` after, on a daemon thread."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping = threading.Event()  # a thread left behind by stop() keeps its own, set
            self._thread = threading.Thread(target=self._run, args=(self._stopping,),
                                            name="tracklane-system-metrics", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread; once it has returned no emit follows. Safe to call more than once."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("tracklane: system metrics emit still running after %.1fs; left behind", timeout)
        if self._claim is not None:
            self._claim.release()

    # -- the thread ----------------------------------------------------------------------------
    def _run(self, stopping: threading.Event) -> None:
        due = time.monotonic()
        while not stopping.is_set():
            self._emit_one()
            due = max(due + self._interval, time.monotonic())  # a slow emit skips ticks rather than bursting
            if stopping.wait(due - time.monotonic()):
                return

    def _emit_one(self) -> None:
        try:
            values = {self._prefix + name: value for name, value in self.sample().items()}
            self._emit(values, round(time.time() - self._started))
        except Exception:  # the thread goes on sampling whatever the sink does
            if not self._emit_failed:
                self._emit_failed = True
                log.warning("tracklane: emitting system metrics failed (warned once); sampling goes on",
                            exc_info=True)

    # -- the readings ----------------------------------------------------------------------------
    def _cpu(self) -> dict[str, float]:
        """Busy share of every core since the previous sample, 0-100 (psutil's system-wide convention)."""
        now, before = psutil.cpu_times(), self._cpu_before
        self._cpu_before = now
        total = sum(now) - sum(before)
        idle = (now.idle + getattr(now, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
        return {"cpu/percent": 100.0 * max(0.0, total - idle) / total if total > 0 else 0.0}  # 0.0: no tick yet

    def _memory(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        return {"memory/used_gb": memory.used / _GB, "memory/available_gb": memory.available / _GB,
                "memory/percent": float(memory.percent)}

    def _rates(self, group: str, read: Callable[[], tuple[int, int] | None], *names: str) -> dict[str, float]:
        """MB/s of two byte counters since their last reading, as ``names``; none on the first, or without counters."""
        before = self._counters.get(group)
        now = self._remember(group, read)
        if before is None or now is None or now[0] <= before[0]:
            return {}
        per_mb_s = _MB * (now[0] - before[0])
        return {name: max(0, count - earlier) / per_mb_s for name, count, earlier in zip(names, now[1], before[1], strict=True)}

    def _remember(self, group: str, read: Callable[[], tuple[int, int] | None]) -> tuple[float, tuple[int, int]] | None:
        counters = read()
        if counters is None:
            return None
        self._counters[group] = (time.monotonic(), counters)
        return self._counters[group]

    def _warn_once(self, name: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("tracklane: reading system metric %s failed (warned once); left out", name, exc_info=True)


def _disk_bytes() -> tuple[int, int] | None:
    """Bytes read and written by every disk; None on a machine psutil finds no disks on."""
    counters = psutil.disk_io_counters()
    return None if counters is None else (counters.read_bytes, counters.write_bytes)


def _net_bytes() -> tuple[int, int] | None:
    """Bytes sent and received over every interface but loopback."""
    nics = psutil.net_io_counters(pernic=True)
    if not nics:
        return None
    outside = [counters for name, counters in nics.items() if name not in _LOOPBACK]
    return sum(c.bytes_sent for c in outside), sum(c.bytes_recv for c in outside)


_Reader = tuple[str, Callable[[], dict[str, float]]]
"""A reading's name (for its warning) and what reads it: its keys and values."""


def _one(name: str, read: Callable[[], float]) -> _Reader:
    """A reading of one figure, keyed ``name``."""
    return name, lambda: {name: float(read())}


def _gpu_readers() -> list[_Reader]:
    """A reading per GPU and figure, through NVML (the optional nvidia-ml-py); none without a driver or device."""
    try:
        import pynvml
    except ImportError:
        log.debug("tracklane: nvidia-ml-py is not installed; no GPU system metrics")
        return []
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # pynvml.NVMLError: no driver, or no device
        log.debug("tracklane: NVML is not available; no GPU system metrics", exc_info=True)
        return []
    return [reader for index, handle in enumerate(handles) for reader in _gpu(pynvml, handle, f"gpu/{index}/")]


def _gpu(nvml: Any, handle: Any, key: str) -> list[_Reader]:
    """One GPU's readings, keyed ``gpu/<NVML index>/<name>``."""

    def memory() -> dict[str, float]:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {key + "memory_used_gb": info.used / _GB, key + "memory_percent": 100.0 * info.used / info.total}

    return [_one(key + "util_percent", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu), (key + "memory", memory),
            _one(key + "temperature_c", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            _one(key + "power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)]  # from milliwatts


def start_node_sampling(put: Callable[[Any], None], run_id: str, interval_s: float, started: float,
                        node_id: str | None) -> SystemSampler | None:
    """Sample this node into the pipeline's buffer (``put``) every ``interval_s`` if no other process of the run on
    this node does yet (the sampler's ``stop`` gives the node back); None when off (0), or another process has it."""
    from tracklane.capture.captured import SYSTEM_METRICS, Captured
    from tracklane.core.values import BYTES_PER_ENTRY

    if not interval_s:
        return None
    node = node_label(node_id)
    claim = claim_node(run_id, node)
    if claim is None:
        return None

    def emit(values: dict[str, float], elapsed_s: int) -> None:
        put(Captured(elapsed_s, values, time.time(), None, SYSTEM_METRICS, len(values) * BYTES_PER_ENTRY))

    return SystemSampler(emit, node, interval_s, started, claim=claim).start()
