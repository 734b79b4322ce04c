"""The console tracker on the trainer's own terminal: in order, unprefixed, never blocking, never tearing the status line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tracklane.config.console import console_config
from tracklane.core.errors import ConfigError
from tracklane.core.records import Metrics, RunSpec, Text
from tracklane.node.terminal import Terminal
from tracklane.workers.sinks.console import ConsoleSink

REPO = Path(__file__).resolve().parents[2]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(text: str) -> list[str]:
    """What a terminal shows for ``text``: "\\r\\033[K" clears the line being written, "\\n" ends it."""
    lines, current = [], ""
    for piece in text.split("\n"):
        current += piece
        current = current.rsplit("\r\033[K", 1)[-1]
        lines.append(current)
        current = ""
    return lines[:-1] + ([lines[-1]] if lines[-1] else [])


def test_console_lines_go_above_the_status_line_and_never_share_its_line():
    """On one terminal, console lines written while a status line shows end up as whole lines above it."""
    tty = _Tty()
    terminal = Terminal(out=tty)
    terminal.status("step 1/3 | score 0.1", tty)
    terminal.write("step:1 - a:1\nstep:1 - b:2\n")
    assert terminal.drain(5.0)
    terminal.status("step 2/3 | score 0.2", tty)
    terminal.write("step:2 - a:3\n")
    assert terminal.drain(5.0)
    terminal.end_status()
    assert _screen(tty.getvalue()) == ["step:1 - a:1", "step:1 - b:2", "step:2 - a:3", "step 2/3 | score 0.2"]


def test_without_a_terminal_the_status_is_plain_lines():
    """Redirected to a file, the status line is one plain line per update and console lines stay whole."""
    out, err = io.StringIO(), io.StringIO()
    terminal = Terminal(out=out)
    terminal.status("step 1/2", err)
    terminal.write("step:1 - a:1\n")
    assert terminal.drain(5.0)
    assert err.getvalue() == "step 1/2\n" and out.getvalue() == "step:1 - a:1\n"


class _StuckStream(io.StringIO):
    """A stdout that blocks until released (a paused pager, a full pipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.release.wait()
        return super().write(text)


def test_a_stuck_stdout_never_blocks_the_writer_and_drops_are_counted():
    """While stdout blocks, write() returns at once; text beyond the bound is dropped and counted, the rest printed."""
    stuck = _StuckStream()
    terminal = Terminal(out=stuck, max_chars=100)
    done = threading.Event()

    def writer() -> None:
        for step in range(20):
            terminal.write(f"step:{step} - key:{'x' * 10}\n")  # 21-22 characters a line
        done.set()

    threading.Thread(target=writer, daemon=True).start()
    assert done.wait(10.0), "write() blocked on a stuck stdout"
    assert terminal.dropped_chars > 0
    stuck.release.set()
    assert terminal.drain(10.0)
    printed = stuck.getvalue().splitlines()
    assert printed and all(line.startswith("step:") and line.endswith("x" * 10) for line in printed)
    assert len("".join(f"{line}\n" for line in printed)) + terminal.dropped_chars == sum(
        len(f"step:{step} - key:{'x' * 10}\n") for step in range(20))


def _metrics(step: int, values: dict) -> Metrics:
    return Metrics(step=step, values=values, time=0.0)


def test_compact_format_aligns_the_chosen_keys_and_prints_the_rest_every_n_steps():
    """compact: the chosen keys (patterns, in order) in fixed-width columns; the others every `every` steps."""
    settings = console_config({"format": "compact", "keys": ["critic/score/mean", "val-core/*"], "every": 2}).to_plain()
    sink = ConsoleSink(RunSpec(project="p", experiment="e"), settings)
    sink.capture_output()
    sink.write([_metrics(1, {"critic/score/mean": 0.5, "actor/pg_loss": -0.25}),
                _metrics(2, {"critic/score/mean": 0.125, "actor/pg_loss": 1e-9, "val-core/acc": 1.0}),
                _metrics(3, {"critic/score/mean": 12345.678})])
    lines = sink.take_output().splitlines()
    assert lines[0].startswith("step      1 | critic/score/mean ") and "pg_loss" not in lines[0]
    assert lines[1].startswith("step      2 | critic/score/mean ") and "val-core/acc" in lines[1]
    assert lines[2] == "  step:2 - actor/pg_loss:1e-09"
    assert lines[3].startswith("step      3 | ")
    columns = [line.index("critic/score/mean") for line in (lines[0], lines[1], lines[3])]
    assert len(set(columns)) == 1  # aligned
    ends = [line.split(" | ")[1] for line in (lines[0], lines[1], lines[3])]
    assert len({len(end) for end in ends}) == 1  # fixed-width values
    assert sink.take_output() == ""  # taken once


def test_a_short_text_is_shown_and_a_long_one_summed_up():
    """A one-line text (a lane's error: error/lane/<name>) is printed as it is, not as its length; a long or
    multi-line one (samples, a traceback) as its size and the start of its first line."""
    sink = ConsoleSink(RunSpec(project="p", experiment="e"), console_config(None).to_plain())
    sink.capture_output()
    error = "tracklane: the mlflow lane gave up: actor died: The actor is dead because its worker process has died."
    sink.write([Text(step=3, name="error/lane/mlflow", text=error, time=0.0),
                Text(step=4, name="rollout/samples", text="## sample 1\n" + "x" * 500, time=0.0)])
    lines = sink.take_output().splitlines()
    assert lines[0] == f"step:3 - error/lane/mlflow: {error}"
    assert lines[1] == "step:4 - rollout/samples: text of 512 characters: ## sample 1..."


def test_verl_format_is_the_default_and_bad_console_settings_are_refused():
    """Without settings the console prints verl's line; an unknown format or key is a clear ConfigError."""
    sink = ConsoleSink(RunSpec(project="p", experiment="e"), ConsoleSink.resolve(RunSpec(project="p", experiment="e"), {}, {}))
    sink.capture_output()
    sink.write([_metrics(7, {"a": 1.5, "b": 2})])
    assert sink.take_output() == "step:7 - a:1.5 - b:2\n"
    with pytest.raises(ConfigError, match="trainer.console.format must be one of verl, compact, got 'fancy'"):
        console_config({"format": "fancy"})
    with pytest.raises(ConfigError, match="unknown key"):
        console_config({"colour": True})


CHILD = """
import os, sys, time
from tracklane import Tracking
t = Tracking("p", "e", ["console"], config={"trainer": {"log_async": True, "async_log": {"flush_interval_s": 0.1}}})
assert t.wait_ready(120)
for step in range(1, 31):
    t.log({"critic/score/mean": step / 10, "actor/pg_loss": -0.001 * step}, step=step)
    print(f"logged:{step}", flush=True)
    time.sleep(0.1)
t.finish()
print("finished", flush=True)
"""


@pytest.mark.slow
def test_async_console_prints_on_the_trainers_stdout_in_order_while_the_run_goes_on(tmp_path):
    """With log_async the console's lines reach the trainer's own stdout unprefixed, in step order, each
    before the trainer logged 10 more steps (not held until finish), all before finish() returns."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TRACKLANE_SYSTEM_METRICS_S": "0",
           "TRACKLANE_SPOOL_ROOT": str(tmp_path / "spools"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    steps = [int(line.split(" - ")[0][len("step:"):]) for line in out if line.startswith("step:")]
    assert steps == list(range(1, 31))
    assert not [line for line in out if "pid=" in line or "LaneActor" in line]
    assert "LaneActor pid=" not in done.stderr  # nothing forwarded by Ray either
    logged_before = {}
    logged = 0
    for line in out:
        if line.startswith("logged:"):
            logged = int(line[len("logged:"):])
        elif line.startswith("step:"):
            logged_before[int(line.split(" - ")[0][len("step:"):])] = logged
    late = {step: seen for step, seen in logged_before.items() if seen >= step + 10}
    assert not late, f"console lines printed only after 10 more steps were logged: {late}"
    assert out[-1] == "finished"
