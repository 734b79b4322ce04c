"""An ``Ack`` (core/acks.py) on the wire: msgpack of its plain fields, checked field by field when read."""

from __future__ import annotations

import msgpack

from pipeline.core.acks import Ack, SinkCounts, Work, plain_counts
from pipeline.core.errors import CodecError


def pack_ack(ack: Ack) -> bytes:
    return msgpack.packb([ack.applied, ack.gap, ack.opened, ack.error, ack.counts.to_plain(), ack.where, ack.pid,
                          ack.node_id, ack.held, ack.durable, ack.sources, ack.work.to_plain(), ack.output, ack.last_error,
                          ack.last_error_at, ack.state_unsaved_since, ack.stored, ack.reduced],
                         use_bin_type=True)


def unpack_ack(blob: bytes) -> Ack:
    """The ``Ack`` in ``blob``; CodecError for anything that is not one (a hostile value never reaches int() or str())."""
    try:
        applied, gap, opened, error, counts, where, pid, node_id, held, durable, sources, work, output, last_error, \
            last_error_at, state_unsaved_since, stored, reduced = msgpack.unpackb(blob, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CodecError(f"malformed acknowledgement: {exc}") from exc
    if type(applied) is not int or type(pid) is not int or (error is not None and type(error) is not str) \
            or type(where) is not str or type(node_id) is not str or type(output) is not str \
            or (durable is not None and type(durable) is not int) \
            or (last_error is not None and type(last_error) is not str) or type(last_error_at) not in (int, float) \
            or type(state_unsaved_since) not in (int, float):
        raise CodecError("malformed acknowledgement: bad applied, durable, pid, error, where, node_id, output or "
                         "last error field, or state_unsaved_since")
    if not _is_reduced(reduced):
        raise CodecError("malformed acknowledgement: bad reduced points")
    return Ack(applied=applied, durable=durable, gap=bool(gap), held=bool(held), opened=bool(opened), error=error,
               counts=SinkCounts.from_plain(counts), where=where, pid=pid, node_id=node_id, sources=plain_counts(sources),
               work=Work.from_plain(work), output=output, last_error=last_error, last_error_at=float(last_error_at),
               state_unsaved_since=float(state_unsaved_since), stored=plain_counts(stored), reduced=reduced)


def _is_reduced(value: object) -> bool:
    """{} or {"points": [[int step, {str: number}], ...], "figures": {str: ...}}."""
    if value == {}:
        return True
    if not (type(value) is dict and set(value) == {"points", "figures"} and type(value["figures"]) is dict
            and type(value["points"]) is list):
        return False
    return all(type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is dict
               and all(type(k) is str and type(v) in (int, float) for k, v in p[1].items()) for p in value["points"])
