"""What logging costs the training loop: no logging vs tracklane sync vs verl's Tracking vs tracklane async.

    python -m tracklane.benchmarks.overhead [--quick] [--out DIR] [--mlflow-uri URI]

Every scenario (a step kind x a workload x a set of trackers) runs its modes in interleaved
rounds, the order rotated each round, so machine noise hits every mode alike; ratios compare
medians measured in the same run. Each run gets fresh tracker folders and is read back from the
trackers' own stores afterwards. The trainer step kind runs ``tracklane.trainer.main.fit`` itself.
Writes ``overhead.json`` and PNGs into ``--out`` (default benchmarks/results/overhead).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

from tracklane.benchmarks.harness import (
    ALL_TRACKERS,
    BenchEnv,
    Clock,
    common_args,
    machine,
    p50_p99,
    proc_kib,
    quiet_stdout,
    write_json,
)
from tracklane.benchmarks.loop import call_costs, gpu_steps
from tracklane.benchmarks.modes import MODES, make_mode, verl_unavailable
from tracklane.benchmarks.overhead_report import TARGET_SCENARIO, plot_report, print_report
from tracklane.benchmarks.readback import read_back
from tracklane.benchmarks.workloads import WORKLOADS, verl_scalars

MAX_TRAJECTORIES = 64  # tracklane's default record_limits.max_trajectories: what its trackers store per step
# The same in every tracker, the file too (whose own default is every trajectory, as verl's dumps): each mode
# is then measured storing the same records, as in the figures before per-backend limits.
RECORD_LIMITS = {"max_trajectories": MAX_TRAJECTORIES, "backends": {"file": {"max_trajectories": MAX_TRAJECTORIES}}}
TRAINER_NO_VERL = ("the trainer builds its own tracklane Tracking, so verl's Tracking cannot be swapped in "
                   "without changing the trainer")


@dataclass(frozen=True, slots=True)
class Scenario:
    kind: str
    step_s: float
    workload: str
    trackers: tuple[str, ...]
    steps: int
    """Steps per mode, over all rounds."""
    rounds: int = 1
    """Runs per mode, interleaved with the other modes' (the order rotated each round)."""

    @property
    def label(self) -> str:
        who = "all" if len(self.trackers) > 1 else self.trackers[0]
        return f"{self.kind}/{self.workload}/{who}"


def plan(quick: bool) -> list[Scenario]:
    """Sized for ~15 min (full) or ~1 min (quick) on 2 cores. The 500 ms kind gets 60 steps a mode:
    200 would add ~10 minutes, and at 500 ms a step the medians settle within a few tens of steps. Quick: 8
    steps + 3 warm-up, so step 10 logs the workload's validation generations too."""
    everything = tuple(ALL_TRACKERS)
    if quick:
        return [Scenario("gpu50ms", 0.05, "full", everything, 8)]
    alone = [Scenario("gpu50ms", 0.05, "scalars", (t,), 200) for t in ALL_TRACKERS]
    return alone + [Scenario("gpu50ms", 0.05, "scalars", everything, 200),
                    Scenario("gpu50ms", 0.05, "full", everything, 200, rounds=2),
                    Scenario("python50ms", 0.05, "full", everything, 200, rounds=2),
                    Scenario("gpu500ms", 0.5, "full", everything, 60, rounds=2)]


def run_scenario(env: BenchEnv, sc: Scenario, verl_reason: str | None, calls: int = 0,
                 async_log: dict | None = None) -> dict:
    """``calls``: also measure bare log() calls (2 ms apart) in each run, after its steps, before finish."""
    workload = WORKLOADS[sc.workload]
    modes = {m: {"runs": []} for m in MODES}
    if verl_reason:
        modes["verl"] = {"skipped": verl_reason}
    active = [m for m in MODES if "skipped" not in modes[m]]
    rounds = sc.rounds
    per_round = max(1, sc.steps // rounds)
    for r in range(rounds):
        for name in active[r % len(active):] + active[:r % len(active)]:
            first = 1 + r * (per_round + 3 + calls)
            modes[name]["runs"].append(_one_run(env, sc, name, workload, per_round, first, calls // rounds,
                                                async_log))
    costs = {name: _call_costs(modes[name]["runs"]) for name in active if name != "none"} if calls else {}
    for name in active:
        modes[name] = _summarize(modes[name]["runs"])
    base = modes["none"]["step_ms_p50"]
    for name in active:
        modes[name]["ratio"] = modes[name]["step_ms_p50"] / base
    out = {"label": sc.label, "kind": sc.kind, "step_s": sc.step_s, "workload": sc.workload,
           "trackers": list(sc.trackers), "steps_per_mode": per_round * rounds, "rounds": rounds, "modes": modes}
    if calls:
        skipped = {"verl": {"skipped": verl_reason}} if verl_reason else {}
        out["call_cost"] = {"gap_ms": 2.0, "idle_ms": 20.0, "trackers": list(sc.trackers), "modes": {**costs, **skipped}}
    return out


def _call_costs(runs: list[dict]) -> dict:
    merged = {k: [v for run in runs for v in run["calls"][k]] for k in runs[0]["calls"]}
    return {k: p50_p99(v) for k, v in merged.items()}


def _one_run(env: BenchEnv, sc: Scenario, name: str, workload, steps: int, first_step: int, calls: int,
             async_log: dict | None) -> dict:
    place = env.place(f"{sc.kind}-{sc.workload}-{name}")
    trackers = list(sc.trackers)
    with quiet_stdout():
        mode = make_mode(name, trackers, place, async_log, record_limits=RECORD_LIMITS)
        kept = workload.trajectories if name == "verl" else MAX_TRAJECTORIES
        times = gpu_steps(mode, sc.step_s, workload, steps, first_step, kept, python_bound=sc.kind.startswith("python"))
        costs = _measure_calls(mode, calls, first_step + steps + 3, times.logged) if calls and name != "none" else None
        actors = {t: proc_kib(pid, "VmHWM") / 1024 for t, pid in mode.actor_pids().items()}
        started = time.perf_counter()
        report = mode.finish()
        finish_s = time.perf_counter() - started
    run = {"step_s": times.step_s, "log_us": times.log_us, "logging_us": times.logging_us,
           "rss_mib": max(times.rss_kib, default=0) / 1024, "actors_mib": actors, "finish_s": finish_s,
           "logged": times.logged, "delivered": {}, "lag_ms": {}, "complete": None}
    if costs is not None:
        run["calls"] = {k: getattr(costs, k) for k in ("warm_us", "cold_us", "floor_warm_us", "floor_cold_us")}
    if name == "none":
        return run
    readers = trackers + (["rollout_dump"] if name == "verl" and workload.trajectories else [])
    run["delivered"] = {t: _delivered(t, place, report, times.logged) for t in readers}
    if report is not None:
        run["complete"] = report.complete
        run["summary"] = report.summary()
        run["lag_ms"] = {t: {"p50": lane.lag_p50_s * 1e3, "p99": lane.lag_p99_s * 1e3} for t, lane in report.lanes.items()}
    return run


def _measure_calls(mode, calls: int, first_step: int, logged: dict):
    """Bare log() calls on the same trackers; the in-line paths (~100 ms a call) get a tenth of them."""
    if hasattr(mode, "tracking") and getattr(mode.tracking, "log_async", False):
        mode.tracking.flush(timeout=300)  # drain the steps' backlog first: measure log(), not the catch-up
    n = calls if mode.name == "async" else max(10, calls // 10)
    costs = call_costs(mode, n, gap_s=0.002, first_step=first_step)
    logged["scalars"] += n * len(verl_scalars(0))
    return costs


def _delivered(tracker: str, place, report, logged: dict) -> dict | str:
    if tracker != "console":
        return read_back(tracker, place)
    if report is None:  # synchronous: printed during the call
        return dict(logged)
    lane = report.lanes.get("console")
    return dict(logged) if lane is not None and lane.complete else f"incomplete: {lane.line() if lane else 'no lane'}"


def _summarize(runs: list[dict]) -> dict:
    """One mode of a scenario: its rounds merged."""
    steps = [s for run in runs for s in run["step_s"]]
    out = {"step_ms_p50": statistics.median(steps) * 1e3, "steps": len(steps),
           "log_us": p50_p99([v for run in runs for v in run["log_us"]]),
           "logging_us": p50_p99([v for run in runs for v in run["logging_us"]]),
           "finish_s": max(run["finish_s"] for run in runs), "trainer_rss_mib": max(run["rss_mib"] for run in runs),
           "actors_mib": _max_by_key(run["actors_mib"] for run in runs),
           "logged": _sum_by_key(run["logged"] for run in runs), "delivered": {}, "lag_ms": {},
           "complete": None if runs[0]["complete"] is None else all(run["complete"] for run in runs)}
    for tracker in runs[0]["delivered"]:
        counts = [run["delivered"][tracker] for run in runs]
        bad = next((c for c in counts if isinstance(c, str)), None)
        out["delivered"][tracker] = bad if bad else _sum_by_key(counts)
    for tracker in runs[0]["lag_ms"]:
        out["lag_ms"][tracker] = _max_by_key(run["lag_ms"][tracker] for run in runs)
    if runs[0].get("summary"):
        out["summaries"] = [run["summary"] for run in runs]
    return out


def _sum_by_key(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _max_by_key(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = max(out.get(k, v), v)
    return out


# The main job's extra logging (KL heatmap, gradient and weight histograms, Markdown samples), switched off for the
# "_lean" modes. The trainer computes the extras whether or not anything logs them, so "async_lean" is compared with
# "none_lean" (neither computes them), "async" with "none" (both do): each ratio is what logging alone costs.
NO_EXTRAS = ["trainer.image_freq=0", "trainer.log_gradients=false", "trainer.text_freq=0"]


TRAINER_MODES = ("none", "none_lean", "sync", "thread", "async", "async_lean")


def run_trainer(env: BenchEnv, steps: int, trackers: list[str], warmup: int = 4, sft_steps: int | None = None,
                rounds: int = 1) -> dict:
    """The real trainer (tracklane.trainer.main.fit): no logging vs sync vs the thread peer vs async, and async without the
    extra logging.

    Its first steps run torch's one-time set-up (seconds here): the first ``warmup`` are left out of the
    figures (``sft_steps``: the supervised warm-up's, default the job's). torch gets one thread, so the step time is
    less at the mercy of other load on 2 cores. The extras
    come every 10th step, so the mean step time shows their cost where the median would hide it.
    ``rounds``: every mode runs ``steps / rounds`` steps per round, every other round in reverse order, so a machine
    that drifts over the minutes (one mode's run alone moves +-2% here) weighs on every mode alike, and no mode
    always runs first in a fresh process or right after the in-line modes.
    """
    import torch

    torch.set_num_threads(1)
    per_round = max(1, steps // rounds)
    out: dict = {"steps": per_round * rounds, "rounds": rounds, "trackers": trackers,
                 "modes": {"verl": {"skipped": TRAINER_NO_VERL}}}
    runs: dict[str, list[dict]] = {name: [] for name in TRAINER_MODES}
    for r in range(rounds):
        for name in TRAINER_MODES[::-1] if r % 2 else TRAINER_MODES:
            runs[name].append(_trainer_run(env, name, per_round, trackers, warmup, sft_steps))
    for name in TRAINER_MODES:
        out["modes"][name] = _merge_trainer_runs(runs[name])
    for name, mode in out["modes"].items():
        if "step_ms_p50" in mode:
            base = out["modes"]["none_lean" if name.endswith("_lean") else "none"]
            mode["ratio"] = mode["step_ms_p50"] / base["step_ms_p50"]
            mode["ratio_mean"] = mode["step_ms_mean"] / base["step_ms_mean"]
    out["extras_ratio_mean"] = out["modes"]["async"]["step_ms_mean"] / out["modes"]["async_lean"]["step_ms_mean"]
    return out


def _trainer_run(env: BenchEnv, name: str, steps: int, trackers: list[str], warmup: int,
                 sft_steps: int | None) -> dict:
    from tracklane import Tracking
    from tracklane.benchmarks.thread_peer import thread_tracking
    from tracklane.trainer.config import load_config
    from tracklane.trainer.main import fit

    place = env.place(f"trainer-{name}")
    logger = "[]" if name.startswith("none") else "[" + ",".join(trackers) + "]"
    cfg = load_config([f"trainer.logger={logger}", f"trainer.log_async={name.startswith('async')}",
                       f"trainer.total_steps={steps + warmup}", "trainer.progress=false", "trainer.save_freq=0",
                       f"trainer.default_local_dir={place.root / 'ckpt'}", f"trainer.project_name={place.project}",
                       f"trainer.experiment_name={place.experiment}", *(NO_EXTRAS if name.endswith("_lean") else []),
                       *([f"actor_rollout_ref.warmup.steps={sft_steps}"] if sft_steps is not None else [])])
    with quiet_stdout():
        result = fit(cfg, thread_tracking if name == "thread" else Tracking)
    report = result.report
    run: dict = {"step_s": [s for step, s in result.step_s.items() if step > warmup],
                 "finish_s": report.elapsed_s if report else 0.0, "complete": report.complete if report else None}
    if not name.startswith("none"):
        run["delivered"] = {t: read_back(t, place) for t in trackers if t != "console"}
        if report is not None and name == "async":
            run["lag_ms"] = {t: {"p50": lane.lag_p50_s * 1e3, "p99": lane.lag_p99_s * 1e3}
                             for t, lane in report.lanes.items()}
            # what each lane actor spent (its whole process: Ray's threads and the SDK's included)
            run["lane_cpu"] = {t: (lane.cpu_s, lane.records_written) for t, lane in report.lanes.items()}
    return run


def _merge_trainer_runs(runs: list[dict]) -> dict:
    """One trainer mode: its rounds' steps pooled, read-back counts summed (a read failure kept as it was said)."""
    steps = [s for run in runs for s in run["step_s"]]
    mode: dict = {"step_ms_p50": statistics.median(steps) * 1e3, "step_ms_mean": statistics.fmean(steps) * 1e3,
                  "steps": len(steps), "round_ms_p50": [statistics.median(run["step_s"]) * 1e3 for run in runs],
                  "finish_s": max(run["finish_s"] for run in runs),
                  "complete": None if runs[0]["complete"] is None else all(run["complete"] for run in runs)}
    if "delivered" in runs[0]:
        mode["delivered"] = {}
        for tracker in runs[0]["delivered"]:
            counts = [run["delivered"][tracker] for run in runs]
            bad = next((c for c in counts if isinstance(c, str)), None)
            mode["delivered"][tracker] = bad if bad else _sum_by_key(counts)
    if "lag_ms" in runs[0]:
        mode["lag_ms"] = {t: _max_by_key(run["lag_ms"][t] for run in runs) for t in runs[0]["lag_ms"]}
        spent = _sum_by_key({t: cpu for t, (cpu, _) in run["lane_cpu"].items()} for run in runs)
        written = _sum_by_key({t: n for t, (_, n) in run["lane_cpu"].items()} for run in runs)
        mode["lane_cpu_s_per_1000_records"] = {t: 1e3 * spent[t] / written[t] for t in spent if written[t]}
    return mode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser, "overhead")
    parser.add_argument("--only", metavar="LABEL", help="run only the scenarios whose label contains this "
                        "(e.g. gpu50ms/full/all), and skip the trainer step kind; 'trainer': only the trainer")
    parser.add_argument("--async-log", metavar="KEY=VALUE", action="append", default=[],
                        help="a trainer.async_log setting for tracklane's modes (repeatable), e.g. "
                             "flush_interval_s=0.1 or lane_max_bytes=33554432")
    args = parser.parse_args(argv)
    async_log = _settings(args.async_log)
    clock = Clock()
    verl_reason = verl_unavailable()
    if verl_reason:
        print(f"verl mode skipped: {verl_reason}")
    scenarios = [sc for sc in plan(args.quick) if args.only != "trainer" and (args.only is None or args.only in sc.label)]
    result: dict = {"benchmark": "overhead", "quick": args.quick, "machine": machine(), "modes": MODES,
                    "async_log": async_log,
                    "verl": {"available": verl_reason is None, "reason": verl_reason},
                    "max_trajectories": MAX_TRAJECTORIES}
    with BenchEnv(args.mlflow_uri, "overhead") as env:
        result["scenarios"] = []
        for sc in scenarios:
            print(f"[{clock.elapsed():6.0f} s] {sc.label}: {sc.steps} steps per mode", flush=True)
            calls = (60 if args.quick else 1000) if sc.label == TARGET_SCENARIO else 0
            result["scenarios"].append(run_scenario(env, sc, verl_reason, calls, async_log))
            if calls:
                result["call_cost"] = {"calls": calls, **result["scenarios"][-1]["call_cost"]}
        if args.only in (None, "trainer"):
            print(f"[{clock.elapsed():6.0f} s] the real trainer", flush=True)
            # quick: two light trackers and 2 + 2 steps, so the smoke test stays short (6 + 4: ~7 s more); full: all six
            result["trainer"] = (run_trainer(env, 2, ["tensorboard", "file"], warmup=2, sft_steps=10) if args.quick
                                 else run_trainer(env, 200, ALL_TRACKERS, rounds=2))
    result["targets"] = print_report(result)
    result["plots"] = [str(p) for p in plot_report(result, args.out)]
    result["wall_s"] = clock.elapsed()
    path = write_json(args.out, "overhead", result)
    print(f"\nwrote {path} and {len(result['plots'])} plots; wall time {result['wall_s']:.0f} s")
    print("regenerate: python -m tracklane.benchmarks.overhead" + (" --quick" if args.quick else ""))
    return 0


def _settings(pairs: list[str]) -> dict:
    """``KEY=VALUE`` strings as a trainer.async_log mapping, values parsed as YAML (numbers, null, words)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--async-log takes KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
