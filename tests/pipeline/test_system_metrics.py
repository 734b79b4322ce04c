"""Per-node system metrics: real psutil readings, the sampling thread, one sampler per node per run."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path

import psutil
import pytest

from tracklane import ConfigError
from tracklane.node.system_metrics import SystemSampler, claim_node, node_label

ROOT = Path(__file__).resolve().parents[2]
NON_GPU_KEYS = {"cpu/percent", "cpu/load_1m", "memory/used_gb", "memory/available_gb", "memory/percent",
                "disk/percent", "disk/read_mb_s", "disk/write_mb_s", "network/sent_mb_s", "network/recv_mb_s",
                "process/rss_gb"}
RATES = ("disk/read_mb_s", "disk/write_mb_s", "network/sent_mb_s", "network/recv_mb_s")
CHILD_CLAIM = ("import sys; from tracklane.node.system_metrics import claim_node; "
               "print('held' if claim_node(sys.argv[1], sys.argv[2]) else 'none')")


def _ignore(values: dict[str, float], elapsed_s: int) -> None:
    pass


def _wait_for(condition, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def _run_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def _child_claims(run_id: str, node: str) -> str:
    argv = [sys.executable, "-c", CHILD_CLAIM, run_id, node]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def _nvml_device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:  # no package, no driver or no device: no GPU here
        return 0


def test_sample_has_every_non_gpu_key_in_range(tmp_path):
    """One sample() holds every non-GPU figure, each within what the machine can show."""
    values = SystemSampler(_ignore, "n", 1.0, time.time(), disk_path=str(tmp_path)).sample()
    assert NON_GPU_KEYS <= set(values)
    assert all(type(value) is float for value in values.values())
    assert 0.0 <= values["cpu/percent"] <= 100.0 * (psutil.cpu_count() or 1)
    assert values["cpu/load_1m"] >= 0.0
    assert values["memory/used_gb"] > 0.0 and values["memory/available_gb"] > 0.0
    assert 0.0 <= values["memory/percent"] <= 100.0 and 0.0 <= values["disk/percent"] <= 100.0
    assert all(values[rate] >= 0.0 for rate in RATES)
    assert 0.0 < values["process/rss_gb"] < psutil.virtual_memory().total / (1 << 30)


def test_disk_write_rate_sees_a_fsynced_write(tmp_path):
    """50 MiB written and fsynced after construction show in the first sample's disk/write_mb_s.

    Disk rather than loopback traffic: the network figures leave loopback out on purpose, and
    /proc/diskstats counts a fsynced write exactly on this machine's ext4 (tmp_path is not tmpfs).
    """
    mounts = [p for p in psutil.disk_partitions(all=True) if str(tmp_path).startswith(p.mountpoint)]
    if mounts and max(mounts, key=lambda p: len(p.mountpoint)).fstype in ("tmpfs", "ramfs"):
        pytest.skip("tmp_path is in memory: no disk sees the write")
    constructed = time.monotonic()
    sampler = SystemSampler(_ignore, "n", 1.0, time.time())
    with open(tmp_path / "blob", "wb") as file:
        file.write(bytes(50 << 20))
        file.flush()
        os.fsync(file.fileno())
    values = sampler.sample()
    seconds = time.monotonic() - constructed  # at least the span the rate was taken over
    if "disk/write_mb_s" not in values:
        pytest.skip("psutil finds no disk counters here")
    assert values["disk/write_mb_s"] * seconds >= 40.0  # MiB; the rate is over a shorter span, so this errs low


def test_a_failing_reading_is_left_out_and_warned_once(tmp_path, caplog):
    """A disk_path that does not exist costs disk/percent only, with one warning however many samples."""
    sampler = SystemSampler(_ignore, "n", 1.0, time.time(), disk_path=str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        samples = [sampler.sample() for _ in range(3)]
    assert all("disk/percent" not in values and NON_GPU_KEYS - {"disk/percent"} <= set(values) for values in samples)
    warnings = [r.getMessage() for r in caplog.records if "disk/percent" in r.getMessage()]
    assert warnings == ["tracklane: reading system metric disk/percent failed (warned once); left out"]


def test_start_emits_now_and_every_interval():
    """interval_s=0.2 gives at least 3 emits in a second: prefixed keys, whole seconds that never go back."""
    emitted: list[tuple[dict[str, float], int]] = []
    sampler = SystemSampler(lambda values, elapsed: emitted.append((values, elapsed)), "host-abc123", 0.2,
                            time.time() - 5).start()
    try:
        assert _wait_for(lambda: len(emitted) >= 1, timeout=0.5)  # the first one comes right away
        assert "tracklane-system-metrics" in {t.name for t in threading.enumerate() if t.daemon}
        time.sleep(1.0)
    finally:
        sampler.stop()
    assert len(emitted) >= 3
    elapsed = [seconds for _, seconds in emitted]
    assert all(type(s) is int for s in elapsed) and elapsed == sorted(elapsed) and elapsed[0] >= 5
    assert all(key.startswith("system/host-abc123/") for values, _ in emitted for key in values)
    assert {f"system/host-abc123/{name}" for name in NON_GPU_KEYS} <= set(emitted[-1][0])


def test_stop_is_prompt_final_and_idempotent():
    """stop() returns in well under a second, no emit follows it, and a second stop() is harmless."""
    emitted: list[int] = []
    sampler = SystemSampler(lambda values, elapsed: emitted.append(elapsed), "n", 0.2, time.time())
    sampler.stop()  # before start: nothing to stop
    sampler.start()
    assert _wait_for(lambda: len(emitted) >= 1)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 0.3
    count = len(emitted)
    time.sleep(0.5)
    assert len(emitted) == count
    assert "tracklane-system-metrics" not in {t.name for t in threading.enumerate()}
    sampler.stop()


def test_an_emit_that_raises_does_not_stop_sampling(caplog):
    """An emit that always raises is warned about once, and the thread keeps calling it."""
    calls: list[int] = []

    def failing(values: dict[str, float], elapsed: int) -> None:
        calls.append(elapsed)
        raise RuntimeError("tracker down")

    with caplog.at_level(logging.WARNING, logger="tracklane"):
        sampler = SystemSampler(failing, "n", 0.05, time.time()).start()
        try:
            assert _wait_for(lambda: len(calls) >= 3)
        finally:
            sampler.stop()
    warnings = [r for r in caplog.records if "emitting system metrics failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None


def test_interval_must_be_positive():
    """A zero interval would spin the thread: it is refused at construction."""
    with pytest.raises(ConfigError, match=r"^system metrics interval_s must be > 0, got 0$"):
        SystemSampler(_ignore, "n", 0, time.time())


def test_claim_node_is_exclusive_within_the_process():
    """A second claim in the same process fails (flock belongs to the open file); release frees the slot."""
    run_id = _run_id()
    claim = claim_node(run_id, "node-a")
    assert claim is not None
    assert claim.path == os.path.join(tempfile.gettempdir(), f"tracklane-sysmetrics-{run_id}-node-a.lock")
    assert os.stat(claim.path).st_mode & 0o777 == 0o600
    try:
        assert claim_node(run_id, "node-a") is None
        other_run, other_node = claim_node(_run_id(), "node-a"), claim_node(run_id, "node-b")
        assert other_run is not None and other_node is not None  # another run, or another node: no conflict
        other_run.release()
        other_node.release()
    finally:
        claim.release()
    again = claim_node(run_id, "node-a")
    assert again is not None
    again.release()
    again.release()  # idempotent
    assert not os.path.exists(again.path)  # a released claim leaves no file behind


def test_claim_node_is_exclusive_across_processes():
    """While this process holds the slot a child process cannot take it; after release() it can."""
    run_id, other_run = _run_id(), _run_id()
    claim = claim_node(run_id, "node-a")
    assert claim is not None
    try:
        assert _child_claims(run_id, "node-a") == "none"
        assert _child_claims(other_run, "node-a") == "held"  # another run's slot is free
    finally:
        claim.release()
    assert _child_claims(run_id, "node-a") == "held"
    for run in (run_id, other_run):  # the children exited holding their claims: the locks died with them
        after = claim_node(run, "node-a")
        assert after is not None
        after.release()  # and the files go


def test_odd_run_ids_make_safe_lock_file_names():
    """A run id with slashes and spaces becomes one file name inside the temp folder."""
    claim = claim_node("team/exp 1:run#2", "node-a")
    assert claim is not None
    try:
        assert claim.path == os.path.join(tempfile.gettempdir(), "tracklane-sysmetrics-team_exp_1_run_2-node-a.lock")
    finally:
        claim.release()


def test_node_label_is_the_sanitised_hostname_plus_the_ray_id():
    """Without a Ray node id the label is the hostname; with one, 6 of its chars follow; odd chars become _."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    assert node_label() == host and node_label("") == host
    assert node_label("a/b c:ef0123456789") == f"{host}-a_b_c_"
    assert node_label("0a1b2c3d4e5f" * 4) == f"{host}-0a1b2c"
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", node_label("é€!?"))


def test_no_gpu_keys_without_pynvml(monkeypatch):
    """With nvidia-ml-py not importable a sample has no gpu/ key, and sampling works as before."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    values = SystemSampler(_ignore, "n", 1.0, time.time()).sample()
    assert NON_GPU_KEYS <= set(values) and not any(key.startswith("gpu/") for key in values)


def _fake_nvml(devices: int, init_fails: bool = False) -> types.ModuleType:
    """A stand-in for nvidia-ml-py: device 1 has no power sensor; with init_fails there is no driver."""

    class NVMLError(Exception):
        pass

    def init() -> None:
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def power(handle: int) -> int:
        if handle == 1:
            raise NVMLError("Not Supported")
        return 251_500  # milliwatts

    nvml = types.ModuleType("pynvml")
    nvml.__dict__.update(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, nvmlInit=init, nvmlDeviceGetCount=lambda: devices,
        nvmlDeviceGetHandleByIndex=lambda index: index, nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=40 + handle, memory=3),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=2 << 30, free=6 << 30, total=8 << 30),
        nvmlDeviceGetTemperature=lambda handle, sensor: 55 if sensor == 0 else -1)
    return nvml


def test_gpu_figures_per_device_in_their_units(monkeypatch, caplog):
    """Each device NVML lists gets its five figures in %, GiB, C and W; a reading it lacks is left out, warned once."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(2))
    sampler = SystemSampler(_ignore, "n", 1.0, time.time())
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        samples = [sampler.sample() for _ in range(2)]
    for values in samples:
        assert {k: v for k, v in values.items() if k.startswith("gpu/")} == {
            "gpu/0/util_percent": 40.0, "gpu/0/memory_used_gb": 2.0, "gpu/0/memory_percent": 25.0,
            "gpu/0/temperature_c": 55.0, "gpu/0/power_w": 251.5,
            "gpu/1/util_percent": 41.0, "gpu/1/memory_used_gb": 2.0, "gpu/1/memory_percent": 25.0,
            "gpu/1/temperature_c": 55.0}
        assert NON_GPU_KEYS <= set(values)
    assert [r.getMessage() for r in caplog.records] == [
        "tracklane: reading system metric gpu/1/power_w failed (warned once); left out"]


def test_no_gpu_keys_and_no_warning_without_a_driver(monkeypatch, caplog):
    """nvmlInit failing (no driver) means no gpu/ key and nothing above a debug line."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(2, init_fails=True))
    with caplog.at_level(logging.INFO, logger="tracklane"):
        values = SystemSampler(_ignore, "n", 1.0, time.time()).sample()
    assert NON_GPU_KEYS <= set(values) and not any(key.startswith("gpu/") for key in values)
    assert caplog.records == []


def test_gpu_keys_are_what_nvml_sees():
    """One set of gpu/<i>/ figures per device NVML reports (none with no driver or device), in range."""
    count = _nvml_device_count()
    values = SystemSampler(_ignore, "n", 1.0, time.time()).sample()
    names = ("util_percent", "memory_used_gb", "memory_percent", "temperature_c", "power_w")
    gpu_keys = {key for key in values if key.startswith("gpu/")}
    assert gpu_keys <= {f"gpu/{i}/{name}" for i in range(count) for name in names}
    if count:  # a reading a device does not support (power on some boards) may be left out, not the rest
        assert {f"gpu/{i}/memory_used_gb" for i in range(count)} <= gpu_keys
        for i in range(count):
            assert 0.0 <= values.get(f"gpu/{i}/util_percent", 0.0) <= 100.0
            assert 0.0 <= values[f"gpu/{i}/memory_percent"] <= 100.0
            assert 0.0 < values.get(f"gpu/{i}/temperature_c", 50.0) < 130.0


def test_cpu_percent_sees_a_busy_core_from_the_sampler_thread():
    """The first sample taken on the sampler's own thread reflects the load since construction (psutil's
    cpu_percent(interval=None) keeps its reference per thread, and said 0.0 there)."""
    import threading
    import time

    from tracklane.node.system_metrics import SystemSampler

    got = []
    sampler = SystemSampler(lambda values, _: got.append(values), "n", 60.0, time.time())
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:  # one core busy for a second
        pass
    thread = threading.Thread(target=lambda: got.append(sampler.sample()))
    thread.start()
    thread.join()
    assert got[0]["cpu/percent"] >= 100.0 / (2 * (psutil.cpu_count() or 1))  # at least half a core's share
