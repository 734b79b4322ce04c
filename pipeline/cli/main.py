"""``tracklane`` (and ``python -m tracklane``): look into a spool, deliver it without the trainer, migrate runs.

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
    tracklane view PATH [PATH ...] [--host H] [--port P]
                                                a run's rollouts in a local web page, live while it writes
                                                (PATH: a spool, or the file tracker's .jsonl or its folder;
                                                default 127.0.0.1:8765; it never writes to the run)
    tracklane alert-rules                       the path of the shipped Prometheus alerting rules (add it to
                                                rule_files: in prometheus.yml; docs/health.md)

``replay`` exits 0 when every tracker has everything the spool held, 1 when something is left
(it says what), 2 when the spool cannot be used. ``migrate`` exits 0 when every target holds what the
source held (each target tracker with a reader: mlflow, tensorboard, wandb, file, trackio), 1 when
something was not delivered or differs (the table on stdout says what), 2 when the source or a target
cannot be used. argparse does the parsing, tqdm the progress bars.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from tracklane.alerting import RULES_FILE
from tracklane.cli.inspect import inspect_spool
from tracklane.cli.migrate import MigrateArgs, migrate
from tracklane.cli.replay import replay_spool
from tracklane.cli.view import DEFAULT_PORT, view_run
from tracklane.core.errors import ConfigError, TracklaneError
from tracklane.host.registry import SOURCES


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracklane", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("inspect", help="one JSON line per spooled record").add_argument("spool_dir")
    replay = commands.add_parser("replay", help="deliver a spool into its trackers (or others)")
    replay.add_argument("spool_dir")
    replay.add_argument("--to", help="comma-separated backends (default: the run's own)")
    replay.add_argument("--exit-code", type=int, default=None,
                        help="close the tracker runs with this code (default: the run's own, or 1 if it crashed)")
    _delivery_options(replay)
    _migrate_parser(commands)
    view = commands.add_parser("view", help="a run's rollouts in a local web page")
    view.add_argument("path", nargs="+", help="a spool folder, or the file tracker's .jsonl or its folder; up to 3 more "
                                              "runs after it are compared with it (curves overlaid, same prompts)")
    view.add_argument("--host", default="127.0.0.1", help="address to serve on (default: loopback only)")
    view.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    commands.add_parser("alert-rules", help="the path of the shipped Prometheus alerting rules")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.command == "inspect":
            return inspect_spool(args.spool_dir, sys.stdout)
        if args.command == "migrate":
            return _migrate(args)
        if args.command == "view":
            return view_run(args.path, args.host, args.port)
        if args.command == "alert-rules":
            print(RULES_FILE)
            return 0
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
    _delivery_options(migrate)


def _delivery_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--timeout", type=float, default=600.0, help="deadline for the whole delivery, seconds")
    command.add_argument("--no-progress", action="store_true", help="no progress bars")


def _migrate(args: argparse.Namespace) -> int:
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
