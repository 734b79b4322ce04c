"""The step of a large job: rollout dumps of 64 and 640 MB, 10,000 keys a step, 1 to 64 producers.

    python -m tracklane.benchmarks.scale [--quick] [--only dumps,keys,lifecycle,producers] [--out DIR] [--mlflow-uri URI]

Every run uses tracklane's defaults (``log_async: true``, nothing else set) and runs in a process of its own
(scale_child.py), so its peak RSS is its own; each dump run is paired with the same loop logging nothing
(``logger=[]``: the same objects built, interleaved with it), and each workload runs with and without a slow
tracker (MLflow behind a loopback proxy that holds each answer ``SLOW_DELAY_S``). A sidecar process notes when
each step's scalars and rollout rows reached the file tracker. Printed for each run:

    caller ms       what log() and log_trajectories() cost the trainer's thread a step, p50 / p99
    scalars s       log() -> the step's scalars in the file tracker's file, p50 / p99 (the sidecar saw them)
    rows s          log_trajectories() -> the step's last rollout row in the file, p50 / p99
    peak MiB        the trainer process's peak RSS, and above the logger=[] run; the largest lane actor's
    CPU ms/1k rows  the trainer process's CPU above logger=[], and the file lane's, per 1,000 rollout rows
    dropped         records any lane or the buffer dropped
    finish s        finish()'s time
    stored          every scalar point and rollout row (keys: every point in MLflow, wandb, TensorBoard, file,
                    read back by their own readers)

``producers`` (scale_producers.py): 1 to 64 Ray actors on a two-node local cluster log per-sample metrics
reduced across producers; every point must arrive once, and rank 0's CPU per producer and the lanes' CPU per
record are printed. Writes ``scale.json`` and PNG cost curves into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tracklane.benchmarks import plots
from tracklane.benchmarks.harness import BenchEnv, Clock, common_args, fmt, machine, percentile, table, write_json
from tracklane.benchmarks.readback import RunPlace, read_back

SLOW_DELAY_S = 0.2
"""How long the slow tracker (MLflow behind a proxy) holds each answer."""
SIX = ["console", "wandb", "mlflow", "swanlab", "tensorboard", "file"]
KEYS_TRACKERS = ["mlflow", "wandb", "tensorboard", "file"]


def dump_cases(quick: bool) -> list[dict[str, Any]]:
    """(label, rows a step of 4,000 characters, seconds between steps, steps)."""
    if quick:
        return [{"label": "4 MB", "rows": 1024, "period_s": 1.0, "steps": 3}]
    return [{"label": "64 MB", "rows": 16_384, "period_s": 5.0, "steps": 6},
            {"label": "640 MB", "rows": 163_840, "period_s": 20.0, "steps": 3}]


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in a fresh process; its figures (a failed run's stderr in ``error``)."""
    done = subprocess.run([sys.executable, "-m", "tracklane.benchmarks.scale_child", json.dumps(spec)], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        return {"spec": spec, "error": f"rc {done.returncode}: {done.stderr[-3000:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _lags(result: dict[str, Any], key: str) -> list[float]:
    seen, logged = result["seen"][key], result["logged_at"]
    return [seen[step] - at if step in seen else float("inf") for step, at in logged.items()]


def stored_in_file(root: Path, steps: int, scalars: int, rows: int) -> dict[str, int]:
    """Scalar points (``scale/*``) and rollout rows the file tracker holds, against what was logged."""
    points = 0
    with open(root / "metrics.jsonl", "rb") as lines:
        for line in lines:
            row = json.loads(line)
            if row.get("step") is not None:
                points += sum(1 for key in row["data"] if key.startswith("scale/"))
    found = 0
    for path in Path(f"{root / 'metrics'}_rollouts").glob("*.jsonl"):
        with open(path, "rb") as handle:
            found += sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(2**24), b""))
    return {"scalars": points, "scalars_logged": steps * scalars, "rows": found, "rows_logged": steps * rows}


def dumps(env: BenchEnv, quick: bool) -> list[dict[str, Any]]:
    points = []
    for case in dump_cases(quick):
        for slow in (False, True):
            name = f"dump-{case['label'].replace(' ', '')}{'-slow' if slow else ''}"
            base = {"steps": case["steps"], "period_s": case["period_s"], "scalars": 300, "rows": case["rows"],
                    "chars": 4000, "mlflow_uri": env.mlflow_uri, "slow_delay_s": SLOW_DELAY_S if slow else 0,
                    "trackers": ["file", "tensorboard"] + (["mlflow"] if slow else [])}
            runs = {}
            for mode in ("none", "async"):  # the baseline first: a cold process for both
                root = env.root / f"{name}-{mode}"
                runs[mode] = run_child({**base, "name": f"{name}-{mode}", "mode": mode, "root": str(root)})
            point = summarise_dump(case, slow, runs, env.root / f"{name}-async")
            points.append(point)
            print(f"  {name}: {point.get('error') or _dump_line(point)}", flush=True)
    return points


def summarise_dump(case: dict[str, Any], slow: bool, runs: dict[str, dict[str, Any]], root: Path) -> dict[str, Any]:
    none, run = runs["none"], runs["async"]
    point: dict[str, Any] = {"case": case["label"], "slow": slow, "rows": case["rows"], "steps": case["steps"],
                             "period_s": case["period_s"]}
    if "error" in run or "error" in none:
        point["error"] = (run.get("error") or none.get("error") or "")[-1500:]
        return point
    scalar_lags, row_lags = _lags(run, "scalars_at"), _lags(run, "rows_at")
    rows = case["rows"] * case["steps"]
    lanes = run["lanes"]
    point.update(
        caller_ms_p50=percentile(run["calls_ms"], 0.5), caller_ms_p99=percentile(run["calls_ms"], 0.99),
        scalars_s_p50=percentile(scalar_lags, 0.5), scalars_s_p99=percentile(scalar_lags, 0.99),
        rows_s_p50=percentile(row_lags, 0.5), rows_s_p99=percentile(row_lags, 0.99),
        trainer_peak_mib=run["trainer_peak_mib"], none_peak_mib=none["trainer_peak_mib"],
        above_none_mib=run["trainer_peak_mib"] - none["trainer_peak_mib"],
        lane_peak_mib=max(run["lane_peak_mib"].values(), default=0.0),
        trainer_cpu_ms_per_1k_rows=1e6 * (run["trainer_cpu_s"] - none["trainer_cpu_s"]) / rows,
        file_cpu_ms_per_1k_rows=1e6 * lanes["file"]["cpu_s"] / rows,
        dropped=run["dropped"], finish_s=run["finish_s"], complete=run["complete"],
        stored=stored_in_file(root, case["steps"], 300, case["rows"]),
        lanes={name: {k: lane[k] for k in ("lag_p99_s", "bulk_lag_p99_s", "cpu_s", "dropped", "failed")}
               for name, lane in lanes.items()},
    )
    return point


def _dump_line(p: dict[str, Any]) -> str:
    s = p["stored"]
    return (f"caller {fmt(p['caller_ms_p50'])} ms p50, scalars {fmt(p['scalars_s_p99'])} s p99, rows "
            f"{fmt(p['rows_s_p99'])} s p99, +{fmt(p['above_none_mib'], 0)} MiB, {p['dropped']} dropped, stored "
            f"{s['scalars']}/{s['scalars_logged']} scalars {s['rows']}/{s['rows_logged']} rows")


def keys(env: BenchEnv, quick: bool) -> list[dict[str, Any]]:
    points = []
    for slow in (False, True):
        name = f"keys{'-slow' if slow else ''}"
        root = env.root / name
        steps, n_keys = (2, 2_000) if quick else (10, 10_000)  # quick: reading 10,000 keys back takes minutes
        spec = {"name": name, "mode": "async", "root": str(root), "steps": steps, "period_s": 1.0, "scalars": n_keys,
                "rows": 0, "chars": 0, "mlflow_uri": env.mlflow_uri, "slow_delay_s": SLOW_DELAY_S if slow else 0,
                "trackers": KEYS_TRACKERS}
        run = run_child(spec)
        point: dict[str, Any] = {"slow": slow, "keys": n_keys, "steps": steps}
        if "error" in run:
            point["error"] = run["error"][-600:]
        else:
            place = RunPlace(root=root, project="scale", experiment=name, mlflow_uri=env.mlflow_uri or "")
            point.update(caller_ms_p50=percentile(run["calls_ms"], 0.5), caller_ms_p99=percentile(run["calls_ms"], 0.99),
                         scalars_s_p99=percentile(_lags(run, "scalars_at"), 0.99), dropped=run["dropped"],
                         finish_s=run["finish_s"], complete=run["complete"], logged=steps * n_keys,
                         stored={t: _scalars(read_back(t, place)) for t in KEYS_TRACKERS})
        points.append(point)
        print(f"  {name}: {point.get('error') or point['stored']}", flush=True)
    return points


def _scalars(found: dict[str, int] | str) -> int | str:
    return found if isinstance(found, str) else found["scalars"]


def lifecycle(env: BenchEnv, quick: bool) -> list[dict[str, Any]]:
    """Six trackers: Tracking() until every tracker is open (after Ray is up), and finish() with nothing backed up."""
    points = []
    for i in range(1 if quick else 3):
        name = f"six-{i}"
        spec = {"name": name, "mode": "async", "root": str(env.root / name), "steps": 3, "period_s": 0.5,
                "scalars": 100, "rows": 0, "chars": 0, "mlflow_uri": env.mlflow_uri, "trackers": SIX}
        run = run_child(spec)
        point = {"error": run["error"][-600:]} if "error" in run else \
            {"built_s": run["built_s"], "ready_s": run["ready_s"], "finish_s": run["finish_s"], "complete": run["complete"],
             "open_cpu_s": sum(run["lanes_open_cpu_s"].values()), "open_cpu_by_lane": run["lanes_open_cpu_s"]}
        points.append(point)
        print(f"  {name}: {point}", flush=True)
    return points


def print_tables(results: dict[str, Any]) -> None:
    if results.get("dumps"):
        rows = [[p["case"] + (" +slow" if p["slow"] else ""), fmt(p.get("caller_ms_p50")) + " / " + fmt(p.get("caller_ms_p99")),
                 fmt(p.get("scalars_s_p50")) + " / " + fmt(p.get("scalars_s_p99")),
                 fmt(p.get("rows_s_p50")) + " / " + fmt(p.get("rows_s_p99")),
                 f"{fmt(p.get('trainer_peak_mib'), 0)} (+{fmt(p.get('above_none_mib'), 0)}), "
                 f"lane {fmt(p.get('lane_peak_mib'), 0)}",
                 fmt(p.get("trainer_cpu_ms_per_1k_rows"), 0) + " / " + fmt(p.get("file_cpu_ms_per_1k_rows"), 0),
                 p.get("dropped", "-"), fmt(p.get("finish_s"), 1),
                 _stored(p)] for p in results["dumps"]]
        print(table(["dump a step", "caller ms", "scalars s", "rows s", "peak MiB", "CPU ms/1k rows", "dropped",
                     "finish s", "stored"], rows))
    if results.get("keys"):
        rows = [[f"{p['keys']:,} keys" + (" +slow" if p["slow"] else ""),
                 fmt(p.get("caller_ms_p50"), 3) + " / " + fmt(p.get("caller_ms_p99"), 3), fmt(p.get("scalars_s_p99")),
                 p.get("dropped", "-"), fmt(p.get("finish_s"), 1),
                 p.get("error") or ", ".join(f"{t} {n}/{p['logged']}" for t, n in p["stored"].items())]
                for p in results["keys"]]
        print(table(["workload", "log() ms p50 / p99", "scalars s p99", "dropped", "finish s", "stored"], rows))
    if results.get("lifecycle"):
        rows = [[i, fmt(p.get("built_s")), fmt(p.get("ready_s")), fmt(p.get("open_cpu_s"), 1), fmt(p.get("finish_s")),
                 p.get("complete", p.get("error"))] for i, p in enumerate(results["lifecycle"])]
        print(table(["six trackers", "Tracking() s", "all open s", "their CPU s", "finish s", "complete"], rows))
    if results.get("producers"):
        from tracklane.benchmarks.scale_producers import print_producers

        print_producers(results["producers"])


def _stored(p: dict[str, Any]) -> str:
    if "error" in p:
        return "error: " + p["error"].strip().splitlines()[-1][:80]
    s = p["stored"]
    return f"{s['scalars']}/{s['scalars_logged']} scalars, {s['rows']}/{s['rows_logged']} rows"


def figures(out: Path, results: dict[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = []
    dump_points = [p for p in results.get("dumps", []) if "error" not in p and not p["slow"]]
    if dump_points:
        xs = [p["rows"] * 4000 / 2**20 for p in dump_points]
        made.append(plots.lines(out / "scale_dump.png", "Cost of a rollout dump a step (defaults, file + TensorBoard)", xs,
                    {"caller ms p50": [p["caller_ms_p50"] for p in dump_points],
                     "scalars in file s p99": [p["scalars_s_p99"] for p in dump_points],
                     "rows in file s p99": [p["rows_s_p99"] for p in dump_points],
                     "trainer RSS above logger=[] GiB": [p["above_none_mib"] / 1024 for p in dump_points]},
                    "dump MiB a step", "ms / s / GiB", log_x=True))
    if results.get("producers"):
        from tracklane.benchmarks.scale_producers import producer_figures

        made += producer_figures(out, results["producers"])
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(parser, "scale")
    parser.add_argument("--only", default="dumps,keys,lifecycle,producers",
                        help="comma-separated sections: dumps, keys, lifecycle, producers")
    args = parser.parse_args()
    clock = Clock()
    only = set(args.only.split(","))
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    with BenchEnv(args.mlflow_uri, "scale") as env:
        import ray

        ray.shutdown()  # each run starts its own Ray in its own process
        for section, run in (("dumps", dumps), ("keys", keys), ("lifecycle", lifecycle)):
            if section in only:
                print(f"{section}:", flush=True)
                results[section] = run(env, args.quick)
        if "producers" in only:
            from tracklane.benchmarks.scale_producers import producers

            print("producers:", flush=True)
            results["producers"] = producers(env, args.quick)
    print_tables(results)
    results["plots"] = [str(p) for p in figures(args.out, results)]
    path = write_json(args.out, "scale", results)
    print(f"\nwrote {path}; wall time {clock.elapsed():.0f} s")


if __name__ == "__main__":
    main()
