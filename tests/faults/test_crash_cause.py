"""A crash leaves its cause behind: an uncaught exception in the trainer puts its traceback into every
tracker (text record ``error/traceback`` at the last step logged) before the runs are closed as failed.

The trainer is a subprocess that logs 5 steps and raises; the trackers are read back from disk.
Neither the file logger nor TensorBoard stores an exit code, so the script also writes down the
exit code its runs were finished with (at interpreter exit) and whether the report was complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tracklane.tracking import CRASH_TEXT, _capped
from tracklane.workers.sinks.media import safe_name
from tracklane.workers.sinks.tensorboard import TEXT_SUFFIX
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir, read_tensorboard_rich

STEPS = 5
MARKER = "boom-marker"

SCRIPT = """
import json, sys
from tracklane import Tracking

finish = Tracking.finish

def finish_and_note(self, exit_code=0, timeout=None):  # what the runs were closed with, for the test
    report = finish(self, exit_code=exit_code, timeout=timeout)
    with open(sys.argv[2], "w") as handle:
        json.dump({{"exit_code": exit_code, "complete": report.complete, "summary": report.summary()}}, handle)
    return report

Tracking.finish = finish_and_note
config = {{"trainer": {{"log_async": {log_async}, "async_log": {{"spool_dir": sys.argv[1]}}}}}}

def fit():  # verl's RayPPOTrainer.fit: a local Tracking, no finish()
    tracking = Tracking("crash-proj", "crash-exp", default_backend=["file", "tensorboard"], config=config)
    for step in range(1, {steps} + 1):
        tracking.log({{"loss": 1.0 / step}}, step=step)
    raise RuntimeError("{marker}")

if {local}:
    fit()
tracking = Tracking("crash-proj", "crash-exp", default_backend=["file", "tensorboard"], config=config)
for step in range(1, {steps} + 1):
    tracking.log({{"loss": 1.0 / step}}, step=step)
raise RuntimeError("{marker}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("log_async, local", [(True, False), (False, False), (False, True)],
                         ids=["async", "sync", "sync-local"])
def test_uncaught_exception_leaves_traceback_in_every_tracker(tmp_path, log_async, local):
    """An uncaught exception puts its traceback at the last step into every tracker, then the runs close as failed,
    also when the Tracking is a local of the function the exception left (verl's fit())."""
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(SCRIPT.format(log_async=log_async, steps=STEPS, marker=MARKER, local=local)))
    spool_dir, finished = tmp_path / "spool", tmp_path / "finished.json"
    file_path, tb_dir = tmp_path / "metrics.jsonl", tmp_path / "tensorboard"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(file_path), "TENSORBOARD_DIR": str(tb_dir),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run([sys.executable, str(script), str(spool_dir), str(finished)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)

    assert proc.returncode != 0, proc.stderr
    assert MARKER in proc.stderr  # the previous excepthook still prints the traceback
    closed = json.loads(finished.read_text())
    assert closed["exit_code"] == 1, closed  # closed as failed
    assert closed["complete"], closed["summary"]  # the crash record was delivered before closing

    # File logger: the 5 steps in its JSON lines, the crash record beside them as text at step 5.
    lines = [json.loads(line) for line in file_path.read_text().splitlines()]
    assert [line["step"] for line in lines if line["step"] is not None and "loss" in line["data"]] == \
        list(range(1, STEPS + 1))
    text_file = tmp_path / "metrics_media" / "text" / safe_name(CRASH_TEXT) / f"{STEPS}.txt"
    _assert_crash_text(text_file.read_text(encoding="utf-8"))

    # TensorBoard: the scalars, and one text event tagged error/traceback at step 5.
    assert sorted(step for step, key, _ in read_tensorboard_dir(tb_dir).points if key == "loss") == \
        list(range(1, STEPS + 1))
    texts = read_tensorboard_rich(tb_dir).texts[CRASH_TEXT + TEXT_SUFFIX]
    assert list(texts) == [STEPS] and len(texts[STEPS]) == 1
    _assert_crash_text(texts[STEPS][0])


def _assert_crash_text(text: str) -> None:
    assert "Traceback" in text and f"RuntimeError: {MARKER}" in text
    assert f"last step logged: {STEPS}" in text.splitlines()[0]


def test_crash_text_is_capped_keeping_the_header_and_the_tail():
    """A long traceback is cut to the limit, keeping the header and whole lines of its end."""
    header = "Uncaught RuntimeError; last step logged: 7\n"
    body = "".join(f"  frame line {i}\n" for i in range(10_000)) + "RuntimeError: boom\n"
    text = _capped(header, body, 4096)
    assert len(text) <= 4096
    assert text.startswith(header) and text.endswith("RuntimeError: boom\n")
    kept = text.splitlines()[2:]  # after the header and the note of what was cut
    assert "characters cut" in text.splitlines()[1] and kept[0].startswith("  frame line ")  # whole lines
    assert _capped(header, "short\n", 4096) == header + "short\n"
    assert len(_capped(header, body, 10)) == 10 and _capped(header, body, 0) == ""
