"""Read a wandb run back from its ``run-<id>.wandb`` files, checking every record's CRC.

wandb 0.31 no longer ships a reader for its transaction log, so this is our own,
written from the layout observed in files wandb 0.31 writes:

* a 7-byte file header: ``:W&B``, the magic 0xBEE1 (little-endian), version 0;
* then 32 KiB blocks, counted from the start of the file (header included), holding
  records with a 7-byte header: CRC32 (little-endian, zlib's, not masked) of the type
  byte followed by the payload, payload length (uint16 LE), type (1 full, 2 first,
  3 middle, 4 last). A block tail shorter than 7 bytes is zero padding.
* each reassembled payload is one ``wandb_internal_pb2.Record``.

``ReadBack.params`` is nested: wandb stores one JSON value per top-level config key,
and each is parsed back whole (``{"actor": {"lr": 1e-6}}``); wandb's own ``_wandb``
key is left out.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

from . import ReadBack

FILE_HEADER = b":W&B" + (0xBEE1).to_bytes(2, "little") + b"\x00"
BLOCK_SIZE = 32 * 1024
RECORD_HEADER = struct.Struct("<IHB")  # crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_STAMP = re.compile(r"run-(\d{8}_\d{6})-")


class CorruptRunFileError(ValueError):
    """A ``.wandb`` file does not parse: bad header, bad CRC, bad record chain, truncation."""


def read_wandb_run(wandb_dir: str | Path, run_id: str | None = None) -> ReadBack:
    """Every run file of one run under ``wandb_dir`` (the WANDB_DIR), oldest first, as one ReadBack."""
    back = ReadBack()
    for path in run_files(wandb_dir, run_id):
        part = read_run_file(path)
        back.points.extend(part.points)
        back.params.update(part.params)
        back.status = part.status or back.status
    return back


def run_files(wandb_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """The ``run-<id>.wandb`` files of one run, in the order their directories were made.

    A run re-attached offline gets a new directory (``...-<id>`` or ``...-<id>-1`` when
    started within the same second), so one run may have several files.
    """
    root = Path(wandb_dir)
    found = [p for sub in ("wandb", ".wandb") for p in (root / sub).glob("*run-*/run-*.wandb")]
    ids = {_file_run_id(p) for p in found}
    if run_id is None and len(ids) > 1:
        raise ValueError(f"several wandb runs under {root} ({', '.join(sorted(ids))}): pass run_id")
    found = [p for p in found if run_id is None or _file_run_id(p) == run_id]
    if not found:
        raise FileNotFoundError(f"no wandb run file{f' for run {run_id!r}' if run_id else ''} under {root}")
    return sorted(found, key=_creation_order)


def read_run_file(path: str | Path) -> ReadBack:
    """One ``.wandb`` file: history points, config, and the exit code as ``exit_code=N``."""
    from wandb.proto import wandb_internal_pb2  # the record schema is wandb's own

    back = ReadBack()
    for payload in iter_payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            back.points.extend(_history_points(record.history))
        elif kind == "run":
            _apply_config(back.params, record.run.config)
        elif kind == "config":
            _apply_config(back.params, record.config)
        elif kind == "exit":
            back.status = f"exit_code={record.exit.exit_code}"
    return back


def iter_payloads(path: str | Path) -> Iterator[bytes]:
    """The record payloads of a ``.wandb`` file, each CRC-checked and reassembled."""
    data = Path(path).read_bytes()
    if data[: len(FILE_HEADER)] != FILE_HEADER:
        raise CorruptRunFileError(f"{path}: not a wandb run file (header {data[:7]!r})")
    offset, pending = len(FILE_HEADER), None
    while offset < len(data):
        left = BLOCK_SIZE - offset % BLOCK_SIZE
        if left < RECORD_HEADER.size:  # block trailer: zero padding
            offset += left
            continue
        crc, length, kind = _record_header(data, offset, path)
        start = offset + RECORD_HEADER.size
        payload = data[start : start + length]
        if len(payload) != length or length > left - RECORD_HEADER.size:
            raise CorruptRunFileError(f"{path}: record at byte {offset} overruns its block or the file")
        if zlib.crc32(payload, zlib.crc32(bytes((kind,)))) != crc:
            raise CorruptRunFileError(f"{path}: CRC mismatch in record at byte {offset}")
        offset = start + length
        pending = yield from _assemble(pending, kind, payload, path, offset)
    if pending is not None:
        raise CorruptRunFileError(f"{path}: file ends inside a fragmented record")


def _record_header(data: bytes, offset: int, path: Any) -> tuple[int, int, int]:
    if offset + RECORD_HEADER.size > len(data):
        raise CorruptRunFileError(f"{path}: truncated record header at byte {offset}")
    return RECORD_HEADER.unpack_from(data, offset)


def _assemble(pending: bytes | None, kind: int, payload: bytes, path: Any, offset: int):
    """Yield a completed payload; return the fragments still waiting for their LAST part."""
    if kind == FULL and pending is None:
        yield payload
        return None
    if kind == FIRST and pending is None:
        return payload
    if kind == MIDDLE and pending is not None:
        return pending + payload
    if kind == LAST and pending is not None:
        yield pending + payload
        return None
    raise CorruptRunFileError(f"{path}: unexpected record type {kind} before byte {offset}")


def _history_points(history: Any) -> Iterator[tuple[int, str, float]]:
    items = {(item.key or "/".join(item.nested_key)): _item_value(item) for item in history.item}
    step = int(items["_step"]) if "_step" in items else history.step.num
    for key, value in items.items():
        if not key.startswith("_") and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield step, key, value


def _item_value(item: Any) -> Any:
    """wandb 0.31 writes ``value_json``; the typed ``value`` oneof is read too, should a writer use it."""
    typed = item.WhichOneof("value")
    if typed == "json":
        return json.loads(item.json)
    if typed is not None:
        return None if typed == "none" else getattr(item, typed)
    return json.loads(item.value_json)  # Python's json reads NaN, Infinity and -Infinity


def _apply_config(params: dict[str, Any], config: Any) -> None:
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


def _file_run_id(path: Path) -> str:
    return path.stem[len("run-") :]


def _creation_order(path: Path) -> tuple[str, int]:
    """(time stamp in the directory name, the ``-N`` wandb appends on a same-second clash)."""
    name = path.parent.name
    match = _STAMP.search(name)
    stamp = match.group(1) if match else ""
    clash = name[match.end() + len(_file_run_id(path)) :] if match else ""
    return stamp, int(clash[1:]) if clash.startswith("-") and clash[1:].isdigit() else 0
