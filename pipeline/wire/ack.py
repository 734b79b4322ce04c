"""An ``Ack`` (core/acks.py) on the wire: msgpack of its plain fields, checked field by field when read."""

from __future__ import annotations

import msgpack

from tracklane.core.acks import Ack, SinkCounts, Work, plain_counts
from tracklane.core.errors import CodecError


def pack_ack(ack: Ack) -> bytes:
    return msgpack.packb([ack.handed, ack.gap, ack.opened, ack.error, ack.counts.to_plain(), ack.where, ack.pid,
                          ack.node_id, ack.held, ack.stored, ack.handed_by_sender, ack.work.to_plain(), ack.last_error,
                          ack.last_error_at, ack.state_unsaved_since, ack.stored_by_sender, ack.output],
                         use_bin_type=True)


def unpack_ack(blob: bytes) -> Ack:
    """The ``Ack`` in ``blob``; CodecError for anything that is not one (a hostile value never reaches int() or str())."""
    try:
        handed, gap, opened, error, counts, where, pid, node_id, held, stored, handed_by_sender, work, last_error, \
            last_error_at, state_unsaved_since, stored_by_sender, output = msgpack.unpackb(blob, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CodecError(f"malformed acknowledgement: {exc}") from exc
    if type(handed) is not int or type(pid) is not int or (error is not None and type(error) is not str) \
            or type(where) is not str or type(node_id) is not str \
            or (stored is not None and type(stored) is not int) \
            or (last_error is not None and type(last_error) is not str) or type(last_error_at) not in (int, float) \
            or type(state_unsaved_since) not in (int, float) or type(output) is not str:
        raise CodecError("malformed acknowledgement: bad handed, stored, pid, error, where, node_id, "
                         "last error or output field, or state_unsaved_since")
    return Ack(handed=handed, stored=stored, gap=bool(gap), held=bool(held), opened=bool(opened), error=error,
               counts=SinkCounts.from_plain(counts), where=where, pid=pid, node_id=node_id,
               handed_by_sender=plain_counts(handed_by_sender), work=Work.from_plain(work), last_error=last_error,
               last_error_at=float(last_error_at), state_unsaved_since=float(state_unsaved_since),
               stored_by_sender=plain_counts(stored_by_sender), output=output)
