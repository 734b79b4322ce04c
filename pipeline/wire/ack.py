"""An ``Ack`` (core/acks.py) on the wire: msgpack of its plain fields, checked field by field when read."""

from __future__ import annotations

from collections.abc import Callable

import msgpack

from tracklane.core.acks import Ack, SinkCounts, Work, plain_counts
from tracklane.core.errors import CodecError
from tracklane.core.health_rules import Alert


def pack_ack(ack: Ack) -> bytes:
    return msgpack.packb([ack.handed, ack.gap, ack.opened, ack.error, ack.counts.to_plain(), ack.where, ack.pid,
                          ack.node_id, ack.held, ack.stored, ack.handed_by_sender, ack.work.to_plain(), ack.last_error,
                          ack.last_error_at, ack.state_unsaved_since, ack.stored_by_sender, ack.answers],
                         use_bin_type=True)


def unpack_ack(blob: bytes) -> Ack:
    """The ``Ack`` in ``blob``; CodecError for anything that is not one (a hostile value never reaches int() or str())."""
    try:
        handed, gap, opened, error, counts, where, pid, node_id, held, stored, handed_by_sender, work, last_error, \
            last_error_at, state_unsaved_since, stored_by_sender, answers = msgpack.unpackb(blob, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CodecError(f"malformed acknowledgement: {exc}") from exc
    if type(handed) is not int or type(pid) is not int or (error is not None and type(error) is not str) \
            or type(where) is not str or type(node_id) is not str \
            or (stored is not None and type(stored) is not int) \
            or (last_error is not None and type(last_error) is not str) or type(last_error_at) not in (int, float) \
            or type(state_unsaved_since) not in (int, float):
        raise CodecError("malformed acknowledgement: bad handed, stored, pid, error, where, node_id or "
                         "last error field, or state_unsaved_since")
    _check_answers(answers)
    return Ack(handed=handed, stored=stored, gap=bool(gap), held=bool(held), opened=bool(opened), error=error,
               counts=SinkCounts.from_plain(counts), where=where, pid=pid, node_id=node_id,
               handed_by_sender=plain_counts(handed_by_sender), work=Work.from_plain(work), last_error=last_error,
               last_error_at=float(last_error_at), state_unsaved_since=float(state_unsaved_since),
               stored_by_sender=plain_counts(stored_by_sender), answers=answers)


def _is_reduced(value: object) -> bool:
    """{"points": [[int step, {str: number}], ...], "figures": {str: ...}}."""
    if not (type(value) is dict and set(value) == {"points", "figures"} and type(value["figures"]) is dict
            and type(value["points"]) is list):
        return False
    return all(type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is dict
               and all(type(k) is str and type(v) in (int, float) for k, v in p[1].items()) for p in value["points"])


ANSWER_CHECKS: dict[str, Callable[[object], bool]] = {
    "output": lambda value: type(value) is str,  # the console's lines (host/sink.py ``Printing``)
    "reduced": _is_reduced,  # the reduce lane's completed steps (host/sink.py ``Reducing``)
    "alerts": lambda value: type(value) is list and all(_is_alert(a) for a in value),  # host/sink.py ``Alerting``
}
"""Each capability's answer (``Ack.answers``) and what it must look like: a new capability adds a line here."""


def _is_alert(value: object) -> bool:
    try:
        Alert.from_plain(value)
    except CodecError:
        return False
    return True


def _check_answers(answers: object) -> None:
    if type(answers) is not dict:
        raise CodecError("malformed acknowledgement: answers must be a map")
    for capability, value in answers.items():
        check = ANSWER_CHECKS.get(capability) if type(capability) is str else None
        if check is None:
            raise CodecError(f"malformed acknowledgement: unknown capability {str(capability)[:40]!r}")
        if not check(value):
            raise CodecError(f"malformed acknowledgement: bad {capability} answer")
