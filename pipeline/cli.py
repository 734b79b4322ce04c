"""``tracklane`` (and ``python -m pipeline``): look into a spool, deliver it without the trainer, migrate runs.

    tracklane inspect SPOOL_DIR                 one JSON line per record: seq, step, kind, keys, which
                                                lanes acknowledged it (jq-friendly)
    tracklane replay SPOOL_DIR [--to A,B]       deliver what the trackers lack, through the same lanes
                                                (--to: any trackers, also ones the run never had)
    tracklane migrate --from SOURCE ... --to A,B [--project P] [--experiment E]
                                                another tracker's run into any trackers, through the same
                                                lanes; then each target is read back and compared with it
        --from mlflow --run-id ID [--tracking-uri URI]     (default: $MLFLOW_TRACKING_URI)
        --from tensorboard --logdir DIR
        --from wandb --run-dir DIR                         an offline run folder (wandb/offline-run-...)
        --from file --path FILE.jsonl                      verl's file logger: {"step": N, "data": {...}}
        --from trackio --project P [--run NAME]            ($TRACKIO_DIR; --source-project P to read P and
                                                           write into --project)
        --from spool --spool DIR                           what a tracklane spool still holds

``replay`` exits 0 when every tracker has everything the spool held, 1 when something is left
(it says what), 2 when the spool cannot be used. ``migrate`` exits 0 when every target holds what the
source held (each target tracker with a reader: mlflow, tensorboard, wandb, file, trackio), 1 when
something was not delivered or differs (the table on stdout says what), 2 when the source or a target
cannot be used. argparse does the parsing, tqdm the progress bars.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from .backends import SOURCES
from .codec import decode_batch
from .errors import CodecError, ConfigError, TracklaneError
from .lane_state import LaneState
from .records import Metrics, Record, RunSpec
from .report import PipelineReport
from .spool import Spool
from .spool_manifest import RunManifest, lanes_dir, state_path

log = logging.getLogger("tracklane")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracklane", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="one JSON line per spooled record")
    inspect.add_argument("spool_dir")
    replay = commands.add_parser("replay", help="deliver a spool into its trackers (or others)")
    replay.add_argument("spool_dir")
    replay.add_argument("--to", help="comma-separated backends (default: the run's own)")
    replay.add_argument("--exit-code", type=int, default=None,
                        help="close the tracker runs with this code (default: the run's own, or 1 if it crashed)")
    replay.add_argument("--timeout", type=float, default=600.0, help="deadline for the whole delivery, seconds")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    _migrate_parser(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.command == "inspect":
            return inspect_spool(args.spool_dir, sys.stdout)
        if args.command == "migrate":
            return _migrate(args)
        return replay_spool(args.spool_dir, _names(args.to), args.exit_code, args.timeout, not args.no_progress)
    except TracklaneError as exc:
        print(f"tracklane: {exc}", file=sys.stderr)
        return 2


def _migrate_parser(commands: Any) -> None:
    migrate = commands.add_parser("migrate", help="another tracker's run into any trackers, then compared")
    migrate.add_argument("--from", dest="source", required=True, choices=list(SOURCES), help="what to read")
    migrate.add_argument("--to", required=True, help="comma-separated backends to write into")
    migrate.add_argument("--project", help="the target run's project (default: the source's); with --from trackio "
                                           "also the trackio project read, unless --source-project names it")
    migrate.add_argument("--experiment", help="the target run's experiment name (default: the source's)")
    source = migrate.add_argument_group("source options")
    source.add_argument("--run-id", help="mlflow: the run to read")
    source.add_argument("--tracking-uri", help="mlflow: where it is (default: $MLFLOW_TRACKING_URI, else verl's)")
    source.add_argument("--logdir", help="tensorboard: the log directory of the run")
    source.add_argument("--run-dir", help="wandb: the offline run folder (or its .wandb file)")
    source.add_argument("--path", help="file: the JSON-lines file")
    source.add_argument("--source-project", help="trackio: the project to read (default: --project)")
    source.add_argument("--run", help="trackio: the run's name (default: the project's only run)")
    source.add_argument("--spool", help="spool: the spool folder to read")
    migrate.add_argument("--spool-dir", help="where the migration spools what it read (default: a new folder under "
                                             "$TRACKLANE_SPOOL_ROOT, like a run's)")
    migrate.add_argument("--timeout", type=float, default=600.0, help="deadline for the delivery, seconds")
    migrate.add_argument("--no-progress", action="store_true", help="no progress bars")


def _migrate(args: argparse.Namespace) -> int:
    from .migrate import MigrateArgs, migrate

    options = {name: getattr(args, name) for name in ("run_id", "tracking_uri", "logdir", "run_dir", "path",
                                                      "source_project", "project", "run", "spool")}
    to = _names(args.to)
    if not to:
        raise ConfigError("--to names no backend")
    return migrate(MigrateArgs(source=args.source, options=options, to=to, project=args.project,
                               experiment=args.experiment, spool_dir=args.spool_dir, timeout=args.timeout,
                               progress=not args.no_progress))


def _names(text: str | None) -> list[str] | None:
    return [name.strip() for name in text.split(",") if name.strip()] if text else None


# -- inspect ---------------------------------------------------------------------------------
def inspect_spool(directory: str, out: Any) -> int:
    spool = Spool(directory, readonly=True)
    applied = _lane_watermarks(directory)
    for entry in spool.entries():
        payload = spool.read(entry.seq)
        try:
            records = decode_batch(payload).records if payload is not None else None
        except CodecError as exc:
            records, problem = None, str(exc)
        else:
            problem = "unreadable" if records is None else ""
        acked = sorted(name for name, seq in applied.items() if seq >= entry.seq)
        pending = sorted(set(applied) - set(acked))
        if records is None:
            out.write(json.dumps({"seq": entry.seq, "error": problem, "acked_by": acked, "pending": pending}) + "\n")
            continue
        for record in records:
            out.write(json.dumps({"seq": entry.seq, "step": record.step, "kind": record.kind, "keys": _keys(record),
                                  "time": record.time, "only": record.only, "acked_by": acked,
                                  "pending": pending}) + "\n")
    stats = spool.stats
    print(f"tracklane: {spool.batches} batches in {directory}; {stats.corrupt_frames} corrupt frame(s), "
          f"{stats.missing_batches} missing batch(es), {stats.torn_bytes} torn byte(s)", file=sys.stderr)
    return 0


def _keys(record: Record) -> list[str]:
    if isinstance(record, Metrics):
        return sorted(record.values)
    name = getattr(record, "name", None) or getattr(record, "key", None)
    return [name] if name else []


def _lane_watermarks(directory: str) -> dict[str, int]:
    folder = lanes_dir(directory)
    names = sorted(n[:-len(".state")] for n in os.listdir(folder) if n.endswith(".state")) \
        if os.path.isdir(folder) else []
    return {name: LaneState.load(state_path(directory, name)).applied for name in names}


# -- replay ----------------------------------------------------------------------------------
def replay_spool(directory: str, to: list[str] | None, exit_code: int | None, timeout: float,
                 progress: bool) -> int:
    from .backends import backend_class, resolve_backends

    manifest = RunManifest.load(directory)
    names = to or list(manifest.backends)
    # The run's own trackers keep the settings they were logged with (the same runs, the same folders);
    # a tracker the run never had is set up from this environment, like a new run's.
    new = resolve_backends([n for n in names if n not in manifest.backends], manifest.run, os.environ, {})
    backends = {name: new[name] if name in new else (backend_class(name), manifest.backends[name]) for name in names}
    code = exit_code if exit_code is not None else (manifest.exit_code if manifest.exit_code is not None else 1)
    report = deliver_spool(directory, manifest.run, backends, code, timeout, progress, "replay")
    return 1 if undelivered(report) else 0


def deliver_spool(directory: str, run: RunSpec, backends: dict[str, tuple[type, dict[str, Any]]], exit_code: int,
                  timeout: float, progress: bool, desc: str) -> PipelineReport:
    """Deliver what the spool at ``directory`` holds into ``backends`` through the lanes (replay and migrate),
    with a progress bar; close the tracker runs with ``exit_code`` and print the report."""
    from .async_pipeline import AsyncPipeline
    from .config import AsyncLogConfig
    from .rich import RecordLimits

    # No health figures and no system metrics: they would be the delivering machine's, not the run's.
    cfg = AsyncLogConfig(spool_dir=os.path.abspath(directory), health_metrics=False, system_metrics_s=0,
                         finish_timeout_s=max(timeout, 1.0), spool_max_bytes=2**62)
    pipe = AsyncPipeline(cfg, RecordLimits(), run, backends, os.environ)
    deadline = time.monotonic() + timeout
    # Barriers only once every lane's actor answered: one that times out while a tracker opens marks its lane
    # with "did not answer before the deadline" for good, though it goes on to deliver everything.
    pipe.wait_ready(min(cfg.startup_timeout_s, timeout))
    _wait_with_progress(pipe, deadline, progress, desc)
    report = pipe.close(exit_code, max(5.0, deadline - time.monotonic()))
    print(report.summary(), file=sys.stderr)
    return report


def undelivered(report: PipelineReport) -> dict[str, int]:
    """Per tracker, the records it lacks (said on stderr); empty when every tracker has everything."""
    left = {name: lane.unacked_records for name, lane in report.lanes.items() if not lane.complete}
    if left:
        print(f"tracklane: not everything arrived: {left}; run the same command again when the tracker is back",
              file=sys.stderr)
    return left


def _wait_with_progress(pipe: Any, deadline: float, progress: bool, desc: str) -> None:
    """Barrier after barrier (one second each) until every lane's tracker was handed everything, with a bar of
    records. A barrier that did not time out means that (its lanes settled); what a tracker still holds in memory
    (wandb-core's newest block) is durable once close() ends the runs, so waiting for it here would only wait
    out the deadline."""
    bar = None
    total = None
    while time.monotonic() < deadline:
        report = pipe.flush(min(1.0, max(0.1, deadline - time.monotonic())))
        waiting = sum(lane.unacked_records for lane in report.lanes.values())
        if total is None:
            total = waiting
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=total, unit="record", desc=desc, file=sys.stderr)
        settled = not report.timed_out
        if bar is not None:
            bar.n = total if settled else max(0, total - waiting)
            bar.refresh()
        if waiting == 0 or settled:
            break
    if bar is not None:
        bar.close()
