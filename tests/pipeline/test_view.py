"""``tracklane view``: a run's rollouts served read-only on loopback, live while the run writes, and the page in a
real headless Chromium (Debian's) on a run the main job wrote: open a step, expand a tool call, filter by reward."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tracklane import ConfigError, Tracking
from tracklane.view.run_data import RunData, resolve
from tracklane.view.server import make_server

REPO = Path(__file__).resolve().parents[2]
REQUIRE_BROWSER = os.environ.get("TRACKLANE_REQUIRE_SYSTEM_SERVERS") == "1"  # .ci/run: a missing Chromium fails
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def trajectory(step: int, i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"what is {step}+{i}?"},
                         {"role": "assistant", "content": f"<tool>add {step} {i}</tool>"},
                         {"role": "tool", "content": str(step + i)},
                         {"role": "assistant", "content": f"answer {step + i}"}],
            "tool_calls": [{"name": "add", "arguments": json.dumps([step, i]), "result": str(step + i), "latency_s": 0.001}],
            "rewards": {"score": i / 4, "format": 1.0}, "token_ids": list(range(10 + i)),
            "meta": {"data_source": "even" if i % 2 == 0 else "odd", "sample_index": i, "rollout_index": 0,
                     "turn_1_assistant_tokens": 3 + i, "turn_1_tool_tokens": 1, "turn_2_assistant_tokens": 2}}


def write_run(folder: Path, monkeypatch, steps: range) -> Tracking:
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(folder / "run.jsonl"))
    tracking = Tracking("proj", "viewed", ["file"], config={"trainer": {"log_async": False}})
    log_steps(tracking, steps)
    return tracking


def log_steps(tracking: Tracking, steps: range) -> None:
    for step in steps:
        tracking.log({"critic/score/mean": step / 10, "actor/pg_loss": 0.5}, step=step)
        tracking.log_trajectories([trajectory(step, i) for i in range(4)], step=step)
        if step % 2 == 0:
            tracking.log_generations([[f"in {step}", f"out {step}", 0.5]], step=step)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A file tracker's run of 3 steps, served on a free loopback port: (base url, the Tracking, its folder)."""
    tracking = write_run(tmp_path, monkeypatch, range(1, 4))
    server = make_server(RunData(str(tmp_path)), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", tracking, tmp_path
    finally:
        server.shutdown()
        server.server_close()
        tracking.finish()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_a_path_is_a_spool_a_jsonl_or_a_folder_holding_one(tmp_path, monkeypatch):
    """PATH resolves to the file tracker's .jsonl (given, or the one in a folder); nothing or two runs is a clear error."""
    with pytest.raises(ConfigError, match="no such file or folder"):
        resolve(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="holds no spool and no .jsonl"):
        resolve(str(tmp_path))
    write_run(tmp_path, monkeypatch, range(1, 2)).finish()
    assert resolve(str(tmp_path)) == ("file", str(tmp_path / "run.jsonl"))
    (tmp_path / "other.jsonl").write_text("")
    with pytest.raises(ConfigError, match="2 runs"):
        resolve(str(tmp_path))


def test_the_api_serves_each_step_as_stored(served):
    """Steps with their score figures; a step's trajectories with turns, tool calls, rewards, per-turn tokens;
    validation generations; unknown steps and other methods refused."""
    url, _tracking, _folder = served
    run = get(f"{url}/api/run")
    assert run["run"]["experiment"] == "viewed" and [s["step"] for s in run["steps"]] == [1, 2, 3]
    step2 = run["steps"][1]
    assert (step2["trajectories"], step2["generations"], step2["data_sources"]) == (4, 1, ["even", "odd"])
    assert (step2["score_min"], step2["score_max"], step2["score_mean"]) == (0.0, 0.75, 0.375)
    assert step2["metrics"] == {"critic/score/mean": 0.2}
    answer = get(f"{url}/api/step/2")
    third = answer["trajectories"][3]
    assert third["messages"] == trajectory(2, 3)["messages"] and third["tool_calls"] == trajectory(2, 3)["tool_calls"]
    assert third["rewards"] == {"score": 0.75, "format": 1.0} and third["tokens"] == 13
    assert third["meta"]["turn_1_assistant_tokens"] == 6 and third["data_source"] == "odd"
    assert answer["generations"] == [{"index": 0, "input": "in 2", "output": "out 2", "score": 0.5}]
    with pytest.raises(urllib.error.HTTPError) as missing:
        get(f"{url}/api/step/9")
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as posted:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/run", data=b"x", method="POST"), timeout=5)
    assert posted.value.code == 405
    for bad in ("../run_data.py", "%2e%2e/server.py", "nothing.html"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/{bad}", timeout=5)
        assert refused.value.code == 404


def test_it_follows_a_run_that_is_still_writing_and_never_writes_to_it(served):
    """Steps logged after the page opened appear at the next look; the run's files are the same bytes and times after."""
    url, tracking, folder = served
    assert [s["step"] for s in get(f"{url}/api/run")["steps"]] == [1, 2, 3]
    log_steps(tracking, range(4, 6))
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}
    deadline, steps = time.monotonic() + 10, []
    while time.monotonic() < deadline and steps != [1, 2, 3, 4, 5]:
        steps = [s["step"] for s in get(f"{url}/api/run")["steps"]]
        time.sleep(0.3)
    assert steps == [1, 2, 3, 4, 5]
    for step in range(1, 6):
        get(f"{url}/api/step/{step}")
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} == before


def test_the_event_stream_pushes_the_run_when_it_changes(served):
    """/api/events: one ``run`` event at once (the /api/run answer), then one more when steps are logged after, and
    the stream stays open between them."""
    url, tracking, _folder = served

    def next_event(stream) -> dict:
        lines = []
        while (line := stream.readline().decode()) != "\n":
            lines.append(line.rstrip("\n"))
        assert lines[0] == "event: run", lines
        return json.loads(lines[1].removeprefix("data: "))

    with urllib.request.urlopen(f"{url}/api/events", timeout=15) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        first = next_event(stream)
        assert [s["step"] for s in first["steps"]] == [1, 2, 3] and first["run"]["experiment"] == "viewed"
        log_steps(tracking, range(4, 6))
        second = next_event(stream)
        while [s["step"] for s in second["steps"]] != [1, 2, 3, 4, 5]:  # a read may catch step 4 alone
            second = next_event(stream)
        assert second["read_at"] > first["read_at"]


def test_a_spool_that_keeps_its_batches_is_viewed_as_the_file_is(tmp_path, monkeypatch, ray_session):
    """An async run's spool (spool_retention_s keeps what the trackers acknowledged) gives the same steps and
    rollouts as the run's file tracker."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "run.jsonl"))
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": str(tmp_path / "spool"),
                                                           "spool_retention_s": 3600}}}
    tracking = Tracking("proj", "spooled", ["file"], config=config)
    log_steps(tracking, range(1, 4))
    assert tracking.finish().complete
    from_spool, from_file = RunData(str(tmp_path / "spool")).snapshot(), RunData(str(tmp_path)).snapshot()
    assert from_spool.run["kind"] == "spool" and from_spool.run["experiment"] == "spooled" and not from_spool.error
    assert from_spool.steps == from_file.steps and list(from_spool.steps) == [1, 2, 3]
    assert from_spool.trajectories == from_file.trajectories
    assert from_spool.generations == from_file.generations


# -- the page in a real browser, on the main job's run -------------------------------------------------------------
@pytest.fixture(scope="module")
def main_job_run(tmp_path_factory) -> Path:
    """The main job (python -m tracklane.trainer), 4 steps, its file tracker only: the folder it wrote."""
    root = tmp_path_factory.mktemp("viewed_job")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("VERL_", "WANDB_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO), TRACKLANE_SYSTEM_METRICS_S="0", HOME=str(root / "home"))
    done = subprocess.run([sys.executable, "-m", "tracklane.trainer", "trainer.logger=[file]", "trainer.total_steps=4",
                           "trainer.test_freq=2", "trainer.log_async=false"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    [jsonl] = (root / "tracklane_runs").glob("*/*.jsonl")
    return jsonl.parent


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, driven by Playwright (its own browser download is never used)."""
    missing = [what for what, there in (("chromium (apt-get install -y chromium)", CHROMIUM),
                                         ("playwright (the dev extra)", importlib.util.find_spec("playwright"))) if not there]
    if missing:
        if REQUIRE_BROWSER:
            pytest.fail(f"TRACKLANE_REQUIRE_SYSTEM_SERVERS=1 but no {' and no '.join(missing)}")
        pytest.skip(f"no {' and no '.join(missing)} here; .ci/run installs them")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.mark.slow  # the main job runs first (~10 s)
def test_the_page_shows_what_the_main_job_stored(main_job_run, browser, tmp_path):
    """Open step 2 (or the first step where a rollout called the tool): every rollout the file holds is on the
    screen with its reward and its per-token strip (log-probabilities and loss mask as logged); a tool call expands
    to its arguments and result; a reward filter leaves exactly the rollouts at or above it; best and worst side by
    side, then another step beside it; a text search; the GRPO groups (each prompt's rollouts with the advantages
    the trainer logged, flat groups flagged); step 2 validation generations. Screenshots go to $TRACKLANE_SCREENSHOTS (or tmp)."""
    rollouts = next(main_job_run.glob("*_rollouts"))
    by_step = {int(path.stem): [json.loads(line) for line in path.read_text().splitlines()] for path in rollouts.glob("*.jsonl")}
    # The policy samples (its rollouts differ run to run): open a step where a rollout called the tool.
    step = next(s for s in sorted(by_step, key=lambda s: (s != 2, s)) if any(row["tool_calls"] for row in by_step[s]))
    other = next(s for s in sorted(by_step) if s != step)
    stored = by_step[step]
    scores = [row["rewards"]["score"] for row in stored]
    shots = Path(os.environ.get("TRACKLANE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    server = make_server(RunData(str(main_job_run)), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"http://127.0.0.1:{server.server_port}/")
        page.locator(f"#steps tbody tr[data-step='{step}']").click()
        cards = page.locator("#pane-a .trajectory")
        cards.first.wait_for()
        assert cards.count() == len(stored)
        shown = [float(cards.nth(i).get_attribute("data-score")) for i in range(cards.count())]
        assert shown == pytest.approx(scores)
        first = stored[0]
        assert first["messages"][0]["content"] in cards.first.inner_text()
        with_call = next(i for i, row in enumerate(stored) if row["tool_calls"])
        call = page.locator(f"#pane-a .trajectory[data-index='{with_call}'] details.tool-call").first
        assert not call.locator("pre.arguments").is_visible()
        call.locator("summary").click()
        assert call.locator("pre.arguments").inner_text() == stored[with_call]["tool_calls"][0]["arguments"]
        assert call.locator("pre.result").inner_text() == stored[with_call]["tool_calls"][0]["result"]
        # staleness: the main job generates with the weights it then updates (policy version step - 1)
        assert [cards.nth(i).get_attribute("data-staleness") for i in range(cards.count())] == ["0"] * len(stored)
        assert all(row["meta"]["policy_version"] == step - 1 for row in stored)
        strip = json.loads(first["meta"]["token_strip"])  # the per-token strip the trainer logged (token_strip.py)
        tokens = cards.first.locator(".token-strip .tok")
        assert tokens.count() == len(strip["tokens"]) == len(strip["logprob"]) == len(strip["loss_mask"]) > 0
        assert [float(tokens.nth(i).get_attribute("data-logprob")) for i in range(tokens.count())] == strip["logprob"]
        assert cards.first.locator(".token-strip .tok.masked").count() == strip["loss_mask"].count("0")
        assert all(lp <= 0 for lp in strip["logprob"]) and all(e >= 0 for e in strip["entropy"])
        page.select_option("#shade", "entropy")
        assert cards.first.locator(".token-strip").get_attribute("data-shade") == "entropy"
        page.screenshot(path=str(shots / "view-tokens.png"))
        page.select_option("#shade", "logprob")
        page.screenshot(path=str(shots / "view-step.png"))
        threshold = sorted(scores)[len(scores) // 2]
        page.fill("#min-score", str(threshold))
        expected = sorted(i for i, s in enumerate(scores) if s >= threshold)
        page.wait_for_function(f"document.querySelectorAll('#pane-a .trajectory').length === {len(expected)}")
        assert sorted(int(cards.nth(i).get_attribute("data-index")) for i in range(cards.count())) == expected
        page.screenshot(path=str(shots / "view-filtered.png"))
        page.fill("#min-score", "")
        page.select_option("#compare", "best-worst")
        page.locator("#pane-b .trajectory").wait_for()
        assert float(page.locator("#pane-a .trajectory").get_attribute("data-score")) == pytest.approx(max(scores))
        assert float(page.locator("#pane-b .trajectory").get_attribute("data-score")) == pytest.approx(min(scores))
        page.screenshot(path=str(shots / "view-best-worst.png"))
        page.select_option("#compare", f"step:{other}")
        # pane B held the worst rollout (one card) until the other step's arrive: wait for them, not for any card
        page.wait_for_function(f"document.querySelectorAll('#pane-b .trajectory').length === {len(by_step[other])}")
        assert page.locator("#pane-b .trajectory").count() == len(by_step[other])
        assert page.locator("#pane-b h2").inner_text().startswith(f"step {other}:")
        page.select_option("#compare", "")
        needle = stored[-1]["messages"][0]["content"]
        page.fill("#search", needle)
        fields = ("name", "arguments", "result")
        texts = [[m["content"] for m in row["messages"]] + [c[f] for c in row["tool_calls"] for f in fields] for row in stored]
        expected = [i for i, row_texts in enumerate(texts) if any(needle.lower() in str(t).lower() for t in row_texts)]
        page.wait_for_function(f"document.querySelectorAll('#pane-a .trajectory').length === {len(expected)}")
        assert [int(cards.nth(i).get_attribute("data-index")) for i in range(cards.count())] == expected
        page.fill("#search", "")
        page.select_option("#show", "groups")  # GRPO groups: each prompt's rollouts side by side
        by_sample: dict[int, list[dict]] = {}
        for row in stored:
            by_sample.setdefault(row["meta"]["sample_index"], []).append(row)
        page.wait_for_function(f"document.querySelectorAll('#pane-a .group').length === {len(by_sample)}")
        for sample, rows in by_sample.items():
            group = page.locator(f"#pane-a .group[data-group='sample {sample}']")
            assert int(group.get_attribute("data-size")) == len(rows)
            members = group.locator(".member")
            advantages = [float(members.nth(i).get_attribute("data-advantage")) for i in range(members.count())]
            assert advantages == pytest.approx([row["meta"]["advantage"] for row in rows], abs=1e-6)  # as the trainer logged
            rewards = [row["rewards"]["score"] for row in rows]
            assert ("flat" in group.get_attribute("class")) == (len(rows) > 1 and max(rewards) - min(rewards) <= 1e-9)
        page.screenshot(path=str(shots / "view-groups.png"))
        page.select_option("#show", "trajectories")
        page.locator("#steps tbody tr[data-step='2']").click()  # a validation step (test_freq=2)
        page.select_option("#show", "generations")
        generations = next(main_job_run.glob("*_generations")).joinpath("2.jsonl").read_text().splitlines()
        page.wait_for_function(f"document.querySelectorAll('#pane-a .generation').length === {len(generations)}")
        assert json.loads(generations[0])["output"] in page.locator("#pane-a .generation").first.inner_text()
    finally:
        page.close()
        server.shutdown()
        server.server_close()


def write_unhealthy_run(folder: Path, monkeypatch, steps: range, tracking: Tracking | None = None) -> Tracking:
    """The file tracker with the health rules on: a NaN pg_loss at step 4, a KL of 5 from step 6 (kl_blowup at 7)."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(folder / "run.jsonl"))
    tracking = tracking or Tracking("proj", "unhealthy", ["file"],
                                    config={"trainer": {"log_async": False, "health": {"enabled": True}}})
    for step in steps:
        tracking.log({"critic/score/mean": step / 10, "actor/entropy": 1.0, "actor/grad_norm": 0.5,
                      "actor/pg_loss": float("nan") if step == 4 else 0.5,
                      "actor/kl_loss": 5.0 if step >= 6 else 0.01}, step=step)
        rows = [trajectory(step, i) for i in range(4)]
        for i, row in enumerate(rows):  # two GRPO groups of two rollouts each (rewards 0, 0.25 and 0.5, 0.75)
            row["meta"].update(sample_index=i // 2, rollout_index=i % 2)
        tracking.log_trajectories(rows, step=step)
    return tracking


def test_the_api_serves_the_runs_alerts_and_charted_metrics(tmp_path, monkeypatch):
    """The alerts the run's health rules fired come back with their rule, step and why (from the file tracker's
    point and text), and each charted key with every step's value."""
    tracking = write_unhealthy_run(tmp_path, monkeypatch, range(1, 9))
    tracking.finish()
    snapshot = RunData(str(tmp_path)).snapshot()
    assert [(a["rule"], a["step"]) for a in snapshot.alerts] == [("non_finite", 4), ("kl_blowup", 7)]
    assert "actor/pg_loss = nan" in snapshot.alerts[0]["text"] and "actor/kl_loss = 5" in snapshot.alerts[1]["text"]
    assert snapshot.charts["critic/score/mean"] == [[step, pytest.approx(step / 10)] for step in range(1, 9)]
    assert [value for _, value in snapshot.charts["actor/kl_loss"]] == [0.01] * 5 + [5.0] * 3
    assert "response_length/mean" not in snapshot.charts  # never logged: no empty chart


def test_the_page_marks_the_alerts_on_its_charts_and_follows_new_ones(tmp_path, monkeypatch, browser):
    """In Chromium: the alert list names each alert with its step and why, every chart marks both alert steps, the
    step table flags step 4; then, while the page is open, the run goes on and a later alert (a NaN at step 13)
    arrives on the page without a reload (at 13), pushed by the server (server-sent events). Screenshot view-alerts.png."""
    tracking = write_unhealthy_run(tmp_path, monkeypatch, range(1, 9))
    shots = Path(os.environ.get("TRACKLANE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    server = make_server(RunData(str(tmp_path)), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"http://127.0.0.1:{server.server_port}/")
        page.wait_for_function("document.querySelectorAll('#alerts .alert').length === 2")
        lines = page.locator("#alerts .alert")
        assert [(lines.nth(i).get_attribute("data-rule"), lines.nth(i).get_attribute("data-step")) for i in range(2)] == \
            [("non_finite", "4"), ("kl_blowup", "7")]
        assert "actor/kl_loss = 5" in lines.nth(1).inner_text()
        charts = page.locator("#charts svg")
        assert sorted(charts.nth(i).get_attribute("data-key") for i in range(charts.count())) == \
            sorted(["critic/score/mean", "actor/kl_loss", "actor/entropy"])
        for i in range(charts.count()):
            marks = charts.nth(i).locator("line.alert-mark")
            assert sorted(marks.nth(j).get_attribute("data-rule") for j in range(marks.count())) == ["kl_blowup", "non_finite"]
        assert page.locator("#steps tbody tr[data-step='4'] td.alerted").inner_text() == "non_finite"
        page.locator("#steps tbody tr[data-step='7']").click()
        page.locator("#pane-a .trajectory").first.wait_for()
        page.screenshot(path=str(shots / "view-alerts.png"))
        page.select_option("#show", "groups")  # no advantage logged: GRPO's (reward - mean) / std, here -1 and 1
        page.wait_for_function("document.querySelectorAll('#pane-a .group').length === 2")
        for sample in (0, 1):
            members = page.locator(f"#pane-a .group[data-group='sample {sample}'] .member")
            assert [float(members.nth(i).get_attribute("data-advantage")) for i in range(2)] == [-1.0, 1.0]
        page.screenshot(path=str(shots / "view-groups.png"))
        page.select_option("#show", "trajectories")
        write_unhealthy_run(tmp_path, monkeypatch, range(9, 13), tracking)  # finite losses since 4: non_finite re-armed
        tracking.log({"actor/pg_loss": float("nan"), "actor/grad_norm": 0.5}, step=13)
        page.wait_for_function("[...document.querySelectorAll('#alerts .alert')].some(a => a.dataset.step === '13')",
                               timeout=20000)
        assert page.locator("#charts svg[data-key='actor/kl_loss'] line.alert-mark").count() == 3
        # pushed (server-sent events, /api/events), not asked for: the page never requested /api/run
        assert int(page.evaluate("document.body.dataset.pushes")) >= 2
        assert page.evaluate("performance.getEntriesByType('resource').filter(e => e.name.endsWith('/api/run')).length") == 0
    finally:
        page.close()
        server.shutdown()
        server.server_close()
        tracking.finish()


def test_two_runs_compared_overlay_their_curves_and_show_the_same_prompts(tmp_path, monkeypatch, browser):
    """``tracklane view A B``: each chart holds both runs' curves (B's points where B logged the key), a legend names
    them, and "the same prompts in B" puts B's rollouts of the prompts A shows at that step beside A's.
    Screenshot view-compare.png."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_unhealthy_run(tmp_path / "a", monkeypatch, range(1, 6)).finish()
    write_run(tmp_path / "b", monkeypatch, range(1, 4)).finish()
    shots = Path(os.environ.get("TRACKLANE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    server = make_server([RunData(str(tmp_path / "a")), RunData(str(tmp_path / "b"))], "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert [r["run"]["experiment"] for r in get(f"{url}/api/runs")] == ["unhealthy", "viewed"]
        page.goto(f"{url}/")
        page.wait_for_function("document.querySelectorAll('#charts .legend span').length === 2")
        score = page.locator("#charts svg[data-key='critic/score/mean']")
        assert score.locator("polyline").count() == 2
        assert len(score.locator("polyline[data-run='1']").get_attribute("points").split()) == 3  # B's steps 1-3
        assert len(score.locator("polyline[data-run='0']").get_attribute("points").split()) == 5
        page.locator("#steps tbody tr[data-step='2']").click()
        page.locator("#pane-a .trajectory").first.wait_for()
        page.select_option("#compare", "run:1")
        page.wait_for_function("document.querySelectorAll('#pane-b .trajectory').length === 4")
        assert page.locator("#pane-b h2").inner_text().startswith("viewed step 2: 4 rollouts of the same prompts")
        prompts_a = [page.locator("#pane-a .trajectory").nth(i).locator(".role-user pre").inner_text() for i in range(4)]
        prompts_b = [page.locator("#pane-b .trajectory").nth(i).locator(".role-user pre").inner_text() for i in range(4)]
        assert prompts_a == prompts_b == [f"what is 2+{i}?" for i in range(4)]
        page.screenshot(path=str(shots / "view-compare.png"))
        assert get(f"{url}/api/step/2?run=1")["step"] == 2
        with pytest.raises(urllib.error.HTTPError):
            get(f"{url}/api/step/2?run=5")
    finally:
        page.close()
        server.shutdown()
        server.server_close()


def test_the_command_serves_until_interrupted(tmp_path, monkeypatch):
    """``tracklane view PATH --port 0`` prints where it serves, answers there, and ends with 0 on Ctrl-C; a PATH
    that is no run is exit code 2 with the reason."""
    write_run(tmp_path, monkeypatch, range(1, 3)).finish()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bad = subprocess.run([sys.executable, "-m", "tracklane", "view", str(tmp_path / "none")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such file or folder" in bad.stderr
    # Ctrl-C as a terminal sends it: a pytest-xdist worker ignores SIGINT, and its children would inherit that.
    proc = subprocess.Popen([sys.executable, "-m", "tracklane", "view", str(tmp_path), "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = lines[1].split()[1]
        assert url.startswith("http://127.0.0.1:") and "run.jsonl" in lines[0]
        assert [s["step"] for s in get(f"{url}api/run")["steps"]] == [1, 2]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_compares_at_most_four_runs(tmp_path, monkeypatch):
    """Five runs named: exit 2 with the limit said, before anything is served."""
    write_run(tmp_path, monkeypatch, range(1, 2)).finish()
    done = subprocess.run([sys.executable, "-m", "tracklane", "view", *[str(tmp_path)] * 5], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "compares 1 to 4 runs, got 5" in done.stderr
