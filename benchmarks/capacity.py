"""Each lane's CPU per 1,000 records against its tracker's bare SDK's, for scalars and for trajectories.

    python -m tracklane.benchmarks.capacity [--quick] [--out DIR] [--mlflow-uri URI] [--trackers file,tensorboard,...]

For each tracker and workload the same records are written twice:

* **bare**: the tracker's SDK called directly, in a process of its own (no Ray in it), its fastest honest way:
  ``BARE_PATH`` names each (the file as verl 0.9.1's ``FileLogger`` writes a line: orjson, and the rollout rows the
  same way; TensorBoard through the package's ``EventFileWriter`` with one ``Summary`` a step; MLflow ``log_batch``
  a step and ``log_dict`` a step of trajectories; wandb ``run.log`` with a ``wandb.Table`` a step; SwanLab
  ``swanlab.log``); TensorBoard also through torch's ``SummaryWriter`` called once per value, as verl calls it;
* **lane**: ``Tracking`` with ``log_async: true`` and that one tracker, ``log*()`` as fast as the loop goes, then
  ``finish()``; what arrived is read back from the tracker's own store.

The figure is CPU seconds per 1,000 records (scalar points, or trajectories), from the first write to the end of
the tracker's close, opening not counted: on the bare side the process's CPU and its children's (wandb-core); on the
lane side the lane actor's and its children's (``Work.cpu_s``). The machine-independent target: lane <= 1.25x bare.
The trainer process's own CPU on the lane run (the loop and the shipper: it converts, renders and encodes) is shown
beside it. A tracker server's CPU (MLflow's) is on neither side. Wall-clock rates are printed too, for reference.

Then the pipeline's own ceiling: the same kinds of records, more of them, through buffer -> shipper -> Ray -> lane
actor into a sink that only counts them (``memory_sink.discard``), against the targets of 200,000 scalars/s and
50 MB/s raw. Writes ``capacity.json`` and ``capacity.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracklane.benchmarks import plots
from tracklane.benchmarks.harness import BenchEnv, Clock, common_args, fmt, machine, quiet_stdout, table, write_json
from tracklane.benchmarks.readback import RunPlace, read_back
from tracklane.benchmarks.workloads import trajectories, trajectory_bytes, verl_scalars

TRACKERS = ["file", "tensorboard", "mlflow", "wandb", "swanlab"]
TRAJ_KEY = "rollout/trajectories"
POINT_BYTES = 16  # a scalar point's raw size (key reference + float64), as the other benchmarks count it


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    steps: int
    trajectories: int  # per step; 0: scalars only

    def records(self) -> list[tuple[int, Any]]:
        """(step, metrics dict) or (step, list of trajectories), built before anything is timed."""
        if not self.trajectories:
            return [(s, {k: float(v) for k, v in verl_scalars(s).items()}) for s in range(self.steps)]
        return [(s, trajectories(self.trajectories, s)) for s in range(self.steps)]

    def units(self) -> int:
        """Scalar points, or trajectories, in the whole workload."""
        return self.steps * (self.trajectories or len(verl_scalars(0)))

    def raw_bytes(self) -> int:
        return self.units() * (trajectory_bytes() if self.trajectories else POINT_BYTES)


def workloads(quick: bool) -> list[Workload]:
    if quick:  # a row is mostly its lane actor starting and its SDK opening: the records are few
        return [Workload("scalars", 20, 0), Workload("trajectories", 4, 8)]
    return [Workload("scalars", 2000, 0), Workload("trajectories", 200, 64)]


SCALE = {("file", "scalars"): 15, ("tensorboard", "scalars"): 2, ("wandb", "scalars"): 3, ("file", "trajectories"): 5}
"""More steps for a tracker whose bare path writes the workload in well under a second (the file's scalars in
0.07 s): a lane's rate is what it sustains while the loop logs, so its run must outlast the shipper's first
flush interval, or it measures one batch packed, sent and written after the loop ended."""


def sized(workload: Workload, tracker: str, quick: bool) -> Workload:
    scale = 1 if quick else SCALE.get((tracker, workload.name), 1)
    return Workload(workload.name, workload.steps * scale, workload.trajectories)


# -- bare SDKs (each run in a process of its own: python -m tracklane.benchmarks.capacity bare '<spec>') ------------------
def _plain(trajectory: dict) -> dict:
    return {**trajectory, "token_ids": trajectory["token_ids"].tolist()}


class Spent:
    """Wall time and CPU (this process, its ended and its live children: wandb-core) from its start."""

    def __init__(self) -> None:
        self._started, self._cpu0 = time.perf_counter(), _tree_cpu()

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self._started, _tree_cpu() - self._cpu0


def _tree_cpu() -> float:
    import psutil

    me = psutil.Process()
    ended = me.cpu_times()  # its children waited for (in clock ticks: this process's own, in ns, below)
    live = [child.cpu_times() for child in me.children(recursive=True)]
    return time.process_time() + ended.children_user + ended.children_system + sum(t.user + t.system for t in live)


def bare_file(place: RunPlace, work: list, is_traj: bool) -> tuple[float, float]:
    """As verl 0.9.1's FileLogger writes a line (orjson, OPT_SERIALIZE_NUMPY, an unbuffered write each); the rollout
    rows the same way, a step's rows in one write."""
    import orjson

    spent = Spent()
    if is_traj:
        place.rollout_dump.mkdir(parents=True, exist_ok=True)
        for step, items in work:
            with open(place.rollout_dump / f"{step}.jsonl", "wb") as handle:
                handle.write(b"".join(orjson.dumps({**t, "step": step}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
                                      for t in items))
    else:
        with open(place.file, "wb", buffering=0) as handle:
            for step, values in work:
                handle.write(orjson.dumps({"step": step, "data": values}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return spent.stop()


def bare_tensorboard(place: RunPlace, work: list, is_traj: bool) -> tuple[float, float]:
    """The fastest the ``tensorboard`` package offers: its ``EventFileWriter``, one ``Summary`` a step holding all of
    the step's scalars (or the step's trajectories as one text summary)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(place.tensorboard))
    spent = Spent()
    for step, payload in work:
        if is_traj:
            summary = text_pb(TRAJ_KEY, "\n\n".join(json.dumps(_plain(t)) for t in payload))
        else:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                                 for k, v in payload.items()])
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()
    return spent.stop()


def tensorboard_as_verl(place: RunPlace, work: list, is_traj: bool) -> tuple[float, float]:
    """torch's ``SummaryWriter``, one ``add_scalar`` per value, as verl's Tracking calls it (many times slower than
    the package's own fast path: shown beside the ratio, not used as the bare figure)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(place.tensorboard))
    spent = Spent()
    for step, payload in work:
        if is_traj:
            writer.add_text(TRAJ_KEY, "\n\n".join(json.dumps(_plain(t)) for t in payload), step)
        else:
            for key, value in payload.items():
                writer.add_scalar(key, value, step)
    writer.close()
    return spent.stop()


def bare_mlflow(place: RunPlace, work: list, is_traj: bool) -> tuple[float, float]:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from tracklane.workers.sinks.mlflow import mlflow_key  # verl's keys have "@"; MLflow refuses it (the key map is not timed)

    client = MlflowClient(place.mlflow_uri)
    experiment = client.create_experiment(f"{place.project}-bare")
    run_id = client.create_run(experiment).info.run_id
    if not is_traj:
        work = [(step, {mlflow_key(k): v for k, v in values.items()}) for step, values in work]
    spent = Spent()
    for step, payload in work:
        if is_traj:
            client.log_dict(run_id, [_plain(t) for t in payload], f"trajectories/{step}.json")
        else:
            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in payload.items()])
    client.set_terminated(run_id)
    return spent.stop()


def bare_wandb(place: RunPlace, work: list, is_traj: bool) -> tuple[float, float]:
    import wandb

    run = wandb.init(project=f"{place.project}-bare", dir=str(place.wandb), mode="offline", reinit="create_new")
    spent = Spent()
    for step, payload in work:
        if is_traj:
            table_ = wandb.Table(columns=["messages", "tool_calls", "rewards", "meta", "token_ids"])
            for t in payload:
                table_.add_data(json.dumps(t["messages"]), json.dumps(t["tool_calls"]), json.dumps(t["rewards"]),
                                json.dumps(t["meta"]), json.dumps(t["token_ids"].tolist()))
            run.log({TRAJ_KEY: table_}, step=step)
        else:
            run.log(payload, step=step)
    run.finish()
    return spent.stop()


def bare_swanlab(place: RunPlace, work: list, is_traj: bool) -> tuple[float, float] | None:
    if is_traj:
        return None  # SwanLab has no table type to compare with; its lane stores trajectories as text
    import swanlab

    swanlab.init(project=f"{place.project}-bare", mode="offline", logdir=str(place.swanlog))
    spent = Spent()
    for step, payload in work:
        swanlab.log(payload, step=step)
    swanlab.finish()
    return spent.stop()


BARE: dict[str, Callable[[RunPlace, list, bool], tuple[float, float] | None]] = {
    "file": bare_file, "tensorboard": bare_tensorboard, "mlflow": bare_mlflow, "wandb": bare_wandb,
    "swanlab": bare_swanlab, "tensorboard-as-verl": tensorboard_as_verl,
}
BARE_PATH = {"file": "orjson lines, as verl 0.9.1's FileLogger writes them (rollout rows too)",
             "tensorboard": "EventFileWriter, one Summary a step",
             "mlflow": "MlflowClient.log_batch a step; log_dict a step of trajectories",
             "wandb": "run.log a step; a wandb.Table a step of trajectories", "swanlab": "swanlab.log a step"}
AS_VERL = {"tensorboard": "tensorboard-as-verl"}
"""A tracker whose fastest SDK path is not how verl calls it: that way too, for reference."""


def bare_main(spec: dict[str, Any]) -> dict[str, Any]:
    """One bare run, in this (Ray-free) process: its wall time and CPU."""
    place = RunPlace(root=Path(spec["root"]), project=spec["project"], experiment=spec["experiment"],
                     mlflow_uri=spec["mlflow_uri"])
    workload = Workload(spec["workload"], spec["steps"], spec["trajectories"])
    with quiet_stdout():
        spent = BARE[spec["path"]](place, workload.records(), bool(workload.trajectories))
    return {"s": spent[0], "cpu_s": spent[1]} if spent is not None else {}


def bare(place: RunPlace, path: str, workload: Workload) -> dict[str, Any]:
    spec = {"root": str(place.root), "project": place.project, "experiment": place.experiment,
            "mlflow_uri": place.mlflow_uri, "workload": workload.name, "steps": workload.steps,
            "trajectories": workload.trajectories, "path": path}
    done = subprocess.run([sys.executable, "-m", "tracklane.benchmarks.capacity", "bare", json.dumps(spec)], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the bare {path} run failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the lane -------------------------------------------------------------------------------
def lane(place: RunPlace, tracker: str, work: list, is_traj: bool,
         extra: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    from tracklane import Tracking

    # "block": a loop faster than the lane waits for room instead of dropping, so the rate is what it sustains;
    # the spool, like every run's, in the run's own folder
    config = {"trainer": {"log_async": True, "async_log": {"log_vitals": False,
                                                           "spool_dir": str(place.root / "spool"),
                                                           "system_metrics_s": 0, "overflow": "block",
                                                           "block_timeout_s": 600},
                          "record_limits": {"max_trajectories": 1_000_000, "max_chars": 1_000_000}, **(extra or {})}}
    tracking = Tracking(place.project, place.experiment, [tracker], config=config)
    opened = tracking.flush(timeout=300).lanes[tracker].cpu_s  # the actor is up and its tracker open: not counted
    started, trainer_cpu = time.perf_counter(), time.process_time()
    for step, payload in work:
        if is_traj:
            tracking.log_trajectories(payload, step=step, key=TRAJ_KEY)
        else:
            tracking.log(payload, step=step)
    report = tracking.finish(timeout=1800)
    elapsed = time.perf_counter() - started
    figures = report.lanes[tracker]
    check = {"complete": report.complete, "busy_s": figures.busy_s, "cpu_s": figures.cpu_s - opened,
             "trainer_cpu_s": time.process_time() - trainer_cpu}
    if tracker == "memory":
        return elapsed, check
    return elapsed, {**check, "read_back": read_back(tracker, place)}


def measure(env: BenchEnv, tracker: str, workload: Workload, rounds: int = 1) -> dict[str, Any]:
    """Bare and lane, ``rounds`` times in turn (a disk's page cache makes one run's write cost swing); each side's
    run with the median CPU is the one reported."""
    work = workload.records()
    is_traj = bool(workload.trajectories)
    bares, lanes = [], []
    for _ in range(rounds):
        bares.append(bare(env.place(f"{tracker}-{workload.name}-bare"), tracker, workload))
        with quiet_stdout():
            lanes.append(lane(env.place(f"{tracker}-{workload.name}-lane"), tracker, work, is_traj))
    bare_run = sorted(bares, key=lambda run: run.get("cpu_s", 0.0))[len(bares) // 2]
    lane_s, check = sorted(lanes, key=lambda run: run[1]["cpu_s"])[len(lanes) // 2]
    as_verl = bare(env.place(f"{tracker}-{workload.name}-verl"), AS_VERL[tracker], workload) \
        if tracker in AS_VERL and not is_traj else {}
    stored = check["read_back"]
    kind = "trajectories" if is_traj else "scalars"
    delivered = stored.get(kind) if isinstance(stored, dict) else None
    units, mb = workload.units(), workload.raw_bytes() / 1e6
    per_k = 1e3 / units
    row: dict[str, Any] = {"tracker": tracker, "workload": workload.name, "units": units, "raw_mb": mb,
                           "lane_s": lane_s, "lane_per_s": units / lane_s, "complete": check["complete"],
                           "delivered": delivered, "actor_busy_s": check["busy_s"], "actor_cpu_s": check["cpu_s"],
                           "lane_cpu_ms_per_1k": 1e3 * check["cpu_s"] * per_k,
                           "trainer_cpu_ms_per_1k": 1e3 * check["trainer_cpu_s"] * per_k}
    if bare_run:
        row.update(bare_s=bare_run["s"], bare_per_s=units / bare_run["s"], bare_path=BARE_PATH[tracker],
                   bare_cpu_ms_per_1k=1e3 * bare_run["cpu_s"] * per_k,
                   cpu_ratio=check["cpu_s"] / bare_run["cpu_s"] if bare_run["cpu_s"] else None,
                   rounds={"bare_cpu_s": [run["cpu_s"] for run in bares], "lane_cpu_s": [run[1]["cpu_s"] for run in lanes]})
    if as_verl:
        row.update(as_verl_cpu_ms_per_1k=1e3 * as_verl["cpu_s"] * per_k)
    return row


# -- the pipeline alone -------------------------------------------------------------------------
PIPELINE_TARGETS = {"scalars": ("scalars/s", 200_000), "trajectories": ("MB/s", 50.0)}


def pipeline_ceiling(env: BenchEnv, workload: Workload) -> dict[str, Any]:
    """The workload, more steps (10x scalars, 2x trajectories), into a lane whose sink only counts: what the
    pipeline itself carries."""
    big = Workload(workload.name, workload.steps * (2 if workload.trajectories else 10), workload.trajectories)
    work = big.records()
    is_traj = bool(big.trajectories)
    place = env.place(f"pipeline-{big.name}")
    folder = place.root / "discarded"
    with quiet_stdout():
        elapsed, check = lane(place, "memory", work, is_traj, {"memory_sink": {"discard": True, "dir": str(folder)}})
    tally = json.loads((folder / "tally.json").read_text())
    units, mb = big.units(), big.raw_bytes() / 1e6
    unit, target = PIPELINE_TARGETS[big.name]
    rate = units / elapsed if unit == "scalars/s" else mb / elapsed
    return {"workload": big.name, "units": units, "raw_mb": mb, "s": elapsed, "per_s": units / elapsed,
            "mb_s": mb / elapsed, "target": f">= {target:,} {unit}", "meets": rate >= target,
            "delivered": tally["trajectories" if is_traj else "values"], "complete": check["complete"],
            "actor_busy_s": check["busy_s"], "actor_cpu_s": check["cpu_s"]}


def main(argv: list[str]) -> int:
    if argv[:1] == ["bare"]:
        print(json.dumps(bare_main(json.loads(argv[1]))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m tracklane.benchmarks.capacity", description=__doc__.splitlines()[0])
    common_args(parser, "capacity")
    parser.add_argument("--trackers", default=",".join(TRACKERS))
    parser.add_argument("--rounds", type=int, default=1, help="bare and lane this many times in turn (the median)")
    args = parser.parse_args(argv)
    clock = Clock()
    rows = []
    with BenchEnv(args.mlflow_uri, "capacity") as env:
        for workload in workloads(args.quick):
            for tracker in args.trackers.split(","):
                rows.append(measure(env, tracker, sized(workload, tracker, args.quick), args.rounds))
                print(f"[{clock.elapsed():6.0f} s] {tracker} / {workload.name} done", flush=True)
        ceiling = [pipeline_ceiling(env, workload) for workload in workloads(args.quick)]
    result = {"machine": machine(), "quick": args.quick, "rows": rows, "pipeline": ceiling}
    print(table(["tracker", "workload", "bare CPU ms/1k", "lane CPU ms/1k", "lane/bare", "trainer CPU ms/1k",
                 "bare /s", "lane /s", "delivered"],
                [[r["tracker"], r["workload"], fmt(r.get("bare_cpu_ms_per_1k"), 1), fmt(r["lane_cpu_ms_per_1k"], 1),
                  fmt(r.get("cpu_ratio")), fmt(r["trainer_cpu_ms_per_1k"], 1), fmt(r.get("bare_per_s"), 0),
                  fmt(r["lane_per_s"], 0), f"{r['delivered']}/{r['units']}"] for r in rows]))
    print("bare: " + "; ".join(f"{t}: {p}" for t, p in BARE_PATH.items()))
    for r in rows:
        if "as_verl_cpu_ms_per_1k" in r:
            print(f"{r['tracker']} / {r['workload']} as verl calls it (torch SummaryWriter, add_scalar per value): "
                  f"{fmt(r['as_verl_cpu_ms_per_1k'], 1)} CPU ms/1k")
    print("\nthe pipeline alone (buffer -> shipper -> Ray -> actor -> a sink that only counts):")
    print(table(["workload", "units", "raw MB", "s", "/s", "MB/s", "target", "met", "delivered", "actor CPU s"],
                [[c["workload"], c["units"], fmt(c["raw_mb"]), fmt(c["s"]), fmt(c["per_s"], 0), fmt(c["mb_s"]),
                  c["target"], "yes" if c["meets"] else "NO", f"{c['delivered']}/{c['units']}",
                  fmt(c["actor_cpu_s"])] for c in ceiling]))
    names = list(dict.fromkeys(r["tracker"] for r in rows))
    series = {w.name: [next((r.get("cpu_ratio") for r in rows if r["tracker"] == t and r["workload"] == w.name), None)
                       for t in names] for w in workloads(args.quick)}
    args.out.mkdir(parents=True, exist_ok=True)
    result["plots"] = [str(plots.bars(args.out / "capacity.png", "lane CPU per record / the bare SDK's",
                                      names, series, "ratio (1.0 = as cheap as the bare SDK)", target=1.25))]
    write_json(args.out, "capacity", result)
    print(f"wall time {clock.elapsed():.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
