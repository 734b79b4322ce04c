"""Rank 0 takes over the spools of producers that died: their shipped batches reach every tracker once.

A live producer holds its spool folder's lock (spool/producers.py); the kernel frees it when the process
dies, SIGKILL included. Every ``SCAN_EVERY_S`` the shipper thread tries each folder's lock: one it gets
belongs to a producer that is gone (it died, or closed before its lanes had everything, or it ran in a
process of the run rank 0 continues). Its batches go to every lane under the producer's own sender id,
through ``Stream``s like the producer's own: each actor's watermark for that sender skips what its tracker
has already, so nothing lands twice. Its segments are deleted once every lane's tracker holds all of it,
and the folder when the run finishes (a resumed run still reports it). A lane that gave up, and a tracker of the run
this process does not deliver to, keep the batches they lack on disk, as in rank 0's spool. The producer's tally says exactly
how many of its calls never reached the spool, and which of the batches its full disk refused a lane
never got.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from tracklane.core.errors import ConfigError
from tracklane.core.files import write_atomically
from tracklane.core.report import ProducerReport
from tracklane.shipping.hub import is_judge
from tracklane.shipping.lane import (
    Lanes,
    all_streams,
    lane_dead,
    lane_handed,
    lane_preload,
    lane_settled,
    lane_stored,
    open_lane,
    pump_lane,
)
from tracklane.shipping.spool_keeper import SpoolReloader
from tracklane.shipping.stream import StreamSettings
from tracklane.spool.producers import read_mark, read_tally
from tracklane.spool.recovery import held_back
from tracklane.spool.segments import Spool, SpoolEntry

log = logging.getLogger("tracklane")

SCAN_EVERY_S = 1.0
DELIVERED = "delivered.msgpack"
_UNMARKED_AFTER_S = 30.0  # a folder a producer locked and never marked (it died at once): removed after this


@dataclass(slots=True, kw_only=True)
class Adopted:
    """A dead producer's spool as rank 0 delivered it (msgpack in ``delivered.msgpack`` once delivered)."""

    name: str
    sender: str
    batches: int = 0
    """Batches its spool held that some lane may have lacked."""
    logged: int = 0
    """Its log() calls, exactly (its tally)."""
    dropped: int = 0
    """Calls its buffer dropped (overflow) before shipping."""
    unshipped: int = 0
    """Calls it took that never reached its spool: lost with its process."""
    lost: dict[str, int] = field(default_factory=dict)
    """Per lane, records of batches its disk refused (durability off) that the lane had not taken when it died."""
    delivered: bool = False
    """Every lane's tracker holds all its batches (only this record of it is left in its folder)."""


class _Adoption:
    def __init__(self, folder: str, spool: Spool | None, figures: Adopted, lanes: Lanes,
                 others: dict[str, dict[str, int]] | None = None) -> None:
        """``others``: the run's trackers this process does not deliver to, with what each store holds per sender."""
        self.folder, self.spool, self.lanes, self.figures = folder, spool, lanes, figures
        entries = spool.entries() if spool is not None else []
        self.last = spool.last_seq if spool is not None else 0
        held = held_back(entries, others or {}, figures.sender)
        self._held = self.last if held is None else held  # the others hold every batch through here
        self._spooled = {e.seq for e in entries}
        self._unspooled = read_tally(folder).unspooled
        for lane in lanes.values():
            lane_preload(lane, entries)

    def pump(self) -> None:
        for name, lane in self.lanes.items():
            pump_lane(lane)
            if lane[0].answered and name not in self.figures.lost and not lane_dead(lane):
                # Before anything is re-sent: how far its batches got, so the refused ones past it are lost.
                self.figures.lost[name] = sum(records for seq, records in self._unspooled
                                              if seq > lane_handed(lane) and seq not in self._spooled)
        if self.spool is None:
            return
        stored = [lane_stored(lane) for lane in self.lanes.values()]
        self.spool.release(min([self._held, *stored]))  # a dead one's stays
        if not self.figures.delivered and self._held >= self.last and all(seq >= self.last for seq in stored) \
                and all(lane_dead(lane) or name in self.figures.lost for name, lane in self.lanes.items()):
            self.forget()

    def settled(self) -> bool:
        return self.figures.delivered or all(lane_settled(lane, self.last) for lane in self.lanes.values())

    def handed_everywhere(self) -> bool:
        """Every tracker of the run was handed all of it by a live lane (the trackers' close stores it)."""
        return self._held >= self.last and all(not lane_dead(lane) and lane_settled(lane, self.last)
                                               for lane in self.lanes.values())

    def forget(self) -> None:
        """Every tracker has it all: the segments go; what it cost stays in the folder for the run's report (a
        resumed run reports it too), removed when the run finishes."""
        if self.spool is not None:
            self.spool.close()
            self.spool.release(self.last)
        self.figures.delivered = True
        try:
            write_atomically(os.path.join(self.folder, DELIVERED),
                             msgpack.packb(dataclasses.asdict(self.figures), use_bin_type=True))
        except OSError:  # a full disk: the report of this process still says it
            pass
        log.info("tracklane: producer %s's spooled batches are in every tracker", self.figures.sender)


def _delivered(folder: str) -> Adopted | None:
    try:
        with open(os.path.join(folder, DELIVERED), "rb") as handle:
            data = msgpack.unpackb(handle.read(), raw=False)
        return Adopted(**{**data, "lost": {str(k): int(v) for k, v in data.get("lost", {}).items()}})
    except FileNotFoundError:
        return None
    except Exception:  # damaged: the figures are gone, the delivery is not
        return None


class Orphans:
    """The producers' folder of one run, watched by rank 0's shipper thread."""

    def __init__(self, directory: str, actors: dict[str, Any], settings: StreamSettings,
                 on_gone: Callable[[str, list[SpoolEntry]], None] | None = None,
                 others: dict[str, dict[str, int]] | None = None) -> None:
        """``actors``: lane name -> its lane actor; ``settings``: the lanes' bounds (rank 0's); ``on_gone(sender,
        its spooled batches)``: told of each producer found gone (the reduce judge stops waiting for it);
        ``others``: the run's trackers this process does not deliver to (recovery.py ``others_stored``)."""
        self._others = others or {}
        self._on_gone = on_gone
        self._directory = directory
        self._actors = actors
        self._settings = settings
        self._adopted: dict[str, _Adoption] = {}  # folder name -> its adoption
        self._next_scan = 0.0

    def pump(self) -> None:
        now = time.monotonic()
        if now >= self._next_scan:
            self._next_scan = now + SCAN_EVERY_S
            self._scan()
        for adoption in self._adopted.values():
            if not adoption.figures.delivered:
                adoption.pump()

    def waitables(self) -> list[Any]:
        return [ref for a in self._adopted.values() if not a.figures.delivered
                for stream in all_streams(a.lanes) for ref in stream.waitables()]

    def settled(self) -> bool:
        """Every folder found so far is in every lane (looked for again if the last look is 0.25 s old: a
        producer may have died just before finish())."""
        if time.monotonic() > self._next_scan - SCAN_EVERY_S + 0.25:
            self._next_scan = time.monotonic() + SCAN_EVERY_S
            self._scan()
        return all(a.settled() for a in self._adopted.values())

    def _scan(self) -> None:
        try:
            names = sorted(os.listdir(self._directory))
        except OSError:  # no producer spooled yet
            return
        for name in names:
            if name not in self._adopted:
                self._try_adopt(name)

    def _try_adopt(self, name: str) -> None:
        folder = os.path.join(self._directory, name)
        early = read_mark(folder)
        if early is not None and is_judge(early["sender"]) and early["sender"] in self._actors:
            return  # a judge of this process's: its lane actor takes its folder back itself (one without: a replay
            # --to another tracker delivers it like a dead producer's)
        done = _delivered(folder)
        if done is not None:  # delivered by an earlier process of this run: its figures only
            self._adopted[name] = _Adoption(folder, None, done, {})
            if self._on_gone is not None:
                self._on_gone(done.sender, [])
            return
        try:
            spool = Spool(folder, max_bytes=2**62)  # never evicts: it only shrinks
        except ConfigError:  # locked: its producer is alive
            return
        except OSError as exc:
            log.warning("tracklane: producer spool %s cannot be opened (%s); left as it is", folder, exc)
            return
        mark = read_mark(folder)
        if mark is None:
            spool.close()
            if time.time() - _mtime(folder) > _UNMARKED_AFTER_S:
                shutil.rmtree(folder, ignore_errors=True)
            return
        tally = read_tally(folder)
        entries = spool.entries()
        figures = Adopted(name=mark["name"], sender=mark["sender"], batches=len(entries), logged=tally.puts,
                          dropped=tally.dropped, unshipped=tally.unshipped(spool.last_seq))
        lanes = {lane: open_lane(lane, actor, self._settings, reload=SpoolReloader(spool), sender=mark["sender"])
                 for lane, actor in self._actors.items()}
        self._adopted[name] = _Adoption(folder, spool, figures, lanes, self._others)
        if self._on_gone is not None:
            self._on_gone(mark["sender"], entries)
        if figures.batches or figures.unshipped or tally.unspooled:
            log.warning("tracklane: producer %s is gone; rank 0 delivers its %d spooled batch(es) where they are "
                        "missing (%d of its calls never reached its spool)", mark["sender"], figures.batches,
                        figures.unshipped)

    def close(self) -> None:
        """The run is finishing, its trackers closed: the folders of what they all hold go; the rest stay for a
        resume or ``tracklane replay``."""
        for adoption in self._adopted.values():
            if not adoption.figures.delivered and adoption.handed_everywhere():
                adoption.forget()
            if adoption.figures.delivered:
                shutil.rmtree(adoption.folder, ignore_errors=True)
            elif adoption.spool is not None:
                adoption.spool.close()

    def merged(self, reports: dict[str, ProducerReport]) -> dict[str, ProducerReport]:
        """The hub's reports, with what each dead producer's spool and tally say (exact where the hub lags)."""
        out = dict(reports)
        for adoption in self._adopted.values():
            f = adoption.figures
            if not f.batches and not f.unshipped and not any(f.lost.values()):
                continue  # it closed with everything delivered, or never shipped
            behind = sorted(n for n, lane in adoption.lanes.items()
                            if not lane_dead(lane) and not lane_settled(lane, adoption.last))
            base = out.get(f.sender) or ProducerReport(name=f.name, sender=f.sender)
            out[f.sender] = dataclasses.replace(
                base, logged=max(base.logged, f.logged), unshipped=f.unshipped, closed=False, died=True,
                shipped=max(base.shipped, f.logged - f.unshipped - f.dropped), redelivered_batches=f.batches,
                dropped=max(base.dropped, f.dropped), lost_by_lane=dict(f.lost),
                lanes_behind=behind)
        return out


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
