"""The seeded chaos run, short (``python -m tracklane.benchmarks.chaos --seed N --minutes M`` runs the long ones).

Rank 0 and 4 producers log into every default tracker for 30 s of run clock while a fixed seed's faults hit the
pipeline; then every tracker's own store is read back and held to the chaos run's checks
(``benchmarks/chaos_check.py``).
"""

from __future__ import annotations

import os

import pytest

from tracklane.benchmarks.chaos import Settings, run_chaos

# A trainer child with its own Ray and six lane actors, 30 s of logging, finish() and the read-back: about 60-90 s
# here when every lane recovers (a lane that does not costs finish()'s deadline on top).
pytestmark = [pytest.mark.timeout(600)]

SEED = int(os.environ.get("TRACKLANE_CHAOS_SEED", "5"))
"""(Another with TRACKLANE_CHAOS_SEED.) Seed 5: two lane kills (the file lane, then MLflow's, just after the spool's
disk was freed), an MLflow stall and cut, a producer SIGKILLed and re-created, the spool's tmpfs filled and freed,
the poison image."""
KINDS = ("lane_kill", "mlflow_cut", "mlflow_stall", "producer_kill", "disk_fill", "poison")
COUNTS = {"lane_kill": 2, "mlflow_cut": 1, "mlflow_stall": 1, "producer_kill": 1, "disk_fill": 1, "poison": 1}


@pytest.mark.slow
def test_a_short_chaos_run_keeps_every_point_once_and_names_every_loss(tmp_path, mlflow_server_uri):
    """Under lane kills, an MLflow cut and stall, a producer kill, a full spool disk and a poison record, every
    tracker holds each point logged before a kill's grace window exactly once, nothing it was not given, each
    sender's steps in order; the poison image everywhere but MLflow; and what the report names as lost (the
    killed producer's unshipped tail, a full disk's drops, MLflow's one failed record) is exactly what is missing."""
    kinds = KINDS if os.geteuid() == 0 else tuple(k for k in KINDS if k != "disk_fill")  # a tmpfs needs root
    # A kill's grace window of flush_interval_s + 1 s (the CLI's: + 0.25 s): the suite runs two modules at once on 2
    # cores, and a shipper a little late is not what this checks; the report's count of a killed producer's tail is
    # matched exactly whatever the window.
    settings = Settings(seed=SEED, minutes=0.5, kinds=kinds, counts=COUNTS, out=tmp_path, pause=0.1,
                        producer_pause=0.2, rich_every=10, grace_margin_s=1.0, finish_timeout_s=90.0,
                        mlflow_uri=mlflow_server_uri)
    result = run_chaos(settings)

    staged = {event["kind"] for event in result["events"]}
    assert {"lane_kill", "producer_kill", "poison"} <= staged, result["events"]
    assert result["mlflow_connections_refused"] > 0  # the cut happened
    for name, tracker in result["trackers"].items():
        assert "logged_points" in tracker, (name, tracker["failures"])
        # Missing only what the report names as a full disk's cost (a dead producer's batches that were only in Ray).
        assert tracker["missing_points"] == 0 or tracker.get("counted_disk_cost_records"), (name, tracker["failures"])
        assert tracker["duplicated"] == 0, (name, tracker["failures"])
        assert tracker["unexpected_points"] == tracker["wrong_values"] == tracker["torn_records"] == 0, (name, tracker)
        assert tracker["order"]["kept"] in (True, None), (name, tracker["order"])
        assert tracker["generations"]["stored"] > 0
    assert result["passed"], "\n".join(result["failures"])
