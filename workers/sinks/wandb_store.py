"""wandb's transaction log (``run-<id>.wandb``), read the way wandb 0.31 writes it.

The wandb sink reads it to know what is really on disk (its stored watermark), and the test
reader (``workers/testing/readers/wandb_reader.py``) to read a run back. wandb 0.31 ships no
reader for it; this one is written from the layout observed in the files it writes:

* a 7-byte file header: ``:W&B``, the magic 0xBEE1 (little-endian), version 0;
* then 32 KiB blocks, counted from the start of the file (header included), holding records with
  a 7-byte header: CRC32 (little-endian, zlib's, not masked) of the type byte followed by the
  payload, payload length (uint16 LE), type (1 full, 2 first, 3 middle, 4 last). A block tail
  shorter than 7 bytes is zero padding;
* each reassembled payload is one ``wandb_internal_pb2.Record``.

wandb-core keeps the block it is filling in memory and writes it only when it is full (or when the
run is closed): up to 32 KiB of the newest records are not on disk, and die with wandb-core. Also,
a history row reaches wandb-core only when a later step is logged (wandb keeps the newest step's
row open). So what wandb-core was handed is stored once a row of that step, or a later one, is in
the file.

The wandb sink numbers the rows itself (``_step``) and tags each with ``ROW_TAG``: "<sender>|<seq>|<n>",
the batch and the position in it of the row's last record. The file holds a prefix of what wandb-core
was handed, so a sender's newest tag in it says which of that sender's records are on disk.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE_HEADER = b":W&B" + (0xBEE1).to_bytes(2, "little") + b"\x00"
BLOCK_SIZE = 32 * 1024
RECORD_HEADER = struct.Struct("<IHB")  # crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_STAMP = re.compile(r"run-(\d{8}_\d{6})-")
ROW_TAG = "_tracklane"
"""The history key of a row's tag (wandb hides keys starting with "_" from its charts)."""


class CorruptRunFileError(ValueError):
    """A ``.wandb`` file does not parse: bad header, bad CRC, bad record chain."""


def scan(data: bytes, base: int, name: Any = "") -> Iterator[tuple[bytes, int]]:
    """Each complete record payload in ``data`` (the file's bytes from offset ``base``, which is the
    start of a record or of the block padding before one), with the file offset just past it.

    Stops quietly at a torn or unfinished last record (its writer was killed, or has not written
    the rest yet): the records before it are what the file holds. Damage elsewhere raises
    ``CorruptRunFileError``.
    """
    i, pending = 0, None
    while i < len(data):
        offset = base + i
        left = BLOCK_SIZE - offset % BLOCK_SIZE
        if left < RECORD_HEADER.size:  # block trailer: zero padding
            i += left
            continue
        if i + RECORD_HEADER.size > len(data):
            return
        crc, length, kind = RECORD_HEADER.unpack_from(data, i)
        if length > left - RECORD_HEADER.size:
            raise CorruptRunFileError(f"{name}: record at byte {offset} overruns its block")
        start = i + RECORD_HEADER.size
        payload = data[start : start + length]
        if len(payload) != length:
            return
        if zlib.crc32(payload, zlib.crc32(bytes((kind,)))) != crc:
            raise CorruptRunFileError(f"{name}: CRC mismatch in record at byte {offset}")
        i = start + length
        if kind == FULL and pending is None:
            yield payload, base + i
        elif kind == FIRST and pending is None:
            pending = [payload]
        elif kind == MIDDLE and pending is not None:
            pending.append(payload)
        elif kind == LAST and pending is not None:
            pending.append(payload)
            yield b"".join(pending), base + i
            pending = None
        else:
            raise CorruptRunFileError(f"{name}: unexpected record type {kind} at byte {offset}")


def iter_payloads(path: str | Path) -> Iterator[bytes]:
    """The complete record payloads of a ``.wandb`` file, each CRC-checked and reassembled."""
    data = Path(path).read_bytes()
    if data[: len(FILE_HEADER)] != FILE_HEADER:
        raise CorruptRunFileError(f"{path}: not a wandb run file (header {data[:7]!r})")
    for payload, _ in scan(data[len(FILE_HEADER):], len(FILE_HEADER), path):
        yield payload


class LogTail:
    """Follows one ``.wandb`` file as wandb-core writes it: the highest history step on disk so far.

    Reads only what was added since the last call, from the start of the first record not yet
    complete. A damaged file stops the tail where the damage starts (``error`` says where).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.step = -1
        """The highest step of a history row in the file (-1: none yet)."""
        self.error: str | None = None
        self._offset = len(FILE_HEADER)  # start of the first record not read yet
        self._size = 0

    def advance(self) -> int:
        """Read what reached the file since the last call; returns ``step``."""
        if self.error is not None:
            return self.step
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return self.step
        if size <= self._size or size < len(FILE_HEADER):
            return self.step
        self._size = size
        from wandb.proto import wandb_internal_pb2  # the record schema is wandb's own

        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read(size - self._offset)
        payloads = []
        try:
            for payload, end in scan(data, self._offset, self.path):
                payloads.append(payload)
                self._offset = end
        except CorruptRunFileError as exc:
            self.error = str(exc)
        # The wandb sink's row numbers only grow, so the newest history record holds the highest: parse from
        # the end until one is found (parsing every record once is ~6% of the sink's own write time: 0.19 s
        # of 3.25 s for 2,000 steps of 81 keys; now 0.045 s in all).
        for payload in reversed(payloads):
            record = wandb_internal_pb2.Record.FromString(payload)  # type: ignore[attr-defined]
            if record.WhichOneof("record_type") == "history":
                self.step = max(self.step, record.history.step.num)
                break
        return self.step


def run_files(wandb_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """The ``run-<id>.wandb`` files of one run under ``wandb_dir`` (the WANDB_DIR), oldest first.

    A run re-attached offline gets a new directory (``...-<id>``, or ``...-<id>-1`` when started
    within the same second), so one run may have several files. Without ``run_id`` there must be
    exactly one run there.
    """
    root = Path(wandb_dir)
    found = [p for sub in ("wandb", ".wandb") for p in (root / sub).glob("*run-*/run-*.wandb")]
    ids = {file_run_id(p) for p in found}
    if run_id is None and len(ids) > 1:
        raise ValueError(f"several wandb runs under {root} ({', '.join(sorted(ids))}): pass run_id")
    return sorted((p for p in found if run_id is None or file_run_id(p) == run_id), key=_creation_order)


def file_run_id(path: Path) -> str:
    return path.stem[len("run-") :]


def _creation_order(path: Path) -> tuple[str, int]:
    """(time stamp in the directory name, the ``-N`` wandb appends on a same-second clash)."""
    name = path.parent.name
    match = _STAMP.search(name)
    stamp = match.group(1) if match else ""
    clash = name[match.end() + len(file_run_id(path)) :] if match else ""
    return stamp, int(clash[1:]) if clash.startswith("-") and clash[1:].isdigit() else 0


@dataclass
class Stored:
    """What the earlier files of a run hold (``stored_so_far``)."""

    step: int = -1
    """The highest history step, the sink's row number (-1: none)."""
    rows: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Source -> (seq, position) of its newest tagged row: its records up to there are on disk."""
    artifacts: set[tuple[str, str, Any]] = field(default_factory=set)
    """The artifacts logged, as (name, type, the step in their metadata)."""
    config: bool = False
    """Whether any config (the hyper-parameters) reached the disk."""


def stored_so_far(paths: list[Path]) -> Stored:
    """Read the earlier files of a run; a damaged file counts up to its damage."""
    from wandb.proto import wandb_internal_pb2

    stored = Stored()
    for path in paths:
        try:
            for payload in iter_payloads(path):
                record = wandb_internal_pb2.Record.FromString(payload)  # type: ignore[attr-defined]
                kind = record.WhichOneof("record_type")
                if kind == "history":
                    stored.step = max(stored.step, record.history.step.num)
                    tag = row_tag(record.history)
                    if tag is not None and tag[1:] > stored.rows.get(tag[0], (0, -1)):
                        stored.rows[tag[0]] = tag[1:]
                elif kind == "artifact":
                    artifact = record.artifact
                    stored.artifacts.add((artifact.name, artifact.type, metadata_step(artifact.metadata)))
                elif kind in ("run", "config"):
                    config = record.run.config if kind == "run" else record.config
                    stored.config = stored.config or any(item.key != "_wandb" for item in config.update)
        except CorruptRunFileError:
            continue
    return stored


def row_tag(history: Any) -> tuple[str, int, int] | None:
    """(sender, seq, position) of a history row the wandb sink tagged, else None."""
    for item in history.item:
        if item.key == ROW_TAG or list(item.nested_key) == [ROW_TAG]:
            try:
                sender, seq, position = json.loads(item.value_json).rsplit("|", 2)
                return sender, int(seq), int(position)
            except (ValueError, AttributeError):
                return None
    return None


def apply_config(params: dict[str, Any], config: Any) -> None:
    """Apply one config record (a ``run`` record's ``config``, or a ``config`` record) to ``params``: nested,
    one JSON value per key, wandb's own ``_wandb`` left out; the record's removals popped."""
    for item in config.update:
        path = list(item.nested_key) or [item.key]
        if path[0] == "_wandb":
            continue
        target = params
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = json.loads(item.value_json)
    for item in config.remove:
        params.pop(item.key or "/".join(item.nested_key), None)


def metadata_step(metadata_json: str) -> Any:
    """The ``step`` in an artifact record's metadata (the wandb sink puts it there), or None."""
    try:
        return json.loads(metadata_json).get("step") if metadata_json else None
    except (ValueError, AttributeError):
        return None
