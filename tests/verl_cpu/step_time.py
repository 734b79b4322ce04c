"""verl's own GRPO job, its step time with no logger, with verl's ``Tracking`` and with tracklane's.

    python -m tests.verl_cpu.step_time [--rounds 3] [--steps 8] [--warmup 2] [--out DIR]

Runs ``python -m verl.trainer.main_ppo`` unchanged on this CPU (tests/verl_cpu/: the CPU platform, the tiny model,
GSM8K-shaped rows; in verl's environment, ``.ci/verl_venv.sh``) once per mode in each round, the modes' order
rotated between rounds so that a machine that slows or speeds up over the run is shared out:

* ``none``: ``trainer.logger=[]``, verl's ``Tracking`` with no backend;
* ``verl``: verl's own ``Tracking`` into console, file, TensorBoard, MLflow (sqlite) and wandb (offline);
* ``tracklane``: the same loggers with the README's two overrides (``+trainer.log_async=true`` and the hook).

A probe (tests/verl_cpu/step_probe.py) notes each step as verl's trainer computes its metrics, whatever the
loggers: ``timing_s/step`` (verl's own figure: the step's work, which leaves out ``logger.log()``) and the wall
clock, whose difference between consecutive steps is the whole loop iteration, ``logger.log()`` included. The
first ``--warmup`` steps are left out (compilation, first allocations). Prints per round each mode's median of
both and its ratio to ``none`` in the same round, the rest of the loop outside ``timing_s/step`` (where a
synchronous ``logger.log()`` shows) and the first step, then the medians over rounds (the ratios' range in
brackets); writes ``verl_step_time.json``.
No timed assertions: the figures are the result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracklane.benchmarks.harness import fmt, machine, table, write_json

MODES = ("none", "verl", "tracklane")
LOGGED = ("console", "file", "tensorboard", "mlflow", "wandb")


def run_once(data: Path, out: Path, mode: str, steps: int, timeout: float) -> dict[str, Any]:
    """One job in ``mode``; its probe's lines and wall time."""
    from tests.verl_cpu.main_ppo import TRACKLANE_ON, grpo_overrides, job_env, loggers
    from tests.verl_cpu.step_probe import ENV as PROBE_ENV

    out.mkdir(parents=True)
    env = {**job_env(out), PROBE_ENV: str(out / "steps.jsonl")}
    overrides = [*grpo_overrides(data, steps=steps, run_dir=out),
                 loggers(() if mode == "none" else LOGGED), *(TRACKLANE_ON if mode == "tracklane" else [])]
    started = time.monotonic()
    with open(out / "job.log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=out, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: main_ppo exited {done.returncode}; see {out / 'job.log'}")
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {"mode": mode, "wall_s": wall, "steps": lines}


def figures(run: dict[str, Any], warmup: int) -> dict[str, float]:
    """Medians over the steps after ``warmup``: verl's ``timing_s/step``, the loop iteration (clock to clock), and
    the rest of the iteration outside ``timing_s/step`` (the metrics, ``logger.log()``, the next batch); the
    first step's ``timing_s/step``."""
    lines = sorted(run["steps"], key=lambda line: line["step"])
    kept = [line for line in lines if line["step"] > warmup]
    pairs = [(a, b) for a, b in zip(lines, lines[1:], strict=False) if b["step"] > warmup]
    return {"step_s": statistics.median(line["timing_s/step"] for line in kept),
            "loop_s": statistics.median(b["time"] - a["time"] for a, b in pairs),
            "rest_ms": 1e3 * statistics.median(b["time"] - a["time"] - b["timing_s/step"] for a, b in pairs),
            "first_step_s": lines[0]["timing_s/step"], "wall_s": run["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl_step_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds one job may take")
    parser.add_argument("--out", type=Path, default=Path("benchmarks") / "results" / "verl_step_time")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup + 1:
        parser.error("--steps must leave at least two steps after --warmup")
    from tests.verl_cpu.model import build_model, write_data

    work = Path(tempfile.mkdtemp(prefix="tracklane-verl-step-time-"))
    build_model(work / "model")
    write_data(work)
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        order = MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]
        for mode in order:
            run = run_once(work, work / f"round{round_}-{mode}", mode, args.steps, args.timeout)
            results.append({"round": round_, "mode": mode, **figures(run, args.warmup), "steps": run["steps"]})
            print(f"round {round_} {mode}: {fmt(results[-1]['step_s'])} s/step, loop {fmt(results[-1]['loop_s'])} s",
                  file=sys.stderr, flush=True)
    print(report(results))
    path = write_json(args.out, "verl_step_time", {"machine": machine(), "rounds": args.rounds, "steps": args.steps,
                                                    "warmup": args.warmup, "loggers": LOGGED, "runs": results})
    print(f"written: {path}; jobs under {work}")
    return 0


def report(results: list[dict[str, Any]]) -> str:
    """Per round, each mode's medians and their ratio to ``none`` in that round; then the medians over rounds."""
    base = {r["round"]: r for r in results if r["mode"] == "none"}
    rows = [[r["round"], r["mode"], fmt(r["step_s"]), fmt(r["step_s"] / base[r["round"]]["step_s"], 3),
             fmt(r["loop_s"]), fmt(r["loop_s"] / base[r["round"]]["loop_s"], 3), fmt(r["rest_ms"], 1),
             fmt(r["first_step_s"], 1), fmt(r["wall_s"], 0)]
            for r in sorted(results, key=lambda r: (r["round"], MODES.index(r["mode"])))]
    def median(mine: list[dict[str, Any]], figure: str, digits: int = 2) -> str:
        return fmt(statistics.median(r[figure] for r in mine), digits)

    def ratio(mine: list[dict[str, Any]], figure: str) -> str:
        """The median ratio to ``none`` in the same round, and its range over the rounds."""
        ratios = [r[figure] / base[r["round"]][figure] for r in mine]
        return f"{fmt(statistics.median(ratios), 3)} ({fmt(min(ratios), 3)}-{fmt(max(ratios), 3)})"

    for mode in MODES:
        mine = [r for r in results if r["mode"] == mode]
        rows.append(["all", mode, median(mine, "step_s"), ratio(mine, "step_s"), median(mine, "loop_s"),
                     ratio(mine, "loop_s"), median(mine, "rest_ms", 1),
                     median(mine, "first_step_s", 1), median(mine, "wall_s", 0)])
    return table(["round", "mode", "timing_s/step", "x none", "loop s", "x none", "rest ms", "step 1 s",
                  "job wall s"], rows)


if __name__ == "__main__":
    sys.exit(main())
