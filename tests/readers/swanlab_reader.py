"""Read back what swanlab (0.10.3) stored under a log folder in offline or local mode.

Layout: ``<logdir>/run-<YYYYmmdd_HHMMSS>-<run id>/`` per ``swanlab.init``, holding
``run-<run id>.swanlab`` (a LevelDB-style log of protobuf ``Record`` messages: start,
columns, scalars, terminal lines, saves, finish) and ``files/config.yaml`` (the config
as ``{key: {value, sort, desc}}``).

Several runs may share one logdir. A run resumed offline (same id, later ``init``)
gets a second folder with the same id: such folders are segments of one run, read
in start order, as ``swanlab sync`` would upload them into one experiment.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import yaml
from swanlab.proto.swanlab.record.v1.record_pb2 import Record
from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

from . import ReadBack

_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_CHUNK = struct.Struct("<IHB")  # crc32, length, chunk type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_SYSTEM_PREFIX = "__swanlab__."  # swanlab's own hardware metrics, not the user's


@dataclass
class SwanlabRunDir:
    """One ``swanlab.init`` found under a logdir."""

    run_id: str
    experiment: str
    project: str
    started: float
    path: Path


def list_swanlab_runs(logdir: str | Path) -> list[SwanlabRunDir]:
    """Every run folder under ``logdir``, oldest first."""
    found = []
    for store in sorted(Path(logdir).glob("run-*/run-*.swanlab")):
        first = next(_records(store), None)
        if first is None:  # killed before its first record reached disk: nothing to read
            continue
        start = first.start
        found.append(SwanlabRunDir(
            run_id=start.id,
            experiment=start.name,
            project=start.project,
            started=start.started_at.seconds + start.started_at.nanos / 1e9,
            path=store.parent,
        ))
    return sorted(found, key=lambda r: (r.started, r.path.name))


def read_swanlab_run(logdir: str | Path, *, run_id: str | None = None, experiment: str | None = None) -> ReadBack:
    """The run with this id and/or experiment name (or the only run) under ``logdir``.

    Segments of a resumed run are joined: points in order, params and status from the last.
    Raises ``LookupError`` when nothing matches or the selection names several run ids.
    """
    segments = [
        r for r in list_swanlab_runs(logdir)
        if (run_id is None or r.run_id == run_id) and (experiment is None or r.experiment == experiment)
    ]
    ids = {r.run_id for r in segments}
    if len(ids) != 1:
        raise LookupError(f"expected one swanlab run under {logdir} (run_id={run_id!r}, "
                          f"experiment={experiment!r}), found ids {sorted(ids)}")
    out = ReadBack()
    for segment in segments:
        _read_segment(segment.path, out)
    return out


def _read_segment(run_dir: Path, out: ReadBack) -> None:
    (store,) = run_dir.glob("run-*.swanlab")
    out.status = None  # a segment without a finish record ended without swanlab knowing how
    for record in _records(store):
        kind = record.WhichOneof("record_type")
        if kind == "scalar" and not record.scalar.key.startswith(_SYSTEM_PREFIX):
            out.points.append((record.scalar.step, record.scalar.key, record.scalar.value.number))
        elif kind == "finish":
            out.status = RunState.Name(record.finish.state).removeprefix("RUN_STATE_")
    config = run_dir / "files" / "config.yaml"
    if config.exists():
        stored = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        out.params = {key: item["value"] for key, item in stored.items()}


def _records(store: Path):
    """Every ``Record`` in a ``.swanlab`` file, up to a cut-off tail; a bad checksum raises ``ValueError``."""
    data = store.read_bytes()
    if len(data) < _HEADER.size:
        return
    ident, _, version = _HEADER.unpack_from(data)
    if ident != b":SWL" or version != 2:
        raise ValueError(f"{store}: not a swanlab v2 store (ident {ident!r}, version {version})")
    offset, message = _HEADER.size, b""
    while offset + _CHUNK.size <= len(data):
        if _BLOCK - offset % _BLOCK < _CHUNK.size:  # block tail too small for a header: padding
            offset += _BLOCK - offset % _BLOCK
            continue
        crc, length, kind = _CHUNK.unpack_from(data, offset)
        chunk = data[offset + _CHUNK.size: offset + _CHUNK.size + length]
        if len(chunk) < length:  # cut off by a killed process: its last bytes never reached disk
            return
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{store}: bad checksum at byte {offset}")
        offset += _CHUNK.size + length
        message = chunk if kind in (_FULL, _FIRST) else message + chunk
        if kind in (_FULL, _LAST):
            record = Record()
            record.ParseFromString(message)
            yield record
