"""A run on a 2-node Ray cluster on this machine, lanes placed on the second node (run by test_placement.py).

    python -m tests.two_node_run OUT_DIR STEPS

Starts ``ray.cluster_utils.Cluster`` (head: the trainer; second node: the only one offering the
``logging_node`` resource), logs STEPS verl-shaped steps with the lanes placed by
``actor_options: {resources: {logging_node: 0.01}}``, and prints one JSON line: each node's id, the
node each lane ran on, what each lane reported as its "where", and whether the run was complete.
Its own process: the test suite's shared Ray session cannot join another cluster.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray process binds 127.0.0.1


def main(out: str, steps: int) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from tests.conftest import verl_metrics
    from tracklane import Tracking

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        logging_node = cluster.add_node(num_cpus=1, resources={"logging_node": 1})
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        config = {"trainer": {"log_async": True, "async_log": {
            "flush_interval_s": 0.05, "actor_options": {"resources": {"logging_node": 0.01}}}}}
        tracking = Tracking("placement", "two-nodes", ["tensorboard", "file"], config=config)
        for step in range(steps):
            tracking.log(verl_metrics(step, keys=20), step=step)
        report = tracking.finish()
        lanes = {name: info.node_id for name, info in tracking.lanes().items()}  # as of each lane's last answer
        print(json.dumps({
            "trainer_node": ray.get_runtime_context().get_node_id(), "logging_node": logging_node.node_id,
            "lanes": lanes, "where": {name: lane.where for name, lane in report.lanes.items()},
            "complete": report.complete, "summary": report.summary(),
        }), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
