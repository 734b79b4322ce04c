"""``tracklane`` (and ``python -m pipeline``): look into a spool, and deliver it without the trainer.

    tracklane inspect SPOOL_DIR                 one JSON line per record: seq, step, kind, keys, which
                                                lanes acknowledged it (jq-friendly)
    tracklane replay SPOOL_DIR [--to A,B]       deliver what the trackers lack, through the same lanes
                                                (--to: any trackers, also ones the run never had)

``replay`` exits 0 when every tracker has everything the spool held, 1 when something is left
(it says what), 2 when the spool cannot be used. argparse does the parsing, tqdm the progress bar.
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

from .codec import decode_batch
from .errors import CodecError, TracklaneError
from .lane_state import LaneState
from .records import Metrics, Record
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.command == "inspect":
            return inspect_spool(args.spool_dir, sys.stdout)
        return replay_spool(args.spool_dir, _names(args.to), args.exit_code, args.timeout, not args.no_progress)
    except TracklaneError as exc:
        print(f"tracklane: {exc}", file=sys.stderr)
        return 2


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
    from .async_pipeline import AsyncPipeline
    from .backends import backend_class, resolve_backends
    from .config import AsyncLogConfig
    from .rich import RecordLimits

    manifest = RunManifest.load(directory)
    names = to or list(manifest.backends)
    # The run's own trackers keep the settings they were logged with (the same runs, the same folders);
    # a tracker the run never had is set up from this environment, like a new run's.
    new = resolve_backends([n for n in names if n not in manifest.backends], manifest.run, os.environ, {})
    backends = {name: new[name] if name in new else (backend_class(name), manifest.backends[name]) for name in names}
    cfg = AsyncLogConfig(spool_dir=os.path.abspath(directory), health_metrics=False,
                         finish_timeout_s=max(timeout, 1.0), spool_max_bytes=2**62)
    code = exit_code if exit_code is not None else (manifest.exit_code if manifest.exit_code is not None else 1)
    pipe = AsyncPipeline(cfg, RecordLimits(), manifest.run, backends, os.environ)
    deadline = time.monotonic() + timeout
    _wait_with_progress(pipe, deadline, progress)
    report = pipe.close(code, max(5.0, deadline - time.monotonic()))
    print(report.summary(), file=sys.stderr)
    left = {name: lane.unacked_records for name, lane in report.lanes.items() if not lane.complete}
    if left:
        print(f"tracklane: not everything arrived: {left}; run the same command again when the tracker is back",
              file=sys.stderr)
        return 1
    return 0


def _wait_with_progress(pipe: Any, deadline: float, progress: bool) -> None:
    """Barrier after barrier (one second each) until no lane waits for anything, with a bar of records."""
    bar = None
    total = None
    while time.monotonic() < deadline:
        report = pipe.flush(min(1.0, max(0.1, deadline - time.monotonic())))
        waiting = sum(lane.unacked_records for lane in report.lanes.values())
        if total is None:
            total = waiting
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=total, unit="record", desc="replay", file=sys.stderr)
        if bar is not None:
            bar.n = max(0, total - waiting)
            bar.refresh()
        if waiting == 0:
            break
    if bar is not None:
        bar.close()
