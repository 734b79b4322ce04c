"""Smoke tests: each benchmark's --quick run completes and writes complete output (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TRACKERS = ["console", "wandb", "mlflow", "swanlab", "tensorboard", "file"]


def _run(name: str, out: Path, mlflow_uri: str, ray_join: dict[str, str]) -> dict:
    env = {**os.environ, "TRACKLANE_TEST_MLFLOW_URI": mlflow_uri, **ray_join}
    proc = subprocess.run([sys.executable, "-m", f"tracklane.benchmarks.{name}", "--quick", "--out", str(out),
                           "--mlflow-uri", mlflow_uri], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "wall time" in proc.stdout
    return json.loads((out / f"{name}.json").read_text())


def _assert_pngs(result: dict) -> None:
    assert result["plots"]
    for path in result["plots"]:
        assert Path(path).read_bytes()[:8] == PNG_SIGNATURE, path


@pytest.mark.slow
def test_overhead_quick(tmp_path, mlflow_server_uri, ray_join):
    """Every mode, tracker and figure is present, what was logged was read back from every tracker, verl skipped with a
    reason when absent."""
    result = _run("overhead", tmp_path, mlflow_server_uri, ray_join)
    verl_present = result["verl"]["available"]
    if importlib.util.find_spec("verl") is None:
        assert not verl_present and "pip install --no-deps verl" in result["verl"]["reason"]
    [scenario] = result["scenarios"]
    assert scenario["trackers"] == TRACKERS and set(scenario["modes"]) == {"none", "sync", "verl", "thread", "async"}
    for mode, figures in scenario["modes"].items():
        if mode == "verl" and not verl_present:
            assert "verl" in figures["skipped"]
            continue
        for key in ("ratio", "step_ms_p50", "log_us", "logging_us", "finish_s", "trainer_rss_mib", "logged"):
            assert key in figures, (mode, key)
        if mode in ("sync", "thread", "async"):
            assert set(figures["delivered"]) == set(TRACKERS)
            for tracker, got in figures["delivered"].items():
                assert got == figures["logged"], (mode, tracker, got)
    async_mode = scenario["modes"]["async"]
    assert set(async_mode["lag_ms"]) == set(TRACKERS) and set(async_mode["actors_mib"]) == set(TRACKERS)
    assert async_mode["complete"] is True
    costs = result["call_cost"]["modes"]
    for key in ("warm_us", "cold_us", "floor_warm_us", "floor_cold_us"):
        assert costs["async"][key]["n"] > 0
    assert set(result["trainer"]["modes"]) == {"none", "none_lean", "sync", "thread", "async", "async_lean", "verl"}
    assert result["trainer"]["extras_ratio_mean"] > 0
    assert result["trainer"]["modes"]["verl"]["skipped"]
    assert {t["name"] for t in result["targets"]} >= {"async log() p50, ~2 ms between calls"}
    _assert_pngs(result)


@pytest.mark.slow
def test_sweep_quick(tmp_path, mlflow_server_uri, ray_join):
    """Every grid cell has its figures, both loads and both overflow policies ran, and defaults are recommended."""
    result = _run("sweep", tmp_path, mlflow_server_uri, ray_join)
    grid = result["grid"]
    cells = {(c["load"], c["overflow"], c["queue_mib"], c["flush_s"]) for c in result["cells"]}
    for q in grid["queue_mib"]:
        for f in grid["flush_s"]:
            assert {("below", "drop_oldest", q, f), ("above", "drop_oldest", q, f), ("above", "block", q, f)} <= cells
    for c in result["cells"]:
        for key in ("ratio", "lag_p99_s", "peak_pipeline_mib", "dropped", "finish_s"):
            assert key in c
    recommended = result["recommended"]["trainer.async_log"]
    assert set(recommended) >= {"queue_max_bytes", "flush_interval_s", "overflow"} and result["recommended"]["rule"]
    _assert_pngs(result)


@pytest.mark.slow
def test_scaling_quick(tmp_path, mlflow_server_uri, ray_join):
    """Payload, rate and tracker-count series each have their points and figures."""
    result = _run("scaling", tmp_path, mlflow_server_uri, ray_join)
    assert [p["payload_bytes"] for p in result["payload"]["points"]][0] == 1024
    assert result["payload"]["points"][-1]["payload_bytes"] == 16 * 2**20
    assert [p["trackers"] for p in result["trackers"]["points"]] == [1, 6]
    for series in ("payload", "rate", "trackers"):
        for point in result[series]["points"]:
            for key in ("ratio", "call_us_p50", "call_us_p99", "dropped", "saturated"):
                assert key in point, (series, key)
    points = result["producers"]["points"]
    assert [p["producers"] for p in points] == [1, 4]
    for point in [*points, result["producers"]["two_nodes"]]:  # every producer's records logged and delivered
        assert point["complete"] and point["dropped"] == 0 and point["logged"] == 2 * point["producers"] * point["steps"]
    two = result["producers"]["two_nodes"]
    assert two["nodes"] == 2 and len(two["lanes_on"]) == 1  # producers on both nodes, the lanes on one:
    assert two["lanes_on"] != [two["driver_node"]]  # the second
    _assert_pngs(result)


@pytest.mark.slow
def test_capacity_quick(tmp_path, mlflow_server_uri, ray_join):
    """Every tracker has a bare and a lane CPU figure for scalars (SwanLab has no bare trajectories), and every
    record the lanes were given was read back from the tracker's own store."""
    result = _run("capacity", tmp_path, mlflow_server_uri, ray_join)
    rows = {(r["tracker"], r["workload"]): r for r in result["rows"]}
    assert set(rows) == {(t, w) for t in ("file", "tensorboard", "mlflow", "wandb", "swanlab")
                         for w in ("scalars", "trajectories")}
    for (tracker, workload), row in rows.items():
        assert row["complete"] and row["delivered"] == row["units"], row
        assert ("cpu_ratio" in row) == (tracker != "swanlab" or workload == "scalars"), row
        assert 0 < row["actor_busy_s"] < row["lane_s"] and row["actor_cpu_s"] > 0 and row["lane_cpu_ms_per_1k"] > 0, row
        assert row.get("bare_cpu_ms_per_1k", 1.0) > 0, row
    assert [c["workload"] for c in result["pipeline"]] == ["scalars", "trajectories"]
    for ceiling in result["pipeline"]:  # the pipeline alone: every value counted by the discarding sink
        assert ceiling["complete"] and ceiling["delivered"] == ceiling["units"] > 0, ceiling
    _assert_pngs(result)


@pytest.mark.slow
def test_trainer_split_quick(tmp_path, mlflow_server_uri, ray_join):
    """Both modes are split into the trainer thread's parts, the shipper shows up only in async, and the async
    run's lane actors and every tracker's run completed."""
    result = _run("trainer_split", tmp_path, mlflow_server_uri, ray_join)
    none, async_ = result["modes"]
    assert (none["mode"], async_["mode"]) == ("none", "async") and none["steps"] == async_["steps"] == 5
    for mode in (none, async_):
        parts = mode["trainer_thread_ms"]
        assert set(parts) == {"training work", "logging calls", "waiting for a CPU", "off CPU (the GIL, locks)"}
        assert parts["training work"] > 0 and mode["step_ms_mean"] > 0
    assert not none["shipper_found"] and none["trainer_process_other_threads_cpu_ms"]["shipper"] == 0
    assert async_["shipper_found"]  # its CPU may round to 0: 5 steps of a busy trainer can fall between two batches
    # every lane actor was found (its CPU over 5 steps may round to 0 ticks: with a busy trainer they fall
    # between two batches)
    # the trackers and the main job's health lane (trainer.health)
    assert set(async_["lane_cpu_ms"]) == {"tensorboard", "file", "health"} and async_["complete"] is True



@pytest.mark.slow
def test_main_job_quick(tmp_path, mlflow_server_uri, ray_join):
    """One run of `python -m tracklane.trainer` with its trackers and one with none, each timed over its own steps."""
    result = _run("main_job", tmp_path, mlflow_server_uri, ray_join)
    assert [r["mode"] for r in result["runs"]] == ["six trackers", "logger=[]"]
    for run in result["runs"]:
        assert run["steps"] == result["steps"] - result["first"] + 1 and run["median_ms"] > 0
    assert result["ratio"] == result["medians_ms"]["six trackers"] / result["medians_ms"]["logger=[]"]


@pytest.mark.slow
def test_scale_quick(tmp_path, mlflow_server_uri):
    """The scale benchmark's quick run is complete: every scalar and rollout row in the file tracker with nothing
    dropped (with and without a slow tracker), 2,000 keys a step (10,000 in the full run) in all four trackers,
    six trackers opened and finished, and every producer's point once, reduced right. Its timings are printed,
    not asserted."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}  # it runs its own clusters
    proc = subprocess.run([sys.executable, "-m", "tracklane.benchmarks.scale", "--quick", "--out", str(tmp_path),
                           "--mlflow-uri", mlflow_server_uri], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"scale failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads((tmp_path / "scale.json").read_text())
    assert [p["slow"] for p in result["dumps"]] == [False, True]
    for point in result["dumps"]:
        assert "error" not in point, point["error"]
        stored = point["stored"]
        assert point["dropped"] == 0 and point["complete"], point
        assert stored["scalars"] == stored["scalars_logged"] > 0 and stored["rows"] == stored["rows_logged"] > 0, point
    for point in result["keys"]:
        assert "error" not in point, point["error"]
        assert point["dropped"] == 0 and point["stored"] == dict.fromkeys(point["stored"], point["logged"]), point
        assert set(point["stored"]) == {"mlflow", "wandb", "tensorboard", "file"}
    assert all(point["complete"] for point in result["lifecycle"]), result["lifecycle"]
    assert [p["producers"] for p in result["producers"]] == [0, 1, 2, 4]
    for point in result["producers"]:
        check = point["check"]
        assert check["once"] == check["expected"] > 0 and check["twice"] == check["wrong"] == 0, point
        assert point["complete"] and point["nodes"] == min(2, point["producers"]), point
    _assert_pngs(result)


@pytest.mark.slow
def test_health_cost_runs_both_settings(ray_join):
    """One round of the health-cost benchmark: both settings measured, the rules judged (the synthetic scalars fire
    rules with health on, none off) and the health actor's CPU counted."""
    proc = subprocess.run([sys.executable, "-m", "tracklane.benchmarks.health_cost", "--rounds", "1", "--steps", "20"],
                          cwd=ROOT, env={**os.environ, **ray_join}, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["off"]["alerts"] == 0 and result["on"]["alerts"] >= 1
    assert result["off"]["log_us"]["n"] == result["on"]["log_us"]["n"] == 20
    assert result["on"]["health_actor_cpu_s"] > 0 and set(result["ratio_on_off"]) == {"log_p50", "log_p99", "trainer_cpu"}
