"""The Ray actor that drains one lane into one tracker: sequence bookkeeping around a sink host.

It decodes each batch, skips what its tracker was handed already (re-sends after a restart), refuses a
batch that does not follow the last one handed, hands the rest to its ``SinkHost`` (which
writes with retries, flushes and counts), saves the sequence number in its state, and answers with
an ``Ack`` packed as msgpack. A tracker that cannot be reached makes it answer "held" (nothing
handed; the lane sends the batch again later). A failing tracker costs only this lane.

Exactly once: the state moves right after the tracker's flush returned, and a sink that can undo
a partial write (``Sink.mark``) has its undo point saved before the write, so an actor killed
between the two is rolled back by its successor and the re-sent batch lands once. A tracker whose
store lags what it was handed (wandb: ``Sink.written``/``Sink.stored``) has two watermarks: the
last batch handed to it (the lane sends the next one) and the last its store holds (what the
state saves, what a successor starts from, what the spool may forget); a successor's sink skips
what its tracker's store turns out to hold already.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, cast

from tracklane.config.placement import forget_process_bound
from tracklane.core.acks import Work
from tracklane.core.errors import CodecError
from tracklane.host.registry import backend_class
from tracklane.host.sink import Judging, Sink
from tracklane.host.sink_host import SinkHost
from tracklane.node.identity import ray_node_id
from tracklane.node.priority import lower_priority
from tracklane.node.process_cpu import ProcessCpu
from tracklane.shipping.hub import ProducerSpec
from tracklane.shipping.judge_emitter import JudgeEmitter
from tracklane.spool.durability import Durability
from tracklane.spool.lane_state import BULK, LaneState, bulk_sender
from tracklane.wire.ack import pack_ack
from tracklane.wire.batch import decode_batch
from tracklane.wire.opening import LaneOpening

_HUB_WAIT_S = 600.0  # a busy node starts the hub late; Ray restarts a judge that gives up
_EMITTER_CLOSE_S = 1.0  # rank 0's close waited for what the judge emitted; what a tracker lacks stays on its disk


class LaneActor:
    """Hosts one sink. Ray calls run one at a time, in submission order."""

    _state_disk: Durability | None = None  # made at the first save (__init__ saves)

    def __init__(self, lane: str, opening: bytes, hub: str = "") -> None:
        """``hub``: a judge's (host/sink.py ``Judging``): the name of the run's hub, which holds what it emits into
        (the lanes, as a producer of its own)."""
        spec = LaneOpening.unpack(opening)
        os.makedirs(spec.state_dir, mode=0o700, exist_ok=True)  # on another node than the trainer's: made here
        if _in_ray_actor():  # its own process
            self._set_up_process(lane, spec)
        self._state = self._load_state(lane, spec)
        sink = backend_class(spec.backend)(spec.run, spec.settings)
        self._emitter = _judge_emitter(lane, sink, hub)
        self._packed_metrics = sink.reads_packed_metrics
        self._host = self._open_host(lane, sink, spec)
        # Per sender (the trainer "", each producer): the last batch handed to the tracker; the state keeps
        # the stored one.
        self._handed = dict(self._state.stored)
        self._unstored: deque[tuple[str, int, Any]] = deque()  # (sender, seq, sink's point) handed, not stored yet
        self._work = Work()
        self._cpu = ProcessCpu()  # its SDK's helper processes too (wandb-core)
        self._fresh_cpu = False  # the next answer looks at the live children (a flush's, a close's)
        if self._host.open():
            self._save()
        if _in_ray_actor():  # open: from now on logging yields the CPU (priority.py says why not before)
            lower_priority(spec.priority)

    def _set_up_process(self, lane: str, spec: LaneOpening) -> None:
        """The actor's own process, before the SDK starts its threads and processes (they inherit it all): the
        trainer's tracker settings and the SDK's chatter in a file of the lane's."""
        os.environ.update(spec.env)  # the trainer's tracker settings, which Ray's own environment may predate
        forget_process_bound(os.environ)  # the trainer's tracker sessions are not this lane's (placement.py)
        # the SDK's own chatter (banners, its warnings) into a file, not the trainer's terminal
        try:
            _stdio_to(os.path.join(spec.state_dir, f"{lane}.out"))
        except OSError:  # a full or read-only disk: the chatter goes where Ray sends it; the lane still works
            pass

    def _load_state(self, lane: str, spec: LaneOpening) -> LaneState:
        """The lane's acknowledgement state on this node's disk, caught up with rank 0's copy of it."""
        state = LaneState.load(os.path.join(spec.state_dir, f"{lane}.state"))
        if state.catch_up(spec.stored):  # rank 0's copy is ahead: this node's disk lost or lags the state
            state.pending, state.mark = 0, None  # a stale undo point could undo a stored batch
        return state

    def _open_host(self, lane: str, sink: Sink, spec: LaneOpening) -> SinkHost:
        """The sink's host, its output captured, and the tracker rolled back if the previous actor died inside a
        write (the state's undo point, cleared then)."""
        node_id = ray_node_id()
        host = SinkHost(lane, sink, spec.sink_retries, spec.retry_backoff_s, resume=self._state.resume,
                        counts=self._state.counts, node_id=node_id,
                        node_note=_node_note(node_id) if spec.trainer_node and node_id != spec.trainer_node else "")
        host.capture_output()  # printed by the trainer (Ack.output), not on this actor's stdout
        if self._state.pending and self._state.mark is not None:  # the previous actor died inside a write
            host.rollback(self._state.mark)
        self._state.pending, self._state.mark = 0, None
        return host

    def ready(self, sender: str = "") -> bytes:
        """Whether the tracker opened, and what it was handed before (non-zero after a restart)."""
        return self._answer(sender)

    def apply(self, seq: int, prev: int, blob: bytes, final: bool = False, sender: str = "") -> bytes:
        """Write batch ``seq`` of ``sender`` if it follows ``prev``, the last batch that sender's lane sent
        before it. ``final``: the lane waited long enough (max_outage_s); count what does not arrive
        instead of holding it. Each sender (the trainer, each producer) numbers its own batches."""
        handed = self._handed.get(sender, 0)
        if seq <= handed:  # a re-send of what the tracker has already
            self._settle()
            return self._answer(sender)
        if prev != handed:
            return self._answer(sender, gap=True)
        started = time.perf_counter()
        try:
            return self._apply(seq, blob, final, sender)
        finally:
            self._work.busy_s += time.perf_counter() - started

    def _apply(self, seq: int, blob: bytes, final: bool, sender: str) -> bytes:
        try:
            batch = decode_batch(blob, packed_metrics=self._packed_metrics)
        except CodecError as exc:
            self._host.note_error(f"corrupt batch {seq}{f' of {sender}' if sender else ''}: {exc}")
        else:
            mark = self._host.mark(batch.records)
            if mark is not None:
                self._state.pending, self._state.mark = seq, mark
                self._save()
            if not self._host.write(batch.records, hold=not final, flush=True, batch=(sender, seq)):
                return self._answer(sender, held=True)  # the mark stays: rolling back to it undoes nothing
            self._work.records += len(batch.records)
        self._handed[sender] = seq
        self._unstored.append((sender, seq, self._host.written()))
        self._state.pending, self._state.mark = 0, None
        self._settle()
        self._save()
        return self._answer(sender)

    def _settle(self) -> None:
        """Move the stored watermarks over every batch the tracker's store now holds, in order."""
        while self._unstored:
            sender, seq, point = self._unstored[0]
            if point is not None and not self._host.stored(point):
                return
            self._unstored.popleft()
            self._state.stored[sender] = seq

    def catch_up(self, sender: str, stored: int) -> bytes:
        """The lane knows from an earlier actor's answer that the tracker's store holds ``sender``'s batches through
        ``stored``; this actor's state is behind (its disk refused the last saves before that actor died): take it,
        or the lane's next batch would never follow the last one handed here."""
        if stored > self._handed.get(sender, 0):
            self._handed[sender] = stored
            self._state.stored[sender] = max(stored, self._state.stored_of(sender))
            self._save()
        return self._answer(sender)

    def flush(self) -> bytes:
        self._fresh_cpu = True
        self._host.flush()
        self._settle()
        self._save()
        return self._answer("")

    def close(self, exit_code: int) -> bytes:
        """End the tracker run; answers with the final figures."""
        self._fresh_cpu = True
        if self._host.close(exit_code):  # closed cleanly: its store holds everything handed to it
            self._unstored.clear()
            self._state.stored.update(self._handed)
        self._save()
        if self._emitter is not None:  # rank 0's close waited for what it emitted: it only stops now
            self._emitter.close(_EMITTER_CLOSE_S)
        return self._answer("")

    def _save(self) -> None:
        """A disk that refuses the state (full, read-only, failing, the folder removed) costs durability, not
        delivery: the state stays in memory, the answers say since when, and every later save tries the disk
        again (each fails fast)."""
        self._state.resume = self._host.resume
        self._state.counts = self._host.counts
        if self._state_disk is None:
            self._state_disk = Durability(what=f"the acknowledgement state {self._state.path}",
                                          while_off="kept in memory: an actor restart meanwhile may apply a batch twice")
        try:
            self._write_state()
        except OSError as exc:
            self._state_disk.failed(exc)
        else:
            self._state_disk.succeeded()

    def _write_state(self) -> None:
        try:
            self._state.save()
        except FileNotFoundError:  # its folder was removed (with the spool's): make it again
            os.makedirs(os.path.dirname(self._state.path), mode=0o700, exist_ok=True)
            self._state.save()

    def _answer(self, sender: str, gap: bool = False, held: bool = False) -> bytes:
        """The answer to ``sender``'s lane; it also says how far every producer got (rank 0's finish waits on it),
        and brings rank 0 the console's lines (``SinkHost.take_output``); a producer's lane gets none (it is not
        the user's terminal)."""
        self._work.cpu_s = self._cpu.seconds(fresh=not sender and not gap and not held and self._fresh_cpu)
        self._fresh_cpu = False
        output = "" if sender else self._host.take_output()
        if output and self._unstored:  # the console's store is the trainer's stdout: its lines are
            self._settle()  # on their way
            self._save()
        # Rank 0's streams hear how far every sender got; a producer's only its own (an answer to each of 64
        # producers' batches naming all 128 streams cost the lane O(producers) a batch).
        streams = None if sender in _RANK0 else (_own(sender), bulk_sender(_own(sender)))
        ack = self._host.ack(self._handed.get(sender, 0), stored=self._state.stored_of(sender), gap=gap, held=held,
                             handed_by_sender={k: v for k, v in self._handed.items()
                                               if k and (streams is None or k in streams)},
                             work=self._work, output=output)
        ack.state_unsaved_since = self._state_disk.off_since if self._state_disk is not None else 0.0
        stored = self._state.stored
        ack.stored_by_sender = stored if streams is None else {k: v for k, v in stored.items() if k in streams}
        return pack_ack(ack)


_RANK0 = ("", bulk_sender(""))
"""Rank 0's two streams (shipping/lane.py)."""


def _own(sender: str) -> str:
    """A producer's sender id, from either of its streams'."""
    return sender[:-len(BULK)] if sender.endswith(BULK) else sender


def _judge_emitter(lane: str, sink: Sink, hub: str) -> JudgeEmitter | None:
    """A judge's way into the trackers (rank 0 names a hub to judges only: ``judges``, host/sink.py): what it
    emits into, asked of the run's hub by its name."""
    if not hub:
        return None
    judge = cast(Judging, sink)
    emitter = JudgeEmitter(lane, _spec_from(hub, lane), judge.judged)
    judge.judge_into(emitter)
    return emitter


def _spec_from(hub: str, lane: str) -> ProducerSpec:
    """The judge's spec, as rank 0 left it with the hub (the hub may still be starting, its name not yet known)."""
    import ray

    deadline = time.monotonic() + _HUB_WAIT_S
    while True:
        try:
            spec: Any = ray.get(ray.get_actor(hub).spec_for.remote(lane), timeout=max(1.0, deadline - time.monotonic()))
            if spec is not None:
                return cast(ProducerSpec, spec)
        except (ValueError, ray.exceptions.GetTimeoutError):  # no actor by that name yet; slow to answer
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.2)


def _in_ray_actor() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # outside Ray
        return False


def _stdio_to(path: str) -> None:
    """This process's stdout and stderr (file descriptors 1 and 2, so an SDK's subprocesses too) appended to
    ``path``: Ray forwards an actor's output to the driver's terminal, late and prefixed ``(LaneActor pid=...)``,
    among the console's lines. What a tracker did is in the lane's report; what its SDK said is here."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _node_note(node_id: str) -> str:
    """Where the paths in ``where`` are, when that is not the trainer's node."""
    import socket

    import ray

    return f" [on node {socket.gethostname()} {ray.util.get_node_ip_address()} ({node_id[:12]}), not the trainer's]"

