"""Each tracker's own ceiling against its lane's throughput, for scalars and for trajectories.

    python -m benchmarks.capacity [--quick] [--out DIR] [--mlflow-uri URI] [--trackers file,tensorboard,...]

For each tracker and workload the same records are written twice in this process kind's best
plain way, one after the other:

* **bare**: the tracker's SDK called directly, in one process, its fastest honest way (the file as
  verl's JSON lines, TensorBoard through the package's ``EventFileWriter`` with one ``Summary`` a step,
  MLflow ``log_batch`` per step and ``log_dict`` per step of trajectories, wandb ``run.log`` with a
  ``wandb.Table`` per step, SwanLab ``swanlab.log``); TensorBoard also through torch's ``SummaryWriter``
  called once per value, as verl calls it, shown beside the ratio;
* **lane**: ``Tracking`` with ``log_async: true`` and that one tracker: ``log*()`` as fast as the loop
  goes, then ``finish()``. What arrived is read back from the tracker's own store.

Both are timed from the first write to the end of the tracker's close (opening not counted); the
figures are records/s, raw MB/s (text plus int32 token ids; 16 bytes a scalar point) and the
lane/bare ratio. Each lane's row also says what its actor spent (busy wall time, process CPU).

Then the pipeline's own ceiling: the same kinds of records, more of them, through buffer -> shipper ->
Ray -> lane actor into a sink that only counts them (``memory_sink.discard``), against the targets
of 200,000 scalars/s and 50 MB/s raw. Writes ``capacity.json`` and ``capacity.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import plots
from benchmarks.harness import BenchEnv, Clock, common_args, fmt, machine, quiet_stdout, table, write_json
from benchmarks.readback import RunPlace, read_back
from benchmarks.workloads import trajectories, trajectory_bytes, verl_scalars

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


# -- bare SDKs ------------------------------------------------------------------------------
def _plain(trajectory: dict) -> dict:
    return {**trajectory, "token_ids": trajectory["token_ids"].tolist()}


def bare_file(place: RunPlace, work: list, is_traj: bool) -> float:
    started = time.perf_counter()
    if is_traj:
        place.rollout_dump.mkdir(parents=True, exist_ok=True)
        for step, items in work:
            with open(place.rollout_dump / f"{step}.jsonl", "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps({**_plain(t), "step": step}) + "\n" for t in items)
    else:
        with open(place.file, "w", encoding="utf-8") as handle:
            for step, values in work:
                handle.write(json.dumps({"step": step, "data": values}) + "\n")
    return time.perf_counter() - started


def bare_tensorboard(place: RunPlace, work: list, is_traj: bool) -> float:
    """The fastest the ``tensorboard`` package offers: its ``EventFileWriter``, one ``Summary`` a step holding all of
    the step's scalars (or the step's trajectories as one text summary)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(place.tensorboard))
    started = time.perf_counter()
    for step, payload in work:
        if is_traj:
            summary = text_pb(TRAJ_KEY, "\n\n".join(json.dumps(_plain(t)) for t in payload))
        else:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                                 for k, v in payload.items()])
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()
    return time.perf_counter() - started


def tensorboard_as_verl(place: RunPlace, work: list, is_traj: bool) -> float:
    """torch's ``SummaryWriter``, one ``add_scalar`` per value, as verl's Tracking calls it (37x slower than the
    package's own fast path here: shown beside the ratio, not used as the ceiling)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(place.tensorboard))
    started = time.perf_counter()
    for step, payload in work:
        if is_traj:
            writer.add_text(TRAJ_KEY, "\n\n".join(json.dumps(_plain(t)) for t in payload), step)
        else:
            for key, value in payload.items():
                writer.add_scalar(key, value, step)
    writer.close()
    return time.perf_counter() - started


def bare_mlflow(place: RunPlace, work: list, is_traj: bool) -> float:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from workers.sinks.mlflow import mlflow_key  # verl's keys have "@"; MLflow refuses it (the key map is not timed)

    client = MlflowClient(place.mlflow_uri)
    experiment = client.create_experiment(f"{place.project}-bare")
    run_id = client.create_run(experiment).info.run_id
    if not is_traj:
        work = [(step, {mlflow_key(k): v for k, v in values.items()}) for step, values in work]
    started = time.perf_counter()
    for step, payload in work:
        if is_traj:
            client.log_dict(run_id, [_plain(t) for t in payload], f"trajectories/{step}.json")
        else:
            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in payload.items()])
    client.set_terminated(run_id)
    return time.perf_counter() - started


def bare_wandb(place: RunPlace, work: list, is_traj: bool) -> float:
    import wandb

    run = wandb.init(project=f"{place.project}-bare", dir=str(place.wandb), mode="offline", reinit="create_new")
    started = time.perf_counter()
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
    return time.perf_counter() - started


def bare_swanlab(place: RunPlace, work: list, is_traj: bool) -> float | None:
    if is_traj:
        return None  # SwanLab has no table type to compare with; its lane stores trajectories as text
    import swanlab

    swanlab.init(project=f"{place.project}-bare", mode="offline", logdir=str(place.swanlog))
    started = time.perf_counter()
    for step, payload in work:
        swanlab.log(payload, step=step)
    swanlab.finish()
    return time.perf_counter() - started


BARE: dict[str, Callable[[RunPlace, list, bool], float | None]] = {
    "file": bare_file, "tensorboard": bare_tensorboard, "mlflow": bare_mlflow, "wandb": bare_wandb,
    "swanlab": bare_swanlab,
}
AS_VERL: dict[str, Callable[[RunPlace, list, bool], float | None]] = {"tensorboard": tensorboard_as_verl}
"""A tracker whose fastest SDK path is not how verl calls it: that way too, for reference."""
BARE_PATH = {"file": "json.dumps lines (verl's file logger)", "tensorboard": "EventFileWriter, one Summary a step",
             "mlflow": "MlflowClient.log_batch a step; log_dict a step of trajectories",
             "wandb": "run.log a step; a wandb.Table a step of trajectories", "swanlab": "swanlab.log a step"}


# -- the lane -------------------------------------------------------------------------------
def lane(place: RunPlace, tracker: str, work: list, is_traj: bool,
         extra: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    from pipeline import Tracking

    # "block": a loop faster than the lane waits for room instead of dropping, so the rate is what it sustains
    config = {"trainer": {"log_async": True, "async_log": {"health_metrics": False, "spool": False,
                                                           "system_metrics_s": 0, "overflow": "block",
                                                           "block_timeout_s": 600},
                          "record_limits": {"max_trajectories": 1_000_000, "max_chars": 1_000_000}, **(extra or {})}}
    tracking = Tracking(place.project, place.experiment, [tracker], config=config)
    tracking.flush(timeout=300)  # the actor is up and its tracker open: not timed
    started = time.perf_counter()
    for step, payload in work:
        if is_traj:
            tracking.log_trajectories(payload, step=step, key=TRAJ_KEY)
        else:
            tracking.log(payload, step=step)
    report = tracking.finish(timeout=1800)
    elapsed = time.perf_counter() - started
    figures = report.lanes[tracker]
    check = {"complete": report.complete, "busy_s": figures.busy_s, "cpu_s": figures.cpu_s}
    if tracker == "memory":
        return elapsed, check
    return elapsed, {**check, "read_back": read_back(tracker, place)}


def measure(env: BenchEnv, tracker: str, workload: Workload) -> dict[str, Any]:
    work = workload.records()
    is_traj = bool(workload.trajectories)
    with quiet_stdout():
        bare_s = BARE[tracker](env.place(f"{tracker}-{workload.name}-bare"), work, is_traj)
        as_verl = AS_VERL[tracker](env.place(f"{tracker}-{workload.name}-verl"), work, is_traj) \
            if tracker in AS_VERL else None
        lane_s, check = lane(env.place(f"{tracker}-{workload.name}-lane"), tracker, work, is_traj)
    stored = check["read_back"]
    kind = "trajectories" if is_traj else "scalars"
    delivered = stored.get(kind) if isinstance(stored, dict) else None
    units, mb = workload.units(), workload.raw_bytes() / 1e6
    row: dict[str, Any] = {"tracker": tracker, "workload": workload.name, "units": units, "raw_mb": mb,
                           "lane_s": lane_s, "lane_per_s": units / lane_s, "lane_mb_s": mb / lane_s,
                           "complete": check["complete"], "delivered": delivered,
                           "actor_busy_s": check["busy_s"], "actor_cpu_s": check["cpu_s"]}
    if bare_s is not None:
        row.update(bare_s=bare_s, bare_per_s=units / bare_s, bare_mb_s=mb / bare_s, ratio=bare_s / lane_s,
                   bare_path=BARE_PATH[tracker])
    if as_verl is not None:
        row.update(as_verl_per_s=units / as_verl, as_verl_ratio=as_verl / lane_s)
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
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__.splitlines()[0])
    common_args(parser, "capacity")
    parser.add_argument("--trackers", default=",".join(TRACKERS))
    args = parser.parse_args(argv)
    clock = Clock()
    rows = []
    with BenchEnv(args.mlflow_uri, "capacity") as env:
        for workload in workloads(args.quick):
            for tracker in args.trackers.split(","):
                rows.append(measure(env, tracker, sized(workload, tracker, args.quick)))
                print(f"[{clock.elapsed():6.0f} s] {tracker} / {workload.name} done", flush=True)
        ceiling = [pipeline_ceiling(env, workload) for workload in workloads(args.quick)]
    result = {"machine": machine(), "quick": args.quick, "rows": rows, "pipeline": ceiling}
    print(table(["tracker", "workload", "bare /s", "bare MB/s", "lane /s", "lane MB/s", "lane/bare", "delivered"],
                [[r["tracker"], r["workload"], fmt(r.get("bare_per_s"), 0), fmt(r.get("bare_mb_s")),
                  fmt(r["lane_per_s"], 0), fmt(r["lane_mb_s"]), fmt(r.get("ratio")),
                  f"{r['delivered']}/{r['units']}"] for r in rows]))
    print("bare: " + "; ".join(f"{t}: {p}" for t, p in BARE_PATH.items()))
    for r in rows:
        if "as_verl_per_s" in r:
            print(f"{r['tracker']} / {r['workload']} as verl calls it (torch SummaryWriter, add_scalar per value): "
                  f"{fmt(r['as_verl_per_s'], 0)}/s; lane/that {fmt(r['as_verl_ratio'])}")
    print("\nthe lane actors' work (wall time inside batch writes, process CPU):")
    print(table(["tracker", "workload", "lane s", "actor busy s", "actor CPU s"],
                [[r["tracker"], r["workload"], fmt(r["lane_s"]), fmt(r["actor_busy_s"]), fmt(r["actor_cpu_s"])]
                 for r in rows]))
    print("\nthe pipeline alone (buffer -> shipper -> Ray -> actor -> a sink that only counts):")
    print(table(["workload", "units", "raw MB", "s", "/s", "MB/s", "target", "met", "delivered", "actor CPU s"],
                [[c["workload"], c["units"], fmt(c["raw_mb"]), fmt(c["s"]), fmt(c["per_s"], 0), fmt(c["mb_s"]),
                  c["target"], "yes" if c["meets"] else "NO", f"{c['delivered']}/{c['units']}",
                  fmt(c["actor_cpu_s"])] for c in ceiling]))
    names = list(dict.fromkeys(r["tracker"] for r in rows))
    series = {w.name: [next((r.get("ratio") for r in rows if r["tracker"] == t and r["workload"] == w.name), None)
                       for t in names] for w in workloads(args.quick)}
    args.out.mkdir(parents=True, exist_ok=True)
    result["plots"] = [str(plots.bars(args.out / "capacity.png", "lane throughput / the tracker's own ceiling",
                                      names, series, "ratio (1.0 = as fast as the bare SDK)", target=0.8))]
    write_json(args.out, "capacity", result)
    print(f"wall time {clock.elapsed():.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
