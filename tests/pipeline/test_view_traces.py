"""``tracklane view`` with rollout traces: an async run's spool holding rollouts and traces (one failed, one span,
one validation call, one too long for the page) over 3 steps; the API gives each trace once, timed, parsed, cut
where long and tied to its rollout; headless Chromium shows them grouped by sample, the error marked, one expanded."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.pipeline.test_view import browser  # noqa: F401 (the fixture: Debian's Chromium under Playwright)
from tracklane import Tracking
from tracklane.view.run_data import TRACE_LIST_ITEMS, TRACE_TEXT_CHARS, RunData
from tracklane.view.server import make_server

REPO = Path(__file__).resolve().parents[2]
STEPS = (1, 2, 3)
SAMPLES, ROLLOUTS = 2, 2
LONG = "x" * (TRACE_TEXT_CHARS + 500)


def trajectory(step: int, sample: int, rollout: int) -> dict:
    return {"messages": [{"role": "user", "content": f"step {step}: what is {sample}+{rollout}?"},
                         {"role": "assistant", "content": f"answer {sample + rollout}"}],
            "rewards": {"score": (sample + rollout) / 2}, "token_ids": list(range(8)),
            "meta": {"data_source": "add", "sample_index": sample, "rollout_index": rollout}}


def traces_of(step: int, t0: int) -> list[dict]:
    """What the run logs at ``step``: per rollout an agent loop holding a generate call and a tool call (step 2's
    sample 1 rollout 0: the tool fails), a validation call, a span tied to no sample, and one huge generate call."""
    made = []

    def add(name: str, start_ms: float, end_ms: float, attributes: dict, inputs: dict, output=None,
            exception: str | None = None, messages: list | None = None) -> None:
        metadata = {"op": name, "inputs": inputs, "status": "error" if exception else "success", **attributes}
        if exception:
            metadata["exception_type"] = exception
        else:
            metadata["output"] = output
        made.append({"name": name, "step": step, "start_ns": t0 + int(start_ms * 1e6), "end_ns": t0 + int(end_ms * 1e6),
                     "status": metadata["status"], "attributes": {**attributes, "call": f"{step}/{len(made)}"},
                     "messages": messages or [{"role": "user", "content": f"{name} {json.dumps(inputs)}"},
                                              {"role": "assistant", "content": exception or json.dumps(output)}],
                     "metadata": metadata})

    for sample in range(SAMPLES):
        for rollout in range(ROLLOUTS):
            at = {"sample_index": sample, "rollout_n": rollout, "step": step, "validate": False}
            base = 10.0 * (sample * ROLLOUTS + rollout)
            add("ToolAgentLoop.run", base, base + 9, at, {"sampling_params": {"temperature": 1.0}},
                {"num_turns": 2, "response_text": f"answer {sample + rollout}"})
            add("AsyncLLMServerManager.generate", base + 1, base + 4, at, {"request_id": f"r{sample}{rollout}"},
                {"token_ids": [1, 2, 3], "stop_reason": "stop"})
            failing = step == 2 and (sample, rollout) == (1, 0)
            add("AddTool.execute", base + 5, base + 5.25, at, {"parameters": {"a": sample, "b": rollout}},
                None if failing else {"result": str(sample + rollout)}, exception="ValueError" if failing else None)
    add("SingleTurnAgentLoop.run", 50, 52, {"sample_index": 0, "rollout_n": 0, "step": step, "validate": True},
        {"validate": True}, {"response_text": "validated"})
    add("agent_loop_step", 0, 60, {"worker": "host:1"}, {})
    add("AsyncLLMServerManager.generate", 45, 48, {"step": step}, {"prompt": LONG},
        {"token_ids": list(range(TRACE_LIST_ITEMS + 36))}, messages=[{"role": "user", "content": LONG}])
    return made


@pytest.fixture
def traced_run(tmp_path, ray_session):
    """The spool of an async run with no tracker (spool_retention_s keeps every batch): (spool folder, traces logged
    by step, trajectories logged by step)."""
    spool = tmp_path / "spool"
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": str(spool), "spool_retention_s": 3600}}}
    tracking = Tracking("proj", "traced", [], config=config)
    logged, rollouts = {}, {}
    try:
        for step in STEPS:
            rollouts[step] = [trajectory(step, s, r) for s in range(SAMPLES) for r in range(ROLLOUTS)][::-1]
            tracking.log({"critic/score/mean": step / 10}, step=step)
            tracking.log_trajectories(rollouts[step], step=step)
            logged[step] = traces_of(step, time.time_ns())
            for t in reversed(logged[step]):  # logged as they end, not as they start: the viewer orders them
                tracking.log_trace(t["name"], step, t["start_ns"], t["end_ns"], status=t["status"],
                                   attributes=t["attributes"], messages=t["messages"], metadata=t["metadata"])
    finally:
        assert tracking.finish().complete
    return spool, logged, rollouts


def serve(path: Path):
    server = make_server(RunData(str(path)), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_the_api_gives_each_trace_once_timed_parsed_and_tied_to_its_rollout(traced_run):
    """Each step's summary counts its traces and errors; its detail holds every trace logged, once, in start order,
    with ms times from the step's first start, status, attributes, messages, inputs / output / exception parsed
    from the metadata, long strings and lists cut (and counted), and the index of the rollout with its sample and
    rollout index (none for the validation call, the span and the unsampled call)."""
    spool, logged, rollouts = traced_run
    server, url = serve(spool)
    try:
        run = get(f"{url}/api/run")
        assert run["error"] == "" and [s["step"] for s in run["steps"]] == list(STEPS)
        per_rollout = SAMPLES * ROLLOUTS * 3
        assert [(s["traces"], s["trace_errors"]) for s in run["steps"]] == [(per_rollout + 3, 0), (per_rollout + 3, 1),
                                                                           (per_rollout + 3, 0)]
        for step in STEPS:
            answer = get(f"{url}/api/step/{step}")
            assert len(answer["trajectories"]) == SAMPLES * ROLLOUTS
            traces = answer["traces"]
            by_call = {t["attributes"]["call"]: t for t in traces}
            assert len(by_call) == len(traces) == len(logged[step])  # every trace once
            assert [t["index"] for t in traces] == list(range(len(traces)))
            assert [t["offset_ms"] for t in traces] == sorted(t["offset_ms"] for t in traces)
            first = min(t["start_ns"] for t in logged[step])
            for sent in logged[step]:
                shown = by_call[sent["attributes"]["call"]]
                meta = dict(sent["metadata"])
                assert (shown["name"], shown["status"], shown["error"]) == (sent["name"], sent["status"],
                                                                            sent["status"] == "error")
                assert shown["duration_ms"] == pytest.approx((sent["end_ns"] - sent["start_ns"]) / 1e6)
                assert shown["offset_ms"] == pytest.approx((sent["start_ns"] - first) / 1e6)
                assert shown["start_s"] == pytest.approx(sent["start_ns"] / 1e9)
                assert shown["attributes"] == sent["attributes"]
                assert shown["exception_type"] == meta.pop("exception_type", None)
                inputs, output = meta.pop("inputs"), meta.pop("output", None)
                if inputs.get("prompt") == LONG:  # the huge call: cut for the page, and said so
                    assert shown["cut"] == 3 and shown["inputs"]["prompt"].startswith("x" * TRACE_TEXT_CHARS + "…")
                    assert "500 more characters" in shown["inputs"]["prompt"]
                    assert shown["output"]["token_ids"][:TRACE_LIST_ITEMS] == list(range(TRACE_LIST_ITEMS))
                    assert shown["output"]["token_ids"][TRACE_LIST_ITEMS:] == ["… [36 more items]"]
                    assert len(shown["messages"][0]["content"]) < len(LONG)
                    continue
                assert shown["cut"] == 0
                assert (shown["inputs"], shown["output"], shown["metadata"]) == (inputs, output, meta)
                assert shown["messages"] == sent["messages"]
                at = sent["attributes"]
                expected = next((i for i, r in enumerate(rollouts[step]) if "sample_index" in at and not at["validate"]
                                 and (r["meta"]["sample_index"], r["meta"]["rollout_index"])
                                 == (at["sample_index"], at["rollout_n"])), None)
                assert shown["trajectory"] == expected
                assert (expected is None) == (at.get("validate", True))
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_shows_a_steps_traces_grouped_by_sample(traced_run, browser, tmp_path):  # noqa: F811 (fixture)
    """Step 2's Traces section: one group per sample and rollout (the span last), each trace a row with its name,
    the failed tool call marked as an error; a row expands to its messages and inputs; a rollout's card folds its
    own traces; a group's link goes to its rollout. Screenshot: docs/images/view-traces.png when
    $TRACKLANE_SCREENSHOTS names docs/images (else tmp)."""
    spool, logged, rollouts = traced_run
    shots = Path(os.environ.get("TRACKLANE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    server, url = serve(spool)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{url}/")
        step_row = page.locator("#steps tbody tr[data-step='2']")
        step_row.wait_for()
        assert step_row.locator("td.traces").inner_text() == f"{len(logged[2])} (1 err)"
        step_row.click()
        rows = page.locator("#traces details.trace")
        page.wait_for_function(f"document.querySelectorAll('#traces details.trace').length === {len(logged[2])}")
        assert page.locator("#traces h2").inner_text() == f"step 2: {len(logged[2])} rollout traces, 1 failed"
        names = sorted(rows.nth(i).locator(".name").inner_text() for i in range(rows.count()))
        assert names == sorted(t["name"] for t in logged[2])
        groups = page.locator("#traces .trace-group")
        # 2 x 2 rollouts, the validation call, the two calls with no sample (together, last)
        assert groups.count() == SAMPLES * ROLLOUTS + 2
        assert groups.last.locator(".head").inner_text().startswith("not tied to a sample · 2 traces")
        failed = page.locator("#traces details.trace.error")
        assert failed.count() == 1
        assert failed.locator(".name").inner_text() == "AddTool.execute"
        assert failed.locator(".status").inner_text() == "error: ValueError"
        group = page.locator("#traces .trace-group[data-sample='1'][data-rollout='0']")
        assert "1 failed" in group.locator(".head").inner_text()
        assert group.locator("details.trace.error").count() == 1
        sent = next(t for t in logged[2] if t["status"] == "error")
        contents = failed.locator("pre.content")
        assert contents.count() == 0  # built when first opened
        failed.locator("summary").click()
        contents.first.wait_for()
        assert [contents.nth(i).inner_text() for i in range(contents.count())] == [m["content"] for m in sent["messages"]]
        assert json.loads(failed.locator("pre.inputs").inner_text()) == sent["metadata"]["inputs"]
        assert failed.locator("pre.exception").inner_text() == "ValueError"
        assert failed.locator("pre.output").count() == 0
        failed.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "view-traces.png"))
        # The rollout of sample 1, rollout 0 holds its three traces in its card, the failed one marked.
        index = next(i for i, r in enumerate(rollouts[2]) if (r["meta"]["sample_index"], r["meta"]["rollout_index"]) == (1, 0))
        card = page.locator(f"#pane-a .trajectory[data-index='{index}']")
        assert card.locator("details.rollout-traces > summary").inner_text() == "3 rollout traces · 1 failed"
        assert card.locator("details.trace.error").count() == 1
        page.fill("#search", "no rollout says this")  # the link shows its rollout even when a filter hid it
        page.wait_for_function("document.querySelectorAll('#pane-a .trajectory').length === 0")
        group.locator("a.to-rollout").click()
        card_js = f"document.querySelector(\"#pane-a .trajectory[data-index='{index}']\")"
        page.wait_for_function(f"{card_js} && {card_js}.classList.contains('flash')")
        assert page.input_value("#search") == "" and card.is_visible()
        page.locator("#steps tbody tr[data-step='3']").click()
        page.wait_for_function("document.querySelector('#traces h2').textContent.startsWith('step 3:')")
        assert page.locator("#traces details.trace.error").count() == 0
    finally:
        page.close()
        server.shutdown()
        server.server_close()
