"""Read an MLflow run back through ``MlflowClient``: every stored metric point, params, status."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from . import ReadBack


def read_mlflow_run(tracking_uri: str, run_id: str) -> ReadBack:
    """Every stored occurrence of every metric (duplicates kept), the params and the run status."""
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    points: list[tuple[int, str, float]] = []
    for key in sorted(run.data.metrics):
        history = client.get_metric_history(run_id, key)
        points += [(m.step, m.key, m.value) for m in sorted(history, key=lambda m: (m.step, m.timestamp))]
    return ReadBack(points=points, params=dict(run.data.params), status=run.info.status)


def find_mlflow_run_ids(tracking_uri: str, project: str, run_name: str) -> list[str]:
    """Ids of the runs named ``run_name`` in the experiment named ``project``, oldest first."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(project)
    if experiment is None:
        return []
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"attributes.run_name = '{run_name}'",
        order_by=["attributes.start_time ASC"],
    )
    return [run.info.run_id for run in runs]
