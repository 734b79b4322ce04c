"""The spool's own throughput, and the alternative it was chosen over, on this machine's disk.

    python -m tracklane.benchmarks.spool [--seconds 2] [--out DIR]

For batches of ~2 KB (a step of scalars), 64 KB and 1 MB (trajectories), each appended the way
the shipper does it, one batch at a time:

    segments   tracklane.spool.segments.Spool: CRC32C frames in append-only segment files (fsync every 1 s,
               and after every batch)
    sqlite     SQLite in WAL mode, one transaction per batch (synchronous=NORMAL, and FULL)

and, for scale, what the shipper already spends per batch: msgpack + zstd of a 100-scalar step and
``ray.put`` of the result. Prints microseconds per batch and MB/s; writes spool.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIZES = {"2KB": 2_000, "64KB": 64_000, "1MB": 1_000_000}


def _timed(append: Callable[[int, bytes], None], payload: bytes, seconds: float) -> dict[str, float]:
    seq, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        seq += 1
        append(seq, payload)
    elapsed = time.perf_counter() - started
    return {"us_per_batch": round(elapsed / seq * 1e6, 1), "mb_per_s": round(seq * len(payload) / elapsed / 1e6, 1),
            "batches": seq}


def segments(folder: Path, payload: bytes, seconds: float, fsync_s: float) -> dict[str, float]:
    from tracklane.spool import Spool

    spool = Spool(str(folder), fsync_s=fsync_s, max_bytes=2**40)
    try:
        return _timed(lambda seq, blob: spool.append(seq, 1, 0.0, blob) and None, payload, seconds)
    finally:
        spool.close()


def sqlite_wal(folder: Path, payload: bytes, seconds: float, synchronous: str) -> dict[str, float]:
    folder.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(folder / "spool.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE batches (seq INTEGER PRIMARY KEY, records INTEGER, oldest REAL, payload BLOB)")

    def append(seq: int, blob: bytes) -> None:
        db.execute("BEGIN")
        db.execute("INSERT INTO batches VALUES (?, ?, ?, ?)", (seq, 1, 0.0, blob))
        db.execute("COMMIT")

    try:
        return _timed(append, payload, seconds)
    finally:
        db.close()


def shipper_costs(seconds: float) -> dict[str, float]:
    """What the shipper already pays per batch of one 100-scalar step: encode, and ray.put."""
    import ray

    from tracklane.wire import Batch, Metrics, encode_batch

    batch = Batch(seq=1, created=time.time(), records=[Metrics(step=1, values={f"k{i}": i * 0.5 for i in range(100)},
                                                               time=time.time())])
    blob = encode_batch(batch)
    encode = _timed(lambda seq, _: encode_batch(batch) and None, blob, seconds)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    put = _timed(lambda seq, data: ray.put(data) and None, blob, seconds)
    return {"encode_us": encode["us_per_batch"], "ray_put_us": put["us_per_batch"], "encoded_bytes": len(blob)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracklane.benchmarks.spool", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--out", default="tracklane_runs/spool")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="spool-bench-", dir=out))
    results: dict[str, Any] = {"sizes": {}}
    try:
        for name, size in SIZES.items():
            payload = os.urandom(size)  # compressed batches look random to the disk
            row = {
                "segments fsync 1 s": segments(scratch / f"seg-{name}", payload, args.seconds, 1.0),
                "segments fsync each": segments(scratch / f"segf-{name}", payload, args.seconds, 0.0),
                "sqlite WAL NORMAL": sqlite_wal(scratch / f"sql-{name}", payload, args.seconds, "NORMAL"),
                "sqlite WAL FULL": sqlite_wal(scratch / f"sqlf-{name}", payload, args.seconds, "FULL"),
            }
            results["sizes"][name] = row
        results["shipper"] = shipper_costs(args.seconds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, row in results["sizes"].items():
        print(f"batch {name}:")
        for method, figures in row.items():
            print(f"  {method:22s} {figures['us_per_batch']:9.1f} us/batch {figures['mb_per_s']:8.1f} MB/s")
    shipper = results["shipper"]
    print(f"shipper, per 100-scalar batch ({shipper['encoded_bytes']} B): encode {shipper['encode_us']} us, "
          f"ray.put {shipper['ray_put_us']} us")
    (out / "spool.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {out / 'spool.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
