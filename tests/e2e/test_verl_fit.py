"""tests/verl_fit.py drives verl's own fit loops on CPU fakes: what verl's own ``Tracking`` stores, run after run."""

from __future__ import annotations

import fnmatch
import importlib.util
import json

import pytest

if importlib.util.find_spec("verl") is None or importlib.util.find_spec("transfer_queue") is None:
    pytest.skip("verl 0.9.1 and TransferQueue are not installed", allow_module_level=True)

from tests.verl_fit import compose_verl_config, joined_task_runner, run_fit  # noqa: E402

STEPS = 4
TIME_DEPENDENT = ("timing_s/*", "timing_per_token_ms/*", "perf/time_per_step", "perf/throughput")
VERSIONS = [pytest.param(False, id="v0"), pytest.param(True, id="v1")]


def config(use_v1: bool, local_dir):
    return compose_verl_config([f"trainer.use_v1={str(use_v1).lower()}", "trainer.logger=[console,file]",
                                f"trainer.total_training_steps={STEPS}", f"trainer.default_local_dir={local_dir}"])


def logged(path) -> dict[int, dict]:
    """verl's file logger: one JSON line per log() call, {"step": N, "data": {...}}."""
    return {line["step"]: line["data"] for line in map(json.loads, path.read_text().splitlines())}


def untimed(data: dict) -> dict:
    return {k: v for k, v in data.items() if not any(fnmatch.fnmatch(k, p) for p in TIME_DEPENDENT)}


@pytest.fixture
def verl_calls(monkeypatch):
    """verl's own tracking classes stay in place; their finish() and the loggers' log() calls are recorded."""
    import gc

    import verl.utils.tracking as vt

    gc.collect()  # an earlier run's unfinished Tracking is finished (verl's __del__) before the spies go in
    assert vt.Tracking.__module__ == "verl.utils.tracking", "another test swapped verl's Tracking in this process"
    calls: dict[str, list] = {"finish": [], "generations": [], "dapo": []}
    originals = (vt.Tracking.finish, vt.ValidationGenerationsLogger.log, vt.DapoFilteredRewardTableLogger.log)

    def finish(self, exit_code=0):
        calls["finish"].append(exit_code)
        return originals[0](self, exit_code=exit_code)

    def generations(self, loggers, samples, step):
        calls["generations"].append((step, len(samples)))
        return originals[1](self, loggers, samples, step)

    def dapo(self, loggers, counts, step):
        calls["dapo"].append((step, dict(counts)))
        return originals[2](self, loggers, counts, step)

    monkeypatch.setattr(vt.Tracking, "finish", finish)
    monkeypatch.setattr(vt.ValidationGenerationsLogger, "log", generations)
    monkeypatch.setattr(vt.DapoFilteredRewardTableLogger, "log", dapo)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("use_v1", VERSIONS)
def test_verls_fit_logs_validation_then_every_step_through_verls_tracking(use_v1, offline_trackers, verl_calls):
    """verl's file logger holds the validation at step 0 and steps 1..N (validation at 2 and 4); v0 never
    finishes its Tracking, v1's task runner finishes it once with exit code 0; v1's DAPO counts reach verl's logger."""
    run_fit(config(use_v1, offline_trackers["file"].parent / "ckpt"))
    finished = list(verl_calls["finish"])  # right after fit: later, garbage collection finishes what is left
    data = logged(offline_trackers["file"])
    assert sorted(data) == list(range(STEPS + 1))
    assert all(k.startswith(("val-core/", "val-aux/")) for k in data[0]) and "val-core/fake_addition/acc/mean@2" in data[0]
    for step in range(1, STEPS + 1):
        assert data[step]["training/global_step"] == step
        assert {"actor/pg_loss", "critic/score/mean", "response_length/mean", "timing_s/step"} <= set(data[step])
        assert ("val-core/fake_addition/acc/mean@2" in data[step]) == (step % 2 == 0)
    assert verl_calls["generations"] == [(0, 2), (2, 2), (4, 2)]
    assert finished == ([0] if use_v1 else [])
    assert bool(verl_calls["dapo"]) == use_v1 and all(counts for _, counts in verl_calls["dapo"])


@pytest.mark.slow
@pytest.mark.parametrize("use_v1", VERSIONS)
def test_two_runs_log_the_same_values_except_timing(use_v1, offline_trackers, tmp_path, monkeypatch, verl_calls):
    """Two runs of one config log the same keys at the same steps and the same values, timing figures aside."""
    runs = []
    for name in ("first.jsonl", "second.jsonl"):
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / name))
        run_fit(config(use_v1, tmp_path / f"ckpt-{name}"))
        runs.append(logged(tmp_path / name))
    first, second = runs
    assert {s: set(d) for s, d in first.items()} == {s: set(d) for s, d in second.items()}
    assert {s: untimed(d) for s, d in first.items()} == {s: untimed(d) for s, d in second.items()}
    assert verl_calls["generations"][:3] == verl_calls["generations"][3:]


@pytest.mark.slow
def test_fake_task_runner_runs_the_fit_inside_a_ray_actor(ray_session, offline_trackers):
    """verl's run_ppo with FakeTaskRunner (in the session's Ray) runs the fit in the actor, which writes every step."""
    from verl.trainer.main_ppo import run_ppo

    run_ppo(config(False, offline_trackers["file"].parent / "ckpt"), task_runner_class=joined_task_runner())
    assert sorted(logged(offline_trackers["file"])) == list(range(STEPS + 1))
