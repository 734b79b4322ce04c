"""What tracklane wrote, read back through each tracker's own server, CLI and reader (not through ours).

One run per mode (sync, and async through Ray lanes) of 50 steps into TensorBoard, MLflow (a real ``mlflow server``)
and wandb (offline): scalars with a NaN, +-Inf, large and small floats, an int and a key MLflow renames; the
hyper-parameters with a secret; validation generations at two steps; a histogram (with a NaN and an Inf); a text; an
image; an artifact file. Then, written against tensorboard 2.21.0, mlflow 3.17.2 and wandb 0.31.0:

- TensorBoard: the real ``tensorboard --logdir`` (pipeline/testing/tensorboard_server.py), with both its loaders:
  the Python multiplexer and the Rust data server (the default where tensorboard-data-server is installed), read
  over its HTTP data API, routes as in tensorboard/plugins/*/*_plugin.py: ``/data/runs``,
  ``/data/plugin/scalars/{tags,scalars}``, ``/data/plugin/histograms/{tags,histograms}``,
  ``/data/plugin/text/{tags,text}`` (``markdown=false`` gives the stored text, HTML-escaped),
  ``/data/plugin/images/{tags,images,individualImage}``. Non-finite numbers come back as the strings "NaN",
  "Infinity", "-Infinity" (tensorboard/backend/json_util.py ``Cleanse``).
- MLflow: REST behind the server (mlflow/server/handlers.py, mlflow/server/__init__.py): ``runs/search``,
  ``runs/get``, ``metrics/get-history`` (paged by ``page_token``; NaN as the string "NaN"), ``artifacts/list``, and
  downloads through both ``/get-artifact?path=&run_uuid=`` and the proxied
  ``/api/2.0/mlflow-artifacts/artifacts/<experiment>/<run>/artifacts/<path>`` (the run's artifact_uri is
  ``mlflow-artifacts:/<experiment>/<run>/artifacts`` when the server runs with ``--serve-artifacts``).
- wandb: ``wandb sync --dry-run <run folder>`` (wandb/cli/beta_sync.py: it lists the folder's ``*.wandb`` files and
  returns before logging in; it matches file names only and reads nothing, so a garbage ``run-x.wandb`` in an
  ``offline-run-...`` folder is listed as well), and ``wandb leet inspect --json [--summary]``
  (wandb/cli/leet.py runs ``wandb-core leet inspect``: wandb-core's own reader of the .wandb transaction log, one
  JSON object per record; NaN and +-Inf as the strings "NaN", "Infinity", "-Infinity").
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import io
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image as PILImage

from tracklane import Tracking
from tracklane.testing.tensorboard_server import start_server, stop_server
from tracklane.workers.testing.readers.tensorboard_reader import parse_markdown_table

BACKENDS = ["tensorboard", "mlflow", "wandb"]
EXPERIMENT = "exp"
STEPS = 50
RICH_STEP = 10
NAN_STEP, INF_STEP, NEG_INF_STEP = 7, 9, 11
SECRET = "sk-own-clients-secret-42"
GENERATIONS = {10: [("2+2=", "4", 1.0), ("héllo ✓ 世界", "line one\nline two | a pipe \\ a backslash", 0.0),
                    ("<think>why</think>", "", math.nan)],
               20: [("3+3=", "6", 1.0)]}
MARKDOWN_STEP, MARKDOWN_KEY = 30, "val/markdown"
MARKDOWN_ROWS = [("a*b*c", "def __init__(self):", 1.0), ("`x` [link](http://x)", "AT&amp;T", 0.5)]
"""Generations whose text Markdown would change if the sink did not escape it: logged under their own key."""
TEXT = "unicode ✓ text with *stars*, a <tag> & more\nsecond line"
REDACTED = "***REDACTED***"
EXPECTED_PARAMS = {  # flattened as MLflow and TensorBoard show them; values as text
    "trainer/lr": "1e-06", "trainer/total_epochs": "3", "trainer/wandb_api_key": REDACTED,
    "data/train_files/list_len": "2", "data/train_files/0": "a.parquet", "data/train_files/1": "b.parquet",
    "actor/name": "π-policy ✓",
}
MLFLOW_RENAMED = {"val-core/gsm8k/acc/mean@4": "val-core/gsm8k/acc/mean_at_4"}
HISTOGRAM_STATS = ("mean", "std", "min", "max", "count")
HTTP_TIMEOUT_S = 30


def _metrics(step: int) -> dict[str, float | int]:
    return {
        "actor/pg_loss": math.sin(step) / (step + 1),  # not exact in float32
        "actor/kl_loss": math.nan if step == NAN_STEP else step * 0.25,
        "actor/grad_norm": math.inf if step == INF_STEP else -math.inf if step == NEG_INF_STEP else 1.0 + step,
        "perf/big": 1e30 * (step + 1),  # large, inside float32's range
        "perf/huge": 1e300,  # beyond float32's range
        "perf/tiny": 1e-300,  # below float32's smallest subnormal
        "val-core/gsm8k/acc/mean@4": step / STEPS,
        "training/global_step": step,
    }


# -- one run per mode, shared by the module's tests ------------------------------------------------------------


@dataclass
class Logged:
    mode: str
    root: Path
    env: dict[str, str]
    project: str
    run_id: str
    metrics: dict[int, dict[str, float | int]]
    histogram: np.ndarray
    pixels: np.ndarray
    artifact: Path

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def wandb_run_dir(self) -> Path:
        [folder] = (self.root / "wandb" / "wandb").glob(f"offline-run-*-{self.run_id}")
        return folder

    def params(self) -> dict[str, str]:
        return {**EXPECTED_PARAMS, "trainer/log_async": str(self.mode == "async")}


def _offline_env(root: Path, mlflow_uri: str) -> dict[str, str]:
    """The environment of conftest's ``offline_trackers`` for the three trackers here, with MLflow at the server."""
    folders = {name: root / name for name in ("wandb", "wandb-data", "wandb-cache", "wandb-config", "tensorboard")}
    for folder in folders.values():
        folder.mkdir()
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(folders["wandb"]), "WANDB_DATA_DIR": str(folders["wandb-data"]),
            "WANDB_CACHE_DIR": str(folders["wandb-cache"]), "WANDB_CONFIG_DIR": str(folders["wandb-config"]),
            "WANDB_SILENT": "true", "TENSORBOARD_DIR": str(folders["tensorboard"]), "MLFLOW_TRACKING_URI": mlflow_uri}


@pytest.fixture(scope="module", params=["sync", "async"])
def logged(request, tmp_path_factory, mlflow_server_uri):
    """One run logged through ``Tracking`` into the three trackers, finished cleanly."""
    if request.param == "async":
        request.getfixturevalue("ray_session")
    root = tmp_path_factory.mktemp(f"own-clients-{request.param}")
    env = _offline_env(root, mlflow_server_uri)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        patch.delenv("MLFLOW_RUN_ID", raising=False)
        yield _log_run(root, env, request.param)


def _log_run(root: Path, env: dict[str, str], mode: str) -> Logged:
    rng = np.random.default_rng(7)
    histogram = np.concatenate([rng.normal(size=1000), [math.nan, math.inf]])
    pixels = rng.integers(0, 256, (8, 6, 3), dtype=np.uint8)
    artifact = root / "policy.ckpt"
    artifact.write_bytes(bytes(range(256)) * 40)
    config = {"trainer": {"log_async": mode == "async", "lr": 1e-6, "total_epochs": 3, "wandb_api_key": SECRET},
              "data": {"train_files": ["a.parquet", "b.parquet"]}, "actor": {"name": "π-policy ✓"}}
    project = f"own-clients-{uuid.uuid4().hex[:8]}"
    tracking = Tracking(project, EXPERIMENT, BACKENDS, config=config)
    metrics = {}
    for step in range(STEPS):
        metrics[step] = _metrics(step)
        tracking.log(metrics[step], step=step)
        if step in GENERATIONS:
            tracking.log_generations(GENERATIONS[step], step=step)
        if step == MARKDOWN_STEP:
            tracking.log_generations(MARKDOWN_ROWS, step=step, key=MARKDOWN_KEY)
        if step == RICH_STEP:
            tracking.log_histogram("critic/rewards", histogram, step=step)
            tracking.log_text("notes", TEXT, step=step)
            tracking.log_image("samples/grid", pixels, step=step)
            tracking.log_artifact(str(artifact), name="policy", type="checkpoint", step=step)
    report = tracking.finish(timeout=180)
    assert report.complete, report.summary()
    assert {name: lane.unsupported for name, lane in report.lanes.items() if lane.unsupported} == \
        {"tensorboard": {"artifact": 1}}
    return Logged(mode=mode, root=root, env=env, project=project, run_id=tracking.run_id, metrics=metrics,
                  histogram=histogram, pixels=pixels, artifact=artifact)


# -- shared expectations ----------------------------------------------------------------------------------------


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _float32(value: float) -> float:
    """The value as TensorBoard's ``simple_value`` holds it (out of float32's range: +-Inf, or 0)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _number(value: Any) -> float:
    """A JSON number, or the strings TensorBoard, MLflow and wandb-core write for NaN and +-Inf."""
    return float({"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}.get(value, value)) \
        if isinstance(value, str) else float(value)


def _user_keys(keys: Any) -> set[str]:
    """Leave out the pipeline's own vitals (``tracklane/...``), logged on the async path."""
    return {key for key in keys if not key.startswith("tracklane/")}


def _decoded(png: bytes) -> np.ndarray:
    return np.asarray(PILImage.open(io.BytesIO(png)))


def _finite_bins(values: np.ndarray) -> list[tuple[float, float, int]]:
    """numpy's 30 bins of the finite values (as every tracklane sink bins them), empty end bins left out."""
    counts, edges = np.histogram(values[np.isfinite(values)], bins=30)
    return _trim([(float(edges[i]), float(edges[i + 1]), int(counts[i])) for i in range(len(counts))])


def _trim(buckets: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    filled = [i for i, bucket in enumerate(buckets) if bucket[2]]
    return buckets[filled[0]:filled[-1] + 1] if filled else []


class _Table(html.parser.HTMLParser):
    """The rows of the HTML tables in a page: one list of cell texts (entities decoded, ``<br>`` as a line break)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _table_rows(page: str) -> list[list[str]]:
    parser = _Table()
    parser.feed(page)
    parser.close()
    return parser.rows


def _generation_cells(step: int, rows: list[tuple[str, str, float]]) -> list[list[str]]:
    return [["step", "input", "output", "score"]] + [[str(step), i, o, str(s)] for i, o, s in rows]


# -- TensorBoard ------------------------------------------------------------------------------------------------


class _TensorBoard:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, route: str, **query: Any) -> Any:
        return json.loads(self.raw(route, **query)[0])

    def raw(self, route: str, **query: Any) -> tuple[bytes, str]:
        address = f"{self.url}{route}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(address, timeout=HTTP_TIMEOUT_S) as response:
            return response.read(), response.headers.get("Content-Type", "")

    def wait_loaded(self, run: str, tag: str, points: int, timeout: float = 60.0) -> None:
        """The Rust loader reads in the background after the server answers: wait for the last scalar point."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if tag in self.get("/data/plugin/scalars/tags").get(run, {}) and \
                    len(self.get("/data/plugin/scalars/scalars", run=run, tag=tag)) >= points:
                return
            time.sleep(0.2)
        pytest.fail(f"tensorboard at {self.url} did not serve {points} points of {run}/{tag} within {timeout:.0f} s")


@pytest.fixture(scope="module", params=["python", "rust"])
def tensorboard(request, logged):
    """The real ``tensorboard --logdir`` over the run's log directory (one loader per param), stopped afterwards."""
    proc, url = start_server(logged.tensorboard_dir, loader=request.param)
    try:
        board = _TensorBoard(url)
        board.wait_loaded(".", "training/global_step", STEPS)
        yield board
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_tensorboard_serves_every_scalar_as_float32(logged, tensorboard):
    """TensorBoard's scalars API lists one run and every logged key, each with every step once and its float32 value."""
    assert tensorboard.get("/data/runs") == ["."]  # the event files sit in the log directory itself
    tags = tensorboard.get("/data/plugin/scalars/tags")
    assert list(tags) == ["."] and _user_keys(tags["."]) == set(_metrics(0))
    for key in _metrics(0):
        points = tensorboard.get("/data/plugin/scalars/scalars", run=".", tag=key)
        assert [step for _, step, _ in points] == list(range(STEPS)), key
        wrong = [(step, value) for _, step, value in points
                 if not _same(_number(value), _float32(logged.metrics[step][key]))]
        assert not wrong, f"{key}: {wrong[:3]}"
    huge = tensorboard.get("/data/plugin/scalars/scalars", run=".", tag="perf/huge")
    assert {value for _, _, value in huge} == {"Infinity"}  # float32 has no 1e300: TensorBoard shows Infinity


@pytest.mark.slow
def test_tensorboard_serves_the_histogram_bins(logged, tensorboard):
    """The histograms API holds one histogram at its step whose bins are numpy's bins of the finite values."""
    tags = tensorboard.get("/data/plugin/histograms/tags")
    assert list(tags) == ["."] and list(tags["."]) == ["critic/rewards"]
    [(_, step, buckets)] = tensorboard.get("/data/plugin/histograms/histograms", run=".", tag="critic/rewards")
    assert step == RICH_STEP
    assert sum(count for _, _, count in buckets) == 1000  # the NaN and the Inf left out
    served = _trim([(float(left), float(right), int(count)) for left, right, count in buckets])
    expected = _finite_bins(logged.histogram)
    assert [count for _, _, count in served] == [count for _, _, count in expected]
    for (left, right, _), (want_left, want_right, _) in zip(served, expected, strict=True):  # float32 edges
        assert math.isclose(left, want_left, rel_tol=1e-6, abs_tol=1e-6)
        assert math.isclose(right, want_right, rel_tol=1e-6, abs_tol=1e-6)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:html5lib's sanitizer is deprecated:DeprecationWarning")  # TensorBoard's bleach
def test_tensorboard_serves_text_generations_and_params(logged, tensorboard):
    """The text API serves the text as stored, the generations as a rendered table of the logged cells, and the params."""
    assert set(tensorboard.get("/data/plugin/text/tags")["."]) == {
        "hyperparameters", "val/generations/text_summary", f"{MARKDOWN_KEY}/text_summary", "notes/text_summary"}

    [stored] = tensorboard.get("/data/plugin/text/text", run=".", tag="notes/text_summary", markdown="false")
    assert stored["step"] == RICH_STEP and html.unescape(stored["text"]) == TEXT
    from tensorboard import plugin_util  # what the dashboard shows: TensorBoard's own Markdown rendering of it

    [shown] = tensorboard.get("/data/plugin/text/text", run=".", tag="notes/text_summary")
    assert shown["text"] == plugin_util.markdown_to_safe_html(TEXT)

    events = tensorboard.get("/data/plugin/text/text", run=".", tag="val/generations/text_summary")
    assert [event["step"] for event in events] == sorted(GENERATIONS)
    for event in events:
        assert _table_rows(event["text"]) == _generation_cells(event["step"], GENERATIONS[event["step"]])

    [params] = tensorboard.get("/data/plugin/text/text", run=".", tag="hyperparameters", markdown="false")
    raw = html.unescape(params["text"])  # the API HTML-escapes the stored markdown once more
    assert params["step"] == 0 and dict(parse_markdown_table(raw)) == logged.params()
    assert SECRET not in json.dumps(tensorboard.get("/data/plugin/text/text", run=".", tag="hyperparameters"))


@pytest.mark.slow
def test_tensorboard_shows_table_cells_literally(logged, tensorboard):
    """Generation and param cells that hold Markdown characters are shown as logged, not rendered."""
    [event] = tensorboard.get("/data/plugin/text/text", run=".", tag=f"{MARKDOWN_KEY}/text_summary")
    shown_params = {row[0]: row[1] for row in _table_rows(
        tensorboard.get("/data/plugin/text/text", run=".", tag="hyperparameters")[0]["text"])[1:]}
    assert (_table_rows(event["text"]), shown_params["trainer/wandb_api_key"]) == \
        (_generation_cells(MARKDOWN_STEP, MARKDOWN_ROWS), REDACTED)


@pytest.mark.slow
def test_tensorboard_dates_the_params_table(logged, tensorboard):
    """The params text event carries the time it was written, not the epoch."""
    [params] = tensorboard.get("/data/plugin/text/text", run=".", tag="hyperparameters", markdown="false")
    assert params["wall_time"] > 0


@pytest.mark.slow
def test_tensorboard_serves_the_image_pixels(logged, tensorboard):
    """The images API lists one image at its step, and individualImage returns a PNG of exactly the logged pixels."""
    tags = tensorboard.get("/data/plugin/images/tags")
    assert list(tags["."]) == ["samples/grid"] and tags["."]["samples/grid"]["samples"] == 1
    [image] = tensorboard.get("/data/plugin/images/images", run=".", tag="samples/grid")
    assert image["step"] == RICH_STEP
    png, content_type = tensorboard.raw("/data/plugin/images/individualImage?" + image["query"])
    assert content_type == "image/png" and png.startswith(b"\x89PNG")
    assert np.array_equal(_decoded(png), logged.pixels)


# -- MLflow -----------------------------------------------------------------------------------------------------


class _MlflowRest:
    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")

    def get(self, route: str, **query: Any) -> dict[str, Any]:
        return json.loads(self.raw(route, **query))

    def post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.uri}{route}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())

    def raw(self, route: str, **query: Any) -> bytes:
        address = f"{self.uri}{route}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(address, timeout=HTTP_TIMEOUT_S) as response:
            return response.read()

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """Every stored point of a metric, page by page."""
        points: list[tuple[int, float]] = []
        token = None
        while True:
            query = {"run_id": run_id, "metric_key": key, "max_results": 25}
            page = self.get("/api/2.0/mlflow/metrics/get-history", **query, **({"page_token": token} if token else {}))
            points += [(int(m["step"]), _number(m["value"])) for m in page.get("metrics", [])]
            token = page.get("next_page_token")
            if not token:
                return sorted(points)

    def files(self, run_id: str, path: str = "") -> dict[str, int]:
        """Every artifact file of the run (run-relative path -> size), walking the folders."""
        out: dict[str, int] = {}
        folders = [path]
        while folders:
            query = {"run_id": run_id, **({"path": folders[-1]} if folders[-1] else {})}
            folders.pop()
            for info in self.get("/api/2.0/mlflow/artifacts/list", **query).get("files", []):
                if info["is_dir"]:
                    folders.append(info["path"])
                else:
                    out[info["path"]] = int(info["file_size"])
        return out


def _mlflow_stored(value: float) -> float:
    """MLflow stores +-Inf as +-the largest float64 (NaN as NaN); see workers/sinks/mlflow.py."""
    return math.copysign(sys.float_info.max, value) if math.isinf(value) else value


def _mlflow_run(rest: _MlflowRest, logged: Logged) -> dict[str, Any]:
    experiment = rest.get("/api/2.0/mlflow/experiments/get-by-name", experiment_name=logged.project)["experiment"]
    found = rest.post("/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})
    [run] = found["runs"]
    return rest.get("/api/2.0/mlflow/runs/get", run_id=run["info"]["run_id"])["run"]


@pytest.mark.slow
def test_mlflow_rest_serves_the_run_params_and_metric_history(logged, mlflow_server_uri):
    """runs/get shows one FINISHED run with the params logged (the secret redacted) and get-history every point."""
    rest = _MlflowRest(mlflow_server_uri)
    run = _mlflow_run(rest, logged)
    run_id = run["info"]["run_id"]
    assert (run["info"]["status"], run["info"]["run_name"]) == ("FINISHED", EXPERIMENT)
    assert {tag["key"]: tag["value"] for tag in run["data"]["tags"]}["tracklane.run_id"] == logged.run_id
    assert {param["key"]: param["value"] for param in run["data"]["params"]} == logged.params()
    assert SECRET.encode() not in rest.raw("/api/2.0/mlflow/runs/get", run_id=run_id)

    names = {MLFLOW_RENAMED.get(key, key): key for key in _metrics(0)}
    stats = {f"critic/rewards/{stat}" for stat in HISTOGRAM_STATS}
    assert _user_keys(metric["key"] for metric in run["data"]["metrics"]) == set(names) | stats
    for name, key in names.items():
        points = rest.history(run_id, name)
        assert [step for step, _ in points] == list(range(STEPS)), name  # each step once
        wrong = [(step, value) for step, value in points
                 if not _same(value, _mlflow_stored(float(logged.metrics[step][key])))]
        assert not wrong, f"{name}: {wrong[:3]}"
    finite = logged.histogram[np.isfinite(logged.histogram)]
    assert rest.history(run_id, "critic/rewards/count") == [(RICH_STEP, 1000.0)]
    [(_, mean)] = rest.history(run_id, "critic/rewards/mean")
    assert math.isclose(mean, float(finite.mean()), rel_tol=1e-12)


def test_mlflow_rest_serves_the_artifacts(logged, mlflow_server_uri):
    """artifacts/list shows the layout workers/sinks/mlflow.py documents, and each file downloads through the server equal."""
    rest = _MlflowRest(mlflow_server_uri)
    run = _mlflow_run(rest, logged)
    run_id, experiment_id = run["info"]["run_id"], run["info"]["experiment_id"]
    files = rest.files(run_id)
    images = [path for path in files if path.startswith("images/")]
    [png] = [path for path in images if path.endswith(".png")]  # MLflow's log_image: the PNG and a thumbnail
    assert re.fullmatch(rf"images/samples~grid\+step\+{RICH_STEP}\+timestamp\+\d+\+[0-9a-f-]+\.png", png)
    assert sorted(images) == sorted([png, png[:-len(".png")] + "+compressed.webp"])
    checkpoint = f"checkpoint/policy/step_{RICH_STEP}/policy.ckpt"
    assert sorted(set(files) - set(images)) == sorted([
        checkpoint, "generations/val~generations/step_00000010.json",
        "generations/val~generations/step_00000020.json", f"generations/val~markdown/step_{MARKDOWN_STEP:08d}.json",
        "histograms/critic~rewards/step_00000010.json", "text/notes/step_00000010.txt"])

    def download(path: str) -> bytes:
        return rest.raw("/get-artifact", path=path, run_uuid=run_id)

    assert files[checkpoint] == logged.artifact.stat().st_size
    assert download(checkpoint) == logged.artifact.read_bytes()
    assert run["info"]["artifact_uri"] == f"mlflow-artifacts:/{experiment_id}/{run_id}/artifacts"  # proxied
    proxied = f"/api/2.0/mlflow-artifacts/artifacts/{experiment_id}/{run_id}/artifacts/{checkpoint}"
    assert rest.raw(proxied) == logged.artifact.read_bytes()

    for step, rows in [*GENERATIONS.items(), (MARKDOWN_STEP, MARKDOWN_ROWS)]:
        key = "val~markdown" if step == MARKDOWN_STEP else "val~generations"
        stored = json.loads(download(f"generations/{key}/step_{step:08d}.json"))
        assert stored == [{"input": i, "output": o, "score": None if math.isnan(s) else s} for i, o, s in rows]
    assert download("text/notes/step_00000010.txt").decode("utf-8") == TEXT
    histogram = json.loads(download("histograms/critic~rewards/step_00000010.json"))
    assert (histogram["count"], histogram["nonfinite"]) == (1000, {"nan": 1, "+inf": 1, "-inf": 0})
    assert [count for *_, count in _trim(list(zip(histogram["bin_edges"], histogram["bin_edges"][1:],
                                                   histogram["counts"], strict=False)))] == \
        [count for *_, count in _finite_bins(logged.histogram)]
    assert np.array_equal(_decoded(download(png)), logged.pixels)


# -- wandb ------------------------------------------------------------------------------------------------------


def _wandb_cli(logged: Logged, *args: str) -> subprocess.CompletedProcess:
    """The real ``wandb`` CLI, offline, with no key and a closed loopback port as its server: it cannot upload."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    env.update(logged.env, WANDB_MODE="offline", WANDB_BASE_URL="http://127.0.0.1:9", WANDB_SILENT="false")
    cli = Path(sys.executable).with_name("wandb")
    return subprocess.run([str(cli) if cli.exists() else "wandb", *args], env=env, cwd=logged.root,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_wandb_sync_dry_run_recognises_the_offline_run(logged):
    """``wandb sync --dry-run`` would sync exactly the run's .wandb file, and finds none in a folder that is no run."""
    folder = logged.wandb_run_dir
    done = _wandb_cli(logged, "sync", "--dry-run", str(folder))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Would sync 1 run(s):" in output
    assert f"{folder.name}/run-{logged.run_id}.wandb" in output  # printed relative to the working directory
    assert "Skipped" not in output  # neither synced nor taken for an online run
    control = _wandb_cli(logged, "sync", "--dry-run", str(logged.tensorboard_dir))
    assert control.returncode == 0 and "No runs to sync." in control.stdout + control.stderr


@pytest.mark.slow
def test_wandb_core_reads_the_run_back(logged):
    """wandb-core's own reader (``wandb leet inspect``) finds the run finished, its config, and every logged row."""
    folder = logged.wandb_run_dir
    summary_run = _wandb_cli(logged, "leet", "inspect", "--summary", "--json", str(folder))
    assert summary_run.returncode == 0, summary_run.stderr
    summary = json.loads(summary_run.stdout)
    assert (summary["state"], summary["exit_code"], summary["run_id"], summary["project"], summary["name"]) == \
        ("finished", 0, logged.run_id, logged.project, EXPERIMENT)
    params = logged.params()
    assert summary["config"] == {
        "trainer": {"log_async": logged.mode == "async", "lr": 1e-6, "total_epochs": 3, "wandb_api_key": REDACTED},
        "data": {"train_files": ["a.parquet", "b.parquet"]}, "actor": {"name": params["actor/name"]}}
    assert summary["step"] == STEPS - 1

    records_run = _wandb_cli(logged, "leet", "inspect", "--json", str(folder))
    assert records_run.returncode == 0, records_run.stderr
    assert SECRET not in records_run.stdout
    records = [json.loads(line) for line in records_run.stdout.splitlines() if line.strip()]
    rows = [record["history"] for record in records if record["type"] == "history"]
    assert [row["step"]["num"] for row in rows] == list(range(STEPS))  # one row per step, in order
    for row in rows:
        item, step = row["item"], row["step"]["num"]
        assert item["tracklane/step"] == step
        wrong = [key for key, value in logged.metrics[step].items() if not _same(_number(item[key]), float(value))]
        assert not wrong, f"step {step}: {[(k, item[k], logged.metrics[step][k]) for k in wrong]}"
    _check_wandb_media(logged, rows[RICH_STEP]["item"], folder)
    _check_wandb_artifact(logged, records)
    assert [record["exit"]["exit_code"] for record in records if record["type"] == "exit"] == [0]


def _check_wandb_media(logged: Logged, item: dict[str, Any], folder: Path) -> None:
    counts, edges = np.histogram(logged.histogram[np.isfinite(logged.histogram)], bins=30)
    assert item["critic/rewards._type"] == "histogram"
    assert item["critic/rewards.values"] == counts.tolist() and item["critic/rewards.bins"] == edges.tolist()
    assert item["samples/grid._type"] == "image-file"
    image = (folder / "files" / item["samples/grid.path"]).read_bytes()
    assert hashlib.sha256(image).hexdigest() == item["samples/grid.sha256"]
    assert np.array_equal(_decoded(image), logged.pixels)
    for key, rows in (("val/generations", len(GENERATIONS[RICH_STEP])), ("notes", 1)):
        assert (item[f"{key}._type"], item[f"{key}.log_mode"], item[f"{key}.nrows"]) == \
            ("incremental-table-file", "INCREMENTAL", rows)


def _check_wandb_artifact(logged: Logged, records: list[dict[str, Any]]) -> None:
    [artifact] = [record["artifact"] for record in records
                  if record["type"] == "artifact" and record["artifact"]["name"] == "policy"]
    assert artifact["type"] == "checkpoint" and json.loads(artifact["metadata"])["step"] == RICH_STEP
    [entry] = artifact["manifest"]["contents"]
    content = logged.artifact.read_bytes()
    assert entry["path"] == logged.artifact.name and int(entry["size"]) == len(content)
    assert entry["digest"] == base64.b64encode(hashlib.md5(content).digest()).decode()
