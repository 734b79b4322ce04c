"""verl's rollout traces as two stores hold them: MLflow's traces, and the file tracker's ``<name>_traces`` folder.

Used by tests/e2e/test_rollout_traces.py (verl's tracing decorators on a toy agent loop) and
tests/e2e/test_verl_main_ppo.py (verl's own ``AgentLoopWorker`` in ``main_ppo``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def mlflow_calls(uri: str, project: str, run_id: str | None,
                 untagged: list[str] | None = None) -> dict[tuple, dict[str, tuple]]:
    """(step, sample, rollout) -> op name -> (status, tags of verl's, inputs, outputs) of every traced call MLflow
    holds in ``project`` (of ``run_id``'s traces, if given): verl's are spans of one trace per sample (under its
    ``agent_loop`` span), tracklane's one trace per call; both tagged with the sample's attributes as verl tags.
    A trace without them is left out, its id added to ``untagged`` (an error without that list)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(project).experiment_id
    stored = client.search_traces(locations=[experiment], run_id=run_id, max_results=500)
    out: dict[tuple, dict[str, tuple]] = {}
    for trace in stored:
        tags = {k: v for k, v in trace.info.tags.items() if k in ("sample_index", "step", "rollout_n", "validate",
                                                                  "experiment_name")}
        if untagged is not None and not {"step", "sample_index", "rollout_n"} <= tags.keys():
            untagged.append(trace.info.trace_id)
            continue
        calls = out.setdefault((tags["step"], tags["sample_index"], tags["rollout_n"]), {})
        for span in trace.data.spans:
            if span.name != "agent_loop":
                calls.setdefault(span.name, ())
                inputs = {k: v for k, v in (span.inputs or {}).items() if k != "messages"}  # (ours: chat messages)
                calls[span.name] += ((span.status.status_code.name, tuple(sorted(tags.items())),
                                      json.dumps(inputs, sort_keys=True), json.dumps(span.outputs, sort_keys=True)),)
    return out


def file_traces(metrics_path: str | os.PathLike) -> list[dict]:
    folder = Path(str(metrics_path).removesuffix(".jsonl") + "_traces")
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
