"""The sink host both paths share: open retried, records routed, writes retried with backoff, counts kept."""

from __future__ import annotations

import logging

import pytest

from tracklane.core.acks import SinkCounts
from tracklane.core.errors import CodecError, SinkError
from tracklane.core.records import Metrics, RunSpec
from tracklane.host.sink import Sink
from tracklane.host.sink_host import SinkHost
from tracklane.wire.ack import pack_ack, unpack_ack

RUN = RunSpec(project="p", experiment="e", run_id="host")


class Flaky(Sink):
    """Fails its first ``fail_opens`` opens and ``fail_writes`` writes, then works; keeps what it got."""

    name = "flaky"

    def __init__(self, fail_opens: int = 0, fail_writes: int = 0) -> None:
        super().__init__(RUN, {})
        self.fail_opens, self.fail_writes = fail_opens, fail_writes
        self.got: list[int] = []
        self.opens = self.closes = 0

    def open(self, resume):
        self.opens += 1
        if self.fail_opens:
            self.fail_opens -= 1
            raise SinkError("down at open")
        return {"id": "run-1"}

    def write_metrics(self, records):
        if self.fail_writes:
            self.fail_writes -= 1
            raise SinkError("down at write")
        self.got += [r.step for r in records]

    def close(self, exit_code):
        self.closes += 1


def _records(*steps: int, only=None) -> list[Metrics]:
    return [Metrics(step=s, values={"x": float(s)}, time=0.0, only=only) for s in steps]


def _host(sink: Sink, retries: int = 3, backoff_s: float = 0.5) -> tuple[SinkHost, list[float]]:
    slept: list[float] = []
    return SinkHost("flaky", sink, retries, backoff_s, sleep=slept.append), slept


def test_write_is_retried_with_doubling_backoff_then_lands():
    """Two failing writes are retried after 0.5 s and 1 s of backoff; the records land once, nothing is counted."""
    sink = Flaky(fail_writes=2)
    host, slept = _host(sink)
    host.write(_records(1, 2))
    assert sink.got == [1, 2] and slept == [0.5, 1.0] and host.counts.failed_records == 0


def test_write_that_keeps_failing_is_counted_within_the_bound(caplog):
    """A tracker down for good costs at most backoff * (2**retries - 1) of waiting per batch, then its records
    are counted failed; the warning comes once per outage, and again only after it wrote in between."""
    sink = Flaky(fail_writes=100)
    host, slept = _host(sink, retries=3, backoff_s=0.5)
    with caplog.at_level(logging.WARNING, logger="tracklane"):
        host.write(_records(1, 2, 3))
        host.write(_records(4))
    assert slept == [0.5, 1.0, 2.0] * 2 and sum(slept[:3]) == 0.5 * (2**3 - 1)
    assert host.counts.failed_records == 4 and "down at write" in host.error
    assert sum("backend flaky failed" in r.getMessage() for r in caplog.records) == 1


def test_open_is_retried_at_the_next_write():
    """A tracker that cannot open at start is opened by a later write's retry; the resume info is kept."""
    sink = Flaky(fail_opens=2)
    host, slept = _host(sink)
    assert host.open() is False and "down at open" in host.error
    host.write(_records(5))
    assert sink.got == [5] and sink.opens == 3 and slept == [0.5] and host.resume == {"id": "run-1"}


def test_records_are_routed_by_backend():
    """Only records addressed to this lane (or to every lane) reach its sink."""
    sink = Flaky()
    host, _ = _host(sink)
    host.write(_records(1, only=["wandb"]) + _records(2, only=["flaky", "mlflow"]) + _records(3))
    assert sink.got == [2, 3]


def test_close_happens_once_and_later_writes_are_ignored():
    """close() ends the tracker run once; nothing written after it reaches the sink."""
    sink = Flaky()
    host, _ = _host(sink)
    host.open()
    host.close(0)
    host.close(0)
    host.write(_records(9))
    assert sink.closes == 1 and sink.got == []


def test_counts_of_an_earlier_actor_are_continued():
    """Counts handed in from a saved state keep growing; the ack carries them with where and pid."""
    sink = Flaky(fail_writes=100)
    host = SinkHost("flaky", sink, 0, 0.0, counts=SinkCounts(failed_records=7, unsupported={"image": 2}))
    host.write(_records(1))
    ack = unpack_ack(pack_ack(host.ack(handed=4)))
    assert ack.handed == 4 and ack.counts.failed_records == 8 and ack.counts.unsupported == {"image": 2}
    assert ack.where == "flaky" and ack.pid > 0


def test_malformed_ack_is_refused():
    """An acknowledgement that is not what a host packs raises CodecError, never anything else."""
    with pytest.raises(CodecError):
        unpack_ack(b"\x93\x01\x02")
    with pytest.raises(CodecError):
        unpack_ack(b"not msgpack at all \xc1")
