"""The README's first command, `python -m tracklane.trainer`, with every logger on embedded defaults: what it prints, and
what each tracker holds afterwards, read back through each tracker's own store.

One run (module fixture) of 12 steps with the logging cadences shortened (images, gradients and text every 5
steps and at the last, checkpoints at 6 and 12, validation at 0, 6 and 12); everything else is the default job:
the tool-use task, the warm-up, six trackers plus trackio and ClearML. The file tracker is the reference the
others are compared with, record by record.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image as PILImage

from tracklane.alerting import RULES_FILE
from tracklane.testing import prometheus_server
from tracklane.testing.server_process import free_port
from tracklane.view.run_data import RunData
from tracklane.workers.testing.readers.clearml_reader import read_clearml_run
from tracklane.workers.testing.readers.file_reader import file_lines
from tracklane.workers.testing.readers.mlflow_reader import (
    find_mlflow_run_ids,
    list_mlflow_artifacts,
    read_mlflow_images,
    read_mlflow_run,
    read_mlflow_steps,
)
from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_media, read_swanlab_run
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir, read_tensorboard_rich
from tracklane.workers.testing.readers.trackio_reader import read_trackio_run
from tracklane.workers.testing.readers.wandb_reader import read_wandb_media, read_wandb_run

REPO = Path(__file__).resolve().parents[2]
EVERY_LOGGER = ["console", "wandb", "mlflow", "swanlab", "tensorboard", "file", "trackio", "clearml"]
STEPS = 12
MEDIA_STEPS = [5, 10, 12]
CHECKPOINTS = [6, 12]
PROJECT, EXPERIMENT = "tracklane", "grpo_tool_addition"
REWARD_KEYS = ["reward/correct/mean", "reward/tool/mean", "reward/format/mean",
               "reward/tool_addition_2digit/correct/mean"]
GRADIENTS = "actor/gradients/h.0"


class Job:
    def __init__(self, root: Path, done: subprocess.CompletedProcess) -> None:
        self.root, self.done = root, done
        self.runs = root / "tracklane_runs"
        self.file = self.runs / PROJECT / f"{EXPERIMENT}.jsonl"
        self.media = self.runs / PROJECT / f"{EXPERIMENT}_media"
        self.mlflow_uri = f"sqlite:///{self.runs / 'mlruns.db'}"

    def lines(self) -> list[dict]:
        return file_lines(self.file)  # verl's lines, then tracklane's own (health, other axes) beside them

    def scalars(self) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for line in self.lines():
            if "axis" not in line:
                out.setdefault(line["step"], {}).update(line["data"])
        return out

    def image(self, step: int) -> np.ndarray:
        return _pixels((self.media / "images" / "actor_kl_heatmap" / f"{step}.png").read_bytes())

    def text(self, step: int) -> str:
        return (self.media / "text" / "rollout_samples" / f"{step}.txt").read_text(encoding="utf-8")

    def assert_rewards(self, points) -> None:
        """A tracker's ``(step, key, value)`` points hold every reward key at every step, equal to the file's."""
        reference = self.scalars()
        rewards = {(s, k): v for s, k, v in points if k in REWARD_KEYS}
        assert len(rewards) == STEPS * len(REWARD_KEYS) and all(_close(v, reference[s][k])
                                                                for (s, k), v in rewards.items())

    def assert_heatmaps(self, pngs: dict[int, bytes]) -> None:
        """A tracker's heatmap PNGs by step: one at each media step, pixel for pixel the file's."""
        assert sorted(pngs) == MEDIA_STEPS and all((_pixels(pngs[s]) == self.image(s)).all() for s in MEDIA_STEPS)


pytestmark = pytest.mark.slow  # every test reads the one run of the main job (~25 s)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Job:
    root = tmp_path_factory.mktemp("main_job")
    ours = ("WANDB_", "SWANLAB_", "MLFLOW_", "TRACKIO_", "TENSORBOARD_", "VERL_", "CLEARML_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    env.update(PYTHONPATH=str(REPO), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TRACKLANE_SYSTEM_METRICS_S="0",
               HOME=str(root / "home"))  # ClearML writes $HOME/.clearml/.session.json
    done = subprocess.run([sys.executable, "-m", "tracklane.trainer", f"trainer.logger=[{','.join(EVERY_LOGGER)}]",
                           f"trainer.total_steps={STEPS}", "trainer.test_freq=6", "trainer.save_freq=6",
                           "trainer.image_freq=5", "trainer.gradient_freq=5", "trainer.text_freq=5"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return Job(root, done)


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(PILImage.open(io.BytesIO(png)).convert("RGB"))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def test_the_main_job_prints_in_order_and_unprefixed(job):
    """It exits 0, every tracker's lane ends complete, and its stdout holds the console's lines in step order
    with no Ray `(LaneActor pid=...)` prefix; it says where to look for each kind."""
    out, err = job.done.stdout, job.done.stderr
    assert "pid=" not in out and "LaneActor" not in out + err
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("step ")]
    assert steps == list(range(0, STEPS + 1)), out[-3000:]  # compact lines, one a step (0: validation), in order
    lanes = [line for line in err.splitlines() if "stored through batch" in line]
    assert len(lanes) == len(EVERY_LOGGER) + 1  # the trackers and the health lane (trainer.health, docs/health.md)
    assert all("0 not stored, 0 dropped, 0 failed" in line for line in lanes)
    assert "ALERT" not in out + err  # a healthy run fires no health rule
    assert (job.runs / "trackio").is_dir() and not (job.root / "mlruns").exists()
    assert list((job.runs / "clearml" / "offline").glob("*/task.json"))  # ClearML's offline session
    [board] = [line for line in out.splitlines() if line.strip().startswith("TensorBoard: ")]
    assert all(tab in board for tab in ("Scalars", "Histograms", "Images", "Text"))


def test_the_file_holds_reward_components_tool_trajectories_and_every_kind(job):
    """The reference: reward components every step, trajectories with tool calls over several turns, the KL
    heatmap, gradient histograms, Markdown samples and the checkpoints at their steps."""
    scalars = job.scalars()
    assert all(set(REWARD_KEYS) <= set(scalars[step]) for step in range(1, STEPS + 1))
    trajectories = [json.loads(line) for step in range(1, STEPS + 1)
                    for line in open(job.runs / PROJECT / f"{EXPERIMENT}_rollouts" / f"{step}.jsonl", encoding="utf-8")]
    with_tool = [t for t in trajectories if t["tool_calls"]]
    assert with_tool, "the warmed-up policy calls the calculator"
    for trajectory in with_tool:
        roles = [m["role"] for m in trajectory["messages"]]
        assert roles[:3] == ["user", "assistant", "tool"] and trajectory["meta"]["num_turns"] >= 2
        assert trajectory["tool_calls"][0]["name"] == "calculator" and "expression" in trajectory["tool_calls"][0]["arguments"]
        assert trajectory["meta"]["turn_1_assistant_tokens"] > 0 and trajectory["meta"]["turn_1_tool_tokens"] > 0
        assert set(trajectory["rewards"]) == {"score", "correct", "tool", "format"}
        assert trajectory["meta"]["data_source"].startswith("tool_addition_")
    for step in MEDIA_STEPS:
        assert job.image(step).shape[2] == 3 and "| **score** |" in job.text(step)
    histograms = [json.loads(line) for line in open(job.media / "histograms.jsonl", encoding="utf-8")]
    assert sorted(h["step"] for h in histograms if h["name"] == GRADIENTS) == MEDIA_STEPS
    assert all({"actor/grad_norm/h.0", "actor/kl_heatmap/max"} <= set(scalars[step]) for step in MEDIA_STEPS)
    stored = list((job.media / "artifacts").rglob("trainer_state.pt"))
    assert len(stored) == len(CHECKPOINTS) and list((job.media / "artifacts" / "config").rglob("config.yaml"))


def test_tensorboard_shows_scalars_histograms_images_and_text(job):
    """TensorBoard's event files: the reward components equal the file's (as float32), a gradient histogram, the
    heatmap pixels and the Markdown sample at each media step, the trajectories' table with tool calls."""
    logdir = job.runs / "tensorboard" / PROJECT / EXPERIMENT
    reference = job.scalars()
    points = {(s, k): v for s, k, v in read_tensorboard_dir(logdir).points if k in REWARD_KEYS}
    assert len(points) == STEPS * len(REWARD_KEYS)
    assert all(abs(v - reference[s][k]) <= 1e-6 for (s, k), v in points.items())
    rich = read_tensorboard_rich(logdir)
    assert sorted(rich.histograms[GRADIENTS]) == MEDIA_STEPS
    for step in MEDIA_STEPS:
        [image] = rich.images["actor/kl_heatmap"][step]
        assert (_pixels(image.encoded_image_string) == job.image(step)).all()
        assert job.text(step).strip() in rich.texts["rollout/samples/text_summary"][step][0]
    assert any("calculator" in text for steps in rich.texts["rollout/trajectories/text_summary"].values()
               for text in steps)


def test_mlflow_holds_every_kind(job):
    """MLflow (sqlite, embedded default): reward components, histogram summaries, the heatmap images, the text,
    the trajectories' JSON with tool calls, and both checkpoints and the config as artifacts."""
    [run_id] = find_mlflow_run_ids(job.mlflow_uri, PROJECT, EXPERIMENT)
    reference = job.scalars()
    scalars = read_mlflow_run(job.mlflow_uri, run_id).scalars()
    assert all(_close(scalars[s][k], reference[s][k]) for s in range(1, STEPS + 1) for k in REWARD_KEYS)
    assert all(f"{GRADIENTS}/count" in scalars[step] for step in MEDIA_STEPS)
    job.assert_heatmaps({s: pngs[0] for s, pngs in read_mlflow_images(job.mlflow_uri, run_id)["actor~kl_heatmap"].items()})
    texts = read_mlflow_steps(job.mlflow_uri, run_id, "text/rollout~samples")
    assert {s: texts[s] for s in MEDIA_STEPS} == {s: job.text(s) for s in MEDIA_STEPS}
    trajectories = read_mlflow_steps(job.mlflow_uri, run_id, "trajectories/rollout~trajectories")
    assert any(t["tool_calls"] for step in trajectories.values() for t in step["trajectories"])
    files = list_mlflow_artifacts(job.mlflow_uri, run_id)
    assert sum(f.endswith("trainer_state.pt") for f in files) == len(CHECKPOINTS)
    assert any(f.endswith("config.yaml") for f in files)


def test_wandb_holds_every_kind(job):
    """wandb's offline run: reward components, histograms, the heatmap images, the text table, the trajectories'
    table with tool calls, the checkpoint as one artifact name in two versions and the config."""
    job.assert_rewards(read_wandb_run(job.runs / "wandb").points)
    media = read_wandb_media(job.runs / "wandb")
    assert sorted(media.histograms(GRADIENTS)) == MEDIA_STEPS
    job.assert_heatmaps({s: png.read_bytes() for s, png in media.images("actor/kl_heatmap").items()})
    assert {s: rows[0][1] for s, rows in media.table_rows("rollout/samples").items()} == \
        {s: job.text(s) for s in MEDIA_STEPS}
    tool_calls = media.table_columns("rollout/trajectories").index("tool_calls")
    assert any(json.loads(row[tool_calls]) for rows in media.table_rows("rollout/trajectories").values() for row in rows)
    artifacts = media.user_artifacts()
    assert sorted((a.name, a.metadata["step"]) for a in artifacts if a.type == "checkpoint") == \
        [("checkpoint", step) for step in CHECKPOINTS]
    assert [a.name for a in artifacts if a.type == "config"] == ["config"] and all(a.content_ok() for a in artifacts)


def test_swanlab_holds_every_kind(job):
    """SwanLab's offline run: reward components, gradient bar charts, the heatmap images, the text, the
    trajectories' table with tool calls, and the checkpoint files."""
    job.assert_rewards(read_swanlab_run(job.runs / "swanlog").points)
    media = read_swanlab_media(job.runs / "swanlog")
    assert sorted(media.bars(GRADIENTS)) == MEDIA_STEPS
    job.assert_heatmaps({s: png.read_bytes() for s, png in media.images("actor/kl_heatmap").items()})
    assert {s: media.texts("rollout/samples")[s] for s in MEDIA_STEPS} == {s: job.text(s) for s in MEDIA_STEPS}
    assert any("calculator" in json.dumps(rows) for _, rows in media.tables("rollout/trajectories").values())
    assert sum(saved.name.endswith("trainer_state.pt") for saved in media.saved) == len(CHECKPOINTS)


def test_trackio_holds_every_kind(job):
    """trackio's local store: reward components, histograms, the heatmap images, Markdown, traces with tool
    spans, and the checkpoint as versions of one artifact."""
    run = read_trackio_run(job.runs / "trackio", PROJECT)
    job.assert_rewards(run.points)
    assert sorted(run.histograms(GRADIENTS)) == MEDIA_STEPS
    job.assert_heatmaps({s: png.read_bytes() for s, png in run.images("actor/kl_heatmap").items()})
    assert {s: run.texts("rollout/samples")[s] for s in MEDIA_STEPS} == {s: job.text(s) for s in MEDIA_STEPS}
    traces = [t for step in run.traces["rollout/trajectories"].values() for t in step]
    assert any("calculator" in json.dumps(t) and [m["role"] for m in t["messages"]][:3] == ["user", "assistant", "tool"]
               for t in traces)
    versions = sorted(a.version for a in run.artifacts if a.name == "checkpoint")
    assert len(versions) == len(CHECKPOINTS)


def test_clearml_holds_every_kind(job):
    """ClearML's offline session: reward components, histogram plots, the heatmap and text debug samples, the
    trajectories' tables with tool calls, and both checkpoints as artifacts."""
    run = read_clearml_run(job.runs / "clearml")
    job.assert_rewards(run.points)
    assert sorted(run.bars("actor", "gradients/h.0")) == MEDIA_STEPS
    job.assert_heatmaps({s: samples[0].content for s, samples in run.samples_of("actor", "kl_heatmap").items()})
    assert {s: run.samples_of("rollout", "samples")[s][0].content.decode() for s in MEDIA_STEPS} == \
        {s: job.text(s) for s in MEDIA_STEPS}
    assert any("calculator" in json.dumps(rows) for _, rows in run.tables("rollout", "trajectories").values())
    assert {name for name in run.artifacts if name.startswith("checkpoint/")} == \
        {f"checkpoint/checkpoint/step_{step}" for step in CHECKPOINTS}


def _fired_in_prometheus(url: str, wanted: tuple[str, str], wait_s: float = 10.0) -> set[tuple[str, str]]:
    """Every (alertname, rule) Prometheus had firing at any time of the run, from the ALERTS series its rule
    evaluations wrote to its TSDB; asked again until ``wanted`` is among them or ``wait_s`` passes (the last
    evaluation may trail the job's last scrape by an interval)."""
    deadline = time.monotonic() + wait_s
    while True:
        fired = {(series["metric"]["alertname"], series["metric"].get("rule"))
                 for series in prometheus_server.query(url, 'max_over_time(ALERTS{alertstate="firing"}[1h])')}
        if wanted in fired or time.monotonic() > deadline:
            return fired
        time.sleep(0.5)


PATHOLOGIES = {
    "nan": (["trainer.total_steps=16", "trainer.inject_nan_step=5"], "non_finite"),
    "learning_rate": (["trainer.total_steps=30", "actor_rollout_ref.actor.optim.lr=0.01"], "entropy_collapse"),
}
"""The README's two overrides that make the main job go wrong, and the rule each must fire."""


def _entropy_collapse_step(scalars: dict[int, dict[str, float]]) -> int | None:
    """Where entropy_collapse must fire by its documented defaults, worked out from the logged entropy alone: the
    third step in a row below 0.1 x the median of the first 5 steps' entropy."""
    logged = [(step, scalars[step]["actor/entropy"]) for step in sorted(scalars) if "actor/entropy" in scalars[step]]
    floor = 0.1 * float(np.median([value for _, value in logged[:5]]))
    run = 0
    for step, value in logged[5:]:
        run = run + 1 if value < floor else 0
        if run == 3:
            return step
    return None


def _run_the_main_job(tmp_path: Path, overrides: list[str], rule: str) -> tuple[Job, set[tuple[str, str]]]:
    """The main job with every tracker plus prometheus, a real Prometheus with the shipped rules scraping it:
    the job, and every (alertname, rule) Prometheus fired while it ran (the endpoint serves the last values until
    scraped twice at the close, so an alert fired near the end is evaluated too)."""
    ours = ("WANDB_", "SWANLAB_", "MLFLOW_", "TRACKIO_", "TENSORBOARD_", "VERL_", "CLEARML_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    port = free_port()
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TRACKLANE_SYSTEM_METRICS_S="0", HOME=str(tmp_path / "home"),
               TRACKLANE_PROMETHEUS_PORT=str(port))
    proc, url = prometheus_server.start_server(tmp_path / "prometheus", [f"127.0.0.1:{port}"], [RULES_FILE])
    try:
        done = subprocess.run([sys.executable, "-m", "tracklane.trainer",
                               f"trainer.logger=[{','.join([*EVERY_LOGGER, 'prometheus'])}]",
                               "trainer.test_freq=0", "trainer.save_freq=0", *overrides],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        firing = _fired_in_prometheus(url, ("TracklaneHealthAlert", rule)) if done.returncode == 0 else set()
    finally:
        prometheus_server.stop_server(proc)
    assert done.returncode == 0, done.stderr[-4000:]
    return Job(tmp_path, done), firing


@pytest.mark.parametrize("pathology", list(PATHOLOGIES))
def test_an_injected_pathology_is_an_alert_everywhere(tmp_path, pathology):
    """Each documented override fires its rule, read back from everywhere a user looks. ``inject_nan_step=5``:
    non_finite at step 5 on the actor's loss and grad norm, and nothing else (the NaN update is skipped, counted
    in actor/skipped_updates, and the run goes on). ``optim.lr=0.01`` (20x the default): the policy's entropy
    collapses and entropy_collapse fires where its defaults say, worked out here from the logged entropy (the KL
    and the flat groups may fire too: they go wrong with it). Everywhere: the console line and the summary, every
    tracker's points tracklane/alert/<rule> and texts, the alerts of their own (wandb's alert record, trackio's
    alerts, the MLflow tag on the run, the ClearML tag), the viewer, and a real Prometheus loaded with the shipped
    rules, which fires TracklaneHealthAlert for it (read from the ALERTS series it keeps)."""
    overrides, rule = PATHOLOGIES[pathology]
    job, firing = _run_the_main_job(tmp_path, overrides, rule)
    done = job.done
    step = 5 if rule == "non_finite" else _entropy_collapse_step(job.scalars())
    assert step is not None, "the entropy did not collapse: the override no longer shows the rule"
    key = f"tracklane/alert/{rule}"
    expected = {(line["step"], k) for line in job.lines() for k in line["data"] if k.startswith("tracklane/alert/")}
    assert (step, key) in expected, expected
    if rule == "non_finite":
        assert expected == {(5, key)}
        assert "tracklane ALERT non_finite: actor/pg_loss = nan at step 5" in done.stdout
        assert job.scalars()[5]["actor/skipped_updates"] > 0 and job.scalars()[6]["actor/skipped_updates"] == 0
    said = [line for line in done.stdout.splitlines() if line.startswith("tracklane ALERT ")]
    assert {(int(line.split(" at step ")[1].split(":")[0]), f"tracklane/alert/{line.split()[2].rstrip(':')}")
            for line in said} == expected, said
    assert f"ALERT {rule} at step {step}" in done.stderr  # the summary
    assert ("TracklaneHealthAlert", rule) in firing, firing
    _assert_every_store_holds(job, expected, rule, step)
    viewed = RunData(str(job.file)).snapshot()
    assert {(a["step"], f"tracklane/alert/{a['rule']}") for a in viewed.alerts} == expected
    assert any(a["rule"] == rule and a["step"] == step and "=" in a["text"] for a in viewed.alerts)


def _assert_every_store_holds(job: Job, expected: set[tuple[int, str]], rule: str, step: int) -> None:
    """Every tracker's points tracklane/alert/* are ``expected``; the rule's text at its step names the key it
    fired on; the trackers with alerts of their own hold it there."""
    level = "ERROR" if rule == "non_finite" else "WARN"
    fired_on = "actor/pg_loss" if rule == "non_finite" else "actor/entropy"

    def alert_points(points) -> set[tuple[int, str]]:
        return {(s, k) for s, k, _ in points if k.startswith("tracklane/alert/")}

    board = job.runs / "tensorboard" / PROJECT / EXPERIMENT
    assert alert_points(read_tensorboard_dir(board).points) == expected
    texts = read_tensorboard_rich(board).texts
    assert any(f"{fired_on} = " in text for text in next(v for k, v in texts.items()
                                                       if k.startswith(f"alert/{rule}"))[step])
    assert alert_points(read_wandb_run(job.runs / "wandb").points) == expected
    wandb_alerts = [a for a in read_wandb_media(job.runs / "wandb").alerts if a["title"] == f"tracklane: {rule}"]
    assert [(a["level"], a["text"].split(":")[0]) for a in wandb_alerts] == [(level, f"step {step}")]
    trackio = read_trackio_run(job.runs / "trackio", PROJECT)
    assert alert_points(trackio.points) == expected
    assert [(a["level"], a["step"]) for a in trackio.alerts if a["title"] == f"tracklane: {rule}"] == \
        [(level.lower(), step)]
    [run_id] = find_mlflow_run_ids(job.mlflow_uri, PROJECT, EXPERIMENT)
    assert alert_points(read_mlflow_run(job.mlflow_uri, run_id).points) == expected
    tags = MlflowClient(tracking_uri=job.mlflow_uri).get_run(run_id).data.tags
    assert tags[f"tracklane.alert.{rule}"].startswith(f"{level} at step {step}: ")
    assert alert_points(read_swanlab_run(job.runs / "swanlog").points) == expected
    assert f"{fired_on} = " in read_swanlab_media(job.runs / "swanlog").texts(f"alert/{rule}")[step]
    clearml = read_clearml_run(job.runs / "clearml")
    assert alert_points(clearml.points) == expected and f"tracklane.alert={rule}" in clearml.tags
