"""The README's main job with its six default trackers against the same job logging nowhere, runs alternating.

    python -m tracklane.benchmarks.main_job [--pairs 3] [--steps 100] [--first 10] [--out DIR]

Each run is a fresh ``python -m tracklane.trainer`` process (its own Ray, its trackers offline under a fresh folder,
MLflow on sqlite: exactly the README's first command), with ``trainer.logger=[]`` every other run. The child
(``tracklane.benchmarks.main_job_child``) runs ``tracklane.trainer.main.main`` unchanged and only writes the step times ``fit()``
measured. The figure is the median step time over steps ``--first``..``--steps`` of each run, and the ratio of
the median over the logging runs to the median over the silent ones; alternating keeps a drift of the machine
(another job, a warmer cache) out of the ratio. Writes ``main_job.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tracklane.benchmarks.harness import Clock, common_args, fmt, machine, table, write_json

MODES = {"six trackers": [], "logger=[]": ["trainer.logger=[]"]}


def run_once(mode: str, steps: int, folder: Path) -> list[float]:
    """One ``python -m tracklane.trainer`` run in ``folder``; its step times in seconds, by step."""
    times = folder / "step_times.json"
    env = {**os.environ, "TRACKLANE_STEP_TIMES": str(times), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    for key in ("WANDB_DIR", "SWANLAB_LOG_DIR", "MLFLOW_TRACKING_URI", "TENSORBOARD_DIR", "VERL_FILE_LOGGER_PATH"):
        env.pop(key, None)  # the job's own offline defaults, under this run's folder
    command = [sys.executable, "-m", "tracklane.benchmarks.main_job_child", f"trainer.total_steps={steps}",
               "trainer.progress=false", f"trainer.default_local_dir={folder / 'ckpt'}", *MODES[mode]]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return [seconds for _, seconds in sorted(json.loads(times.read_text()).items(), key=lambda kv: int(kv[0]))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracklane.benchmarks.main_job", description=__doc__.splitlines()[0])
    common_args(parser, "main_job")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--first", type=int, default=10, help="the first step counted (one-time set-up before it)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.steps, args.first = 1, 12, 4
    clock = Clock()
    root = Path(tempfile.mkdtemp(prefix="tracklane-main-job-"))
    runs: list[dict] = []
    for pair in range(args.pairs):
        for mode in MODES:
            folder = root / f"{pair}-{mode.replace(' ', '_').replace('=', '').replace('[]', 'none')}"
            folder.mkdir()
            steps = run_once(mode, args.steps, folder)[args.first - 1:]
            runs.append({"mode": mode, "pair": pair, "median_ms": statistics.median(steps) * 1e3,
                         "mean_ms": statistics.fmean(steps) * 1e3, "steps": len(steps)})
            print(f"[{clock.elapsed():6.0f} s] {mode}, pair {pair + 1}: median {runs[-1]['median_ms']:.1f} ms",
                  flush=True)
    medians = {mode: statistics.median(r["median_ms"] for r in runs if r["mode"] == mode) for mode in MODES}
    ratio = medians["six trackers"] / medians["logger=[]"]
    print(table(["mode", "pair", "median step ms", "mean step ms", "steps counted"],
                [[r["mode"], r["pair"] + 1, fmt(r["median_ms"], 1), fmt(r["mean_ms"], 1), r["steps"]] for r in runs]))
    print(f"median of the runs' medians: six trackers {fmt(medians['six trackers'], 1)} ms, logger=[] "
          f"{fmt(medians['logger=[]'], 1)} ms: ratio {fmt(ratio, 3)} (target <= 1.03)")
    write_json(args.out, "main_job", {"machine": machine(), "runs": runs, "medians_ms": medians, "ratio": ratio,
                                      "steps": args.steps, "first": args.first})
    print(f"wall time {clock.elapsed():.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
