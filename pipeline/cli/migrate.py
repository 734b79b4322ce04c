"""``tracklane migrate``: another tracker's run (or a spool) delivered into any trackers, then checked against it.

    1. The source (``--from``, a class in workers/sources/ found through the registry, host/registry.py ``SOURCES``)
       says who the run is and reads its records: tracklane.core.records types, each with the step and the time the
       source kept (MLflow's metric timestamps, TensorBoard's wall times, wandb's ``_timestamp`` ...).
    2. They are written, as they come, into the fresh spool of a new run (new run id; project and experiment
       the source's unless ``--project``/``--experiment``): the same batches, msgpack + zstd in checksummed frames,
       that the shipper spools, with the manifest naming the targets and their resolved settings.
    3. That spool is delivered the way ``tracklane replay`` delivers one (cli/replay.py ``deliver_spool``): AsyncPipeline,
       one lane actor per target, the progress bar, the report, its exit code. A migration cut short is finished
       with ``tracklane replay <spool>``, which continues the same target runs.
    4. Each target that has a source reader is read back with it and compared, key by key, with what the source
       gave (cli/migrate_check.py). Exit code 1 on any difference.

Why records enter through a spool rather than ``put(Captured(...))``: what ``put`` takes is what a ``log_*`` call
took (raw values), and the shipper converts it again. A migrated record is already typed, and converting it
again would change it: a histogram arrives as bins (no tracker keeps the raw values ``log_histogram`` takes),
``record_limits`` would cut long texts and thin generations and trajectories, and the buffer's overflow policy
could drop records read faster than they ship. The spool is where the pipeline already takes typed records
(replay, recovery), and its records keep their ``time``, which each sink uses as the tracker allows: MLflow
metric timestamps (ms), TensorBoard wall times, trackio row timestamps; wandb and the file logger keep none.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracklane.cli.migrate_check import Holdings, compare_targets, comparison_table
from tracklane.cli.replay import deliver_spool, progress_bar, undelivered
from tracklane.core.errors import ConfigError
from tracklane.core.params import plain_config
from tracklane.core.records import Batch, Generations, Metrics, Record, RunSpec, Trajectories
from tracklane.spool.manifest import RunManifest, default_spool_dir, holds_a_spool, lanes_dir
from tracklane.spool.segments import Spool
from tracklane.wire.batch import encode_batch, encode_what_encodes

if TYPE_CHECKING:
    from tracklane.host.source import Source

log = logging.getLogger("tracklane")

BATCH_RECORDS = 256
"""Records per spooled batch: each is one lane write and one step of the progress bar."""
BATCH_BYTES = 4 * 2**20
"""Estimated bytes per spooled batch (the shipper's default ``max_batch_bytes``)."""


@dataclass(slots=True, kw_only=True)
class MigrateArgs:
    """What ``tracklane migrate`` was asked to do."""

    source: str
    """Source name (host/registry.py ``SOURCES``)."""
    options: dict[str, Any]
    """The source's command-line options by dest (run_id, tracking_uri, logdir, run_dir, path, run, spool ...)."""
    to: list[str]
    project: str | None = None
    experiment: str | None = None
    spool_dir: str | None = None
    timeout: float = 600.0
    progress: bool = True


def migrate(args: MigrateArgs, out: Any = None) -> int:
    """Read, spool, deliver, compare; 0 when every target holds what the source held, 1 otherwise."""
    from tracklane.host.registry import check_installed, resolve_backends, source_class

    out = out or sys.stdout
    source_cls = source_class(args.source)
    check_installed(source_cls)
    env = dict(os.environ)
    with source_cls.from_options(args.options, env) as source:
        origin = source.run()
        run = RunSpec(project=args.project or origin.project, experiment=args.experiment or origin.experiment,
                      params=plain_config(origin.params), run_id=secrets.token_hex(6))  # a new run: a new id
        backends = resolve_backends(args.to, run, env, {})  # every name and SDK checked before anything is read
        directory = os.path.abspath(args.spool_dir or default_spool_dir(run, {}, env))
        started = time.monotonic()
        held = spool_source(directory, RunManifest(run=run, backends={n: s for n, (_, s) in backends.items()}),
                            source.records(), args.progress)
        read_s = time.monotonic() - started
        print(f"tracklane: migrate: read {held.records} records ({held.points} points) from {origin.where} in "
              f"{read_s:.1f} s into spool {directory}" + _skipped(source), file=sys.stderr)

        resumed = RunSpec(project=run.project, experiment=run.experiment, params=run.params, run_id=run.run_id,
                          resume=True)  # as replay opens a spool: the lanes deliver what it holds
        report = deliver_spool(directory, resumed, backends, 0, args.timeout, args.progress, "migrate")
        print(f"tracklane: migrate: delivered in {time.monotonic() - started - read_s:.1f} s", file=sys.stderr)
    left = undelivered(report)
    checked = compare_targets(held, run, {name: settings for name, (_, settings) in backends.items()}, report)
    out.write(comparison_table(origin.where, run, held, checked))
    return 1 if left or any(result.mismatches for result in checked.values()) else 0


def _skipped(source: Source) -> str:
    if not source.skipped:
        return ""
    return "; not carried: " + ", ".join(f"{n} {what}" for what, n in source.skipped.items())


# -- 2. the spool ------------------------------------------------------------------------------
def spool_source(directory: str, manifest: RunManifest, records: Iterable[Record], progress: bool) -> Holdings:
    """Write ``records`` into a new spool at ``directory`` in batches; returns what they held."""
    if holds_a_spool(directory):
        raise ConfigError(f"{directory} already holds a spool; pass another --spool-dir")
    spool = Spool(directory, max_bytes=2**62)
    held = Holdings()
    bar = progress_bar(progress, "read")
    try:
        os.makedirs(lanes_dir(directory), mode=0o700, exist_ok=True)
        manifest.save(directory)
        seq = 0
        for batch in _batches(records):
            kept = _encodable(batch)
            if not kept:
                continue
            seq += 1
            blob = encode_batch(Batch(seq=seq, created=time.time(), records=kept), 1)
            spool.append(seq, len(kept), min(r.time for r in kept), blob)
            for record in kept:
                held.add(record)
            if bar is not None:
                bar.update(len(kept))
    finally:
        spool.close()
        if bar is not None:
            bar.close()
    return held


def _batches(records: Iterable[Record]) -> Iterator[list[Record]]:
    batch: list[Record] = []
    size = 0
    for record in records:
        batch.append(record)
        size += _size(record)
        if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _size(record: Record) -> int:
    """Rough bytes of a record, to bound a batch."""
    if isinstance(record, Metrics):
        return 64 * len(record.values)
    for name in ("png", "text", "values"):
        data = getattr(record, name, None)
        if isinstance(data, (bytes, str)):
            return len(data) + 256
    if isinstance(record, Generations):
        return sum(len(s[0]) + len(s[1]) + 64 for s in record.samples) + 256
    if isinstance(record, Trajectories):
        return sum(len(t.token_ids) + sum(len(m.get("content", "")) for m in t.messages) + 256
                   for t in record.trajectories) + 256
    return 256


def _encodable(batch: list[Record]) -> list[Record]:
    """The batch's records that the lanes can decode (a source bug must not make a lane refuse a whole batch):
    the batch as it is when it decodes, else each record tried alone, the bad ones skipped with a warning."""
    _, kept, refused = encode_what_encodes(batch, 1, 0.0, level=1, check=True)
    for record, exc in refused:
        log.warning("tracklane: migrate: a %s record at step %s cannot be carried (%s); skipped", record.kind, record.step, exc)
    return kept
