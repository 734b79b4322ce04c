"""Lanes keep to their own tracker sessions: a trainer that uses wandb itself never breaks tracklane's wandb lane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracklane.config.placement import PROCESS_BOUND_ENV, forget_process_bound, forwarded_env
from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("wandb")

# The trainer's own wandb (its run, a Hugging Face callback, a sweep agent): wandb.init sets WANDB_SERVICE in the
# trainer's environment, before Ray starts (so every Ray worker inherits it) and again while tracklane runs; the
# trainer then ends that wandb (wandb.teardown) in the middle of tracklane's run, and uses wandb again after it.
DRIVER = textwrap.dedent("""
    import json, os, sys
    import wandb
    from tracklane import Tracking

    def own_run(name, points):
        run = wandb.init(project="driver", name=name, mode="offline")
        for step in range(points):
            run.log({"own/x": float(step)}, step=step)
        return run

    before = own_run("before", 5)                        # before tracklane: Ray starts with WANDB_SERVICE set
    inherited = os.environ.get("WANDB_SERVICE", "")
    before.finish()
    tracking = Tracking("p", "lanes", ["wandb", "file"], config={"trainer": {"log_async": True}})
    during = own_run("during", 5)
    for step in range(200):
        tracking.log({"x": float(step), "y": step * 0.5}, step=step)
        if step == 60:
            tracking.flush(30)                           # the lane's wandb is open and has written
            during.finish()
            wandb.teardown()                             # the trainer's wandb-core ends here
    report = tracking.finish()
    after = own_run("after", 5)
    after.finish()
    print(json.dumps({"run_id": tracking.run_id, "complete": report.complete, "summary": report.summary(),
                      "inherited": bool(inherited), "wandb_error": report.lanes["wandb"].error}))
""")


@pytest.mark.slow
def test_a_trainer_that_runs_and_ends_its_own_wandb_leaves_the_wandb_lane_complete(offline_trackers, tmp_path):
    """The trainer's wandb before, during and after (torn down mid-run): tracklane's wandb run holds every point."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "TRACKLANE_SYSTEM_METRICS_S": "0"}
    env["RAY_ADDRESS"] = "local"  # its own Ray, started after its wandb.init: the workers inherit WANDB_SERVICE
    done = subprocess.run([sys.executable, "-c", DRIVER], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["inherited"], "the scenario needs WANDB_SERVICE set when tracklane starts"
    assert out["complete"] and out["wandb_error"] is None, out["summary"]
    assert "Connection lost" not in done.stderr
    back = read_wandb_run(offline_trackers["wandb"], out["run_id"])
    got = back.scalars()
    ours = {step: {key: got[step][key] for key in ("x", "y") if key in got[step]} for step in got}
    assert ours == {step: {"x": float(step), "y": step * 0.5} for step in range(200)}
    assert all(key.startswith("tracklane/") for points in got.values() for key in points if key not in ("x", "y"))
    assert not back.duplicates() and back.status == "exit_code=0"
    lines = [json.loads(line) for line in offline_trackers["file"].read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(200))


def test_process_bound_variables_are_never_forwarded_and_are_removed_in_a_lane():
    """WANDB_SERVICE and the other per-process session variables stay out of the lanes; settings still go."""
    env = {name: "3-1-unix-/tmp/x" for name in PROCESS_BOUND_ENV} | {"WANDB_MODE": "offline", "MLFLOW_RUN_ID": "r1"}
    assert forwarded_env(env) == {"WANDB_MODE": "offline", "MLFLOW_RUN_ID": "r1"}
    assert sorted(forget_process_bound(env)) == sorted(PROCESS_BOUND_ENV)
    assert env == {"WANDB_MODE": "offline", "MLFLOW_RUN_ID": "r1"}
