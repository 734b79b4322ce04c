"""What flush() and finish() return: per-lane figures and what, if anything, was left behind."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tracklane.core import health_rules, reduction
from tracklane.core.acks import Ack


@dataclass(slots=True, kw_only=True)
class LaneReport:
    """One tracker's lane at the moment of the report."""

    name: str
    stored_seq: int = 0
    """Last batch the tracker's store holds."""
    unstored_batches: int = 0
    unstored_records: int = 0
    """Records shipped to this lane and not (yet) stored by its tracker."""
    dropped_records: int = 0
    """Records this lane dropped because its bound was hit, or because its actor died for good."""
    failed_records: int = 0
    """Records the tracker rejected after every retry (or that never reached an opened tracker)."""
    lag_s: float = 0.0
    """Age of the oldest batch not handed to the tracker yet."""
    lag_p50_s: float = 0.0
    lag_p99_s: float = 0.0
    """log() -> handed to the tracker, over the handed batches of small records (oldest record of each)."""
    bulk_lag_s: float = 0.0
    bulk_lag_p50_s: float = 0.0
    bulk_lag_p99_s: float = 0.0
    """The same for the bulk stream (rollouts, tables, media), which small records overtake."""
    unsupported: dict[str, int] = field(default_factory=dict)
    """Records of kinds this tracker cannot store (e.g. artifacts in TensorBoard), by kind."""
    artifacts_missing: int = 0
    """Artifacts skipped because their file was gone when the tracker got to them."""
    cuts: dict[str, int] = field(default_factory=dict)
    """Values this tracker's own limits cut or left out, by what: ``params_truncated`` (MLflow param
    values cut to 6000 characters), ``histogram_nonfinite`` (NaN/Inf histogram values wandb cannot bin)."""
    sampled_out: int = 0
    """Samples and trajectories this tracker did not get, by its ``record_limits`` (evenly spaced ones kept)."""
    restarts: int = 0
    """Times the lane's actor died and was re-attached."""
    outage_s: float = 0.0
    """How long the tracker has been down at the moment of the report (0: it answers)."""
    recovered_outages: int = 0
    """Outages the tracker came back from (it was down, then took batches again)."""
    outage_total_s: float = 0.0
    """Seconds the tracker was down over the run: the recovered outages and the current one."""
    retries: int = 0
    """Batches sent again because the tracker was down or an actor call failed."""
    down_s: float = 0.0
    down: str = ""
    """How long, and why in words, the tracker has been out of the lane's reach at the moment of the report ("": it
    takes batches): "not started after 95 s (pending: waiting for resource logging_node)", "restarting after 12 s
    (...)", "tracker down for 30 s: ...", "gave up: actor died: ..."."""
    started_s: float = 0.0
    """Seconds from the lane's start to its actor's first answer in this process (0: none yet): how long it took Ray
    to place it and its SDK to open the tracker."""
    first_stored_s: float = 0.0
    """Seconds from the lane's start (``Tracking()``) to its tracker's first stored batch in this process (0: none
    yet): how long a run's first points took to reach it (an actor waiting for resources, its SDK's import)."""
    gave_up: bool = False
    """The lane gave up on its actor (Ray reports it dead, or its calls kept failing): what its tracker lacks is
    kept in the spool (``unstored_records``) for ``tracklane replay`` and the next resume."""
    error: str | None = None
    """What is wrong now: the lane gave up, or its tracker is down or failing. None for a lane that recovered."""
    last_error: str | None = None
    last_error_at: float = 0.0
    """The last error seen and when (time.time(); 0: none), kept after the lane recovered."""
    where: str = ""
    busy_s: float = 0.0
    """Wall time the lane's host spent writing batches (this actor's life): how near its tracker's ceiling it runs."""
    cpu_s: float = 0.0
    """CPU time of the host's process (this actor's life; on the synchronous path, the trainer's)."""
    records_written: int = 0
    state_unsaved_since: float = 0.0
    """Since when (time.time(); 0: saved) the lane's acknowledgement state is only in its actor's memory because
    its disk refused it: the lane delivers on, but an actor restart meanwhile may apply a batch twice."""

    @property
    def complete(self) -> bool:
        return self.unstored_records == 0 and self.dropped_records == 0 and self.failed_records == 0

    def note_error(self, text: str) -> None:
        """Something is wrong now: the error, and the last error with its time."""
        self.error = self.last_error = text
        self.last_error_at = time.time()

    def take(self, ack: Ack) -> None:
        """Merge a sink host's answer: its counts are cumulative over the lane's life, so they replace ours; its
        error is what is wrong now (None: its last call went through), so it replaces ours too."""
        self.failed_records = ack.counts.failed_records
        self.unsupported = dict(ack.counts.unsupported)
        self.artifacts_missing = ack.counts.artifacts_missing
        self.cuts = dict(ack.counts.cuts)
        self.busy_s, self.cpu_s, self.records_written = ack.work.busy_s, ack.work.cpu_s, ack.work.records
        self.error = ack.error
        self.state_unsaved_since = ack.state_unsaved_since
        last, at = (ack.last_error, ack.last_error_at) if ack.last_error else (ack.error, time.time())
        if last and at >= self.last_error_at:
            self.last_error, self.last_error_at = last, at
        if ack.where:
            self.where = ack.where

    def line(self) -> str:
        text = (f"{self.name}: stored through batch {self.stored_seq}, {self.unstored_records} not stored, "
                f"{self.dropped_records} dropped, {self.failed_records} failed, lag p50 {self.lag_p50_s * 1e3:.0f} ms "
                f"p99 {self.lag_p99_s * 1e3:.0f} ms")
        if self.bulk_lag_p99_s:
            text += f" (bulk p50 {self.bulk_lag_p50_s * 1e3:.0f} ms p99 {self.bulk_lag_p99_s * 1e3:.0f} ms)"
        if self.unsupported:
            text += ", not storable here: " + ", ".join(f"{n} {kind}" for kind, n in self.unsupported.items())
        if self.artifacts_missing:
            text += f", {self.artifacts_missing} artifact(s) skipped: file missing"
        if self.sampled_out:
            text += f", {self.sampled_out} samples left out by its record_limits"
        if self.cuts:
            text += ", cut by the tracker: " + ", ".join(f"{n} {what}" for what, n in self.cuts.items())
        if self.records_written:
            text += (f", busy {self.busy_s:.1f} s, CPU {self.cpu_s:.1f} s "
                     f"({1e3 * self.cpu_s / self.records_written:.2f} s per 1,000 records)")
        if self.restarts:
            text += f", {self.restarts} restart(s)"
        if self.recovered_outages:
            text += f", recovered from {self.recovered_outages} outage(s), {self.outage_total_s:.0f} s down in all"
        if self.retries:
            text += f", {self.retries} batch(es) sent again"
        if self.down and not self.gave_up:
            text += f", {self.down}"
        if self.state_unsaved_since:
            since = time.strftime("%H:%M:%S", time.localtime(self.state_unsaved_since))
            text += f", acknowledgement state not saved since {since} (its disk)"
        if self.gave_up:
            text += f", GAVE UP: {self.error}"
        elif self.error:
            text += f", error: {self.error}"
        elif self.last_error:
            when = time.strftime("%H:%M:%S", time.localtime(self.last_error_at))
            text += f", recovered; last error at {when}: {self.last_error}"
        return text


@dataclass(slots=True, kw_only=True)
class ReductionReport:
    """The reduce judge (``trainer.async_log.reductions``), as it last told the producers' hub."""

    steps: int = 0
    """Steps reduced: one point per key each, in every tracker."""
    open_steps: int = 0
    """Steps still waiting for a producer (none after a finish that reached the reduce lane)."""
    late: int = 0
    """Values that came for a step already reduced: not in its points (counted, warned)."""
    conflicts: int = 0
    """Values whose op differed from the op of the key's first value at that step: not in its points."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Producer sender id -> the first step reduced without it (it died or closed before)."""

    @classmethod
    def of(cls, figures: dict[str, Any]) -> ReductionReport:
        return cls(steps=int(figures.get("emitted", 0)), open_steps=int(figures.get("open", 0)),
                   late=int(figures.get("late", 0)), conflicts=int(figures.get("conflicts", 0)),
                   left_out={str(k): int(v) for k, v in (figures.get("left_out") or {}).items()})

    @property
    def complete(self) -> bool:
        return self.late == self.conflicts == 0

    def line(self) -> str:
        text = (f"reductions: {self.steps} steps reduced, {self.open_steps} still open, {self.late} late values, "
                f"{self.conflicts} with another op (neither in any point)")
        if self.left_out:
            text += "; " + ", ".join(f"{sender} left out from step {step}" for sender, step in self.left_out.items())
        return text


@dataclass(slots=True, kw_only=True)
class PipelineReport:
    """The whole pipeline: producer side plus every lane."""

    lanes: dict[str, LaneReport] = field(default_factory=dict)
    buffered_records: int = 0
    """Records still in the producer's buffer (never shipped)."""
    dropped_records: int = 0
    """Records the producer's buffer dropped (overflow, or logged after finish)."""
    skipped_values: int = 0
    """Metric values skipped because they were not numbers."""
    rejected_records: int = 0
    """Whole records skipped: not a mapping, a bad step, or a malformed rich record."""
    truncated_strings: int = 0
    """Strings cut to ``record_limits.max_chars``."""
    sampled_out: int = 0
    """Generations, trajectories or histogram values left out of every tracker by ``record_limits`` (beyond the
    most generous tracker's limits); what each tracker did not get: ``LaneReport.sampled_out``."""
    elapsed_s: float = 0.0
    timed_out: bool = False
    spool: SpoolReport | None = None
    """The durable spool, when it is on."""
    producers: dict[str, ProducerReport] = field(default_factory=dict)
    """Every producer (``Tracking.producer``) that logged, by sender id (one per producer and process)."""
    skipped_backends: dict[str, str] = field(default_factory=dict)
    """verl's platform backends named in the config that tracklane does not ship (name -> why): nothing went there,
    or to the stand-in the reason names."""
    reductions: ReductionReport | None = None
    """The reduce lane's figures, when ``trainer.async_log.reductions`` is on."""
    alerts: list[str] = field(default_factory=list)
    """The health rules that fired during the run, one line each (core/health_rules.py); they do not make the
    report incomplete: they judge the training, not the delivery."""
    spooled: dict[str, int] = field(default_factory=dict)
    """The synchronous path: records each tracker did not take after its retries (also counted failed in its
    lane), kept in ``spool`` for ``tracklane replay``."""

    def take_judged(self, judged: dict[str, dict[str, Any]], judges: Iterable[str]) -> None:
        """The figures the run's ``judges`` (their lanes) last told the hub (``judged``: lane -> figures)."""
        judges = set(judges)
        if reduction.LANE in judges:
            self.reductions = ReductionReport.of(judged.get(reduction.LANE, {}))
        self.alerts = list(judged.get(health_rules.LANE, {}).get("alerts", []))

    @property
    def complete(self) -> bool:
        """Nothing buffered, dropped, failed or not stored anywhere."""
        return (not self.timed_out and self.buffered_records == 0 and self.dropped_records == 0
                and self.rejected_records == 0 and all(lane.complete for lane in self.lanes.values())
                and (self.spool is None or self.spool.damaged == 0)
                and (self.reductions is None or self.reductions.complete)
                and all(producer.complete for producer in self.producers.values()))

    def summary(self) -> str:
        head = (f"tracklane: {'complete' if self.complete else 'INCOMPLETE'} in {self.elapsed_s:.2f} s; "
                f"{self.buffered_records} buffered, {self.dropped_records} dropped by the producer, "
                f"{self.skipped_values} non-numeric values skipped, {self.rejected_records} records rejected, "
                f"{self.truncated_strings} strings truncated, {self.sampled_out} samples left out")
        lines = [head, *(f"  {lane.line()}" for lane in self.lanes.values())]
        lines += [f"  {producer.line()}" for producer in self.producers.values()]
        lines += [f"  {name}: {why.partition(':')[0]}" for name, why in self.skipped_backends.items()]
        if self.reductions is not None:
            lines.append(f"  {self.reductions.line()}")
        lines += [f"  ALERT {alert}" for alert in self.alerts]
        if self.spool is not None:
            lines.append(f"  {self.spool.line()}")
            behind = {name: f"{name} {lane.unstored_records} records" + (f" ({lane.down})" if lane.down else "")
                      for name, lane in self.lanes.items() if lane.unstored_records}
            behind.update({name: f"{name} {n} records (not delivered by this process)"
                           for name, n in self.spool.held_for.items() if name not in behind})
            if behind:
                lines.append(f"  not delivered yet, kept in the spool: {', '.join(behind.values())}; deliver with: "
                             f"{self.spool.replay_command(list(behind))} (a resumed run with this run id delivers "
                             f"them too)")
            if self.spooled:
                kept = ", ".join(f"{name} {n}" for name, n in self.spooled.items())
                lines.append(f"  records the trackers did not take, kept in the spool ({kept}); deliver with: "
                             f"{self.spool.replay_command(list(self.spooled))}")
        return "\n".join(lines)


@dataclass(slots=True, kw_only=True)
class ProducerReport:
    """One producer in one process, as it last told the run's hub (it reports every 0.25 s and at each flush)."""

    name: str
    sender: str
    """Its sender id: the name and a random suffix per process."""
    logged: int = 0
    shipped: int = 0
    """Records handed to the lanes."""
    dropped: int = 0
    """Records its buffer or a lane dropped (each bound's overflow, a lane given up)."""
    rejected: int = 0
    unshipped: int = 0
    """Records it had logged but not shipped at its last report: lost if its process died."""
    closed: bool = False
    """It flushed and stopped before the run finished."""
    died: bool = False
    """Its process ended without closing it; rank 0 delivered what its spool held (``redelivered_batches``)."""
    redelivered_batches: int = 0
    """Batches of its spool rank 0 delivered after it died, to the lanes that lacked them."""
    lost_by_lane: dict[str, int] = field(default_factory=dict)
    """It died: per lane, records it shipped while its disk refused them (not in its spool) that the lane had not
    taken."""
    lanes_behind: list[str] = field(default_factory=list)
    """Lanes that had not been handed its last shipped batch when the run finished."""

    @property
    def complete(self) -> bool:
        return self.unshipped == 0 and self.dropped == 0 and self.rejected == 0 and not self.lanes_behind \
            and not any(self.lost_by_lane.values())

    def line(self) -> str:
        text = (f"producer {self.sender}: {self.logged} logged, {self.shipped} shipped, {self.dropped} dropped, "
                f"{self.rejected} rejected, {self.unshipped} not shipped")
        if self.died:
            text += f"; it died: {self.redelivered_batches} spooled batch(es) delivered by rank 0"
            lost = {lane: n for lane, n in self.lost_by_lane.items() if n}
            if lost:
                text += f", lost with it (not on its full disk): {', '.join(f'{k} {v}' for k, v in lost.items())}"
        if self.lanes_behind:
            text += f", not yet in: {', '.join(self.lanes_behind)}"
        return text


@dataclass(slots=True, kw_only=True)
class SpoolReport:
    """The spool at the moment of the report."""

    directory: str
    nbytes: int = 0
    batches: int = 0
    """Batches on disk (not yet stored by every lane's tracker, or kept for retention)."""
    evicted_records: int = 0
    """Records the disk bound (spool_max_bytes) deleted before every lane had them (also in the lanes' drops)."""
    damaged: int = 0
    """Frames or segments found corrupt or missing when the spool was reopened (each lost)."""
    torn_bytes: int = 0
    """Bytes of an interrupted last write cut off at reopening."""
    recovered_batches: int = 0
    """Batches an earlier process spooled that this one found and delivered where they were missing."""
    repeated_points: int = 0
    """Points a resumed run logged again at steps an earlier process of the run had logged (re-run after its
    checkpoint): left out, the first value kept (spool/logged_steps.py)."""
    repeated_steps: tuple[int, int] | None = None
    """The lowest and highest step of those points."""
    durability_off_since: float = 0.0
    """When a disk fault (full, read-only, failing, the folder removed) turned durability off, while it is still
    off (time.time(); 0: on). New batches then live in the lanes' memory only."""
    durability_outages: int = 0
    """Times durability went off over the run (it comes back on by itself once the disk takes a batch)."""
    durability_off_s: float = 0.0
    """Seconds durability was off over the run, the current outage included."""
    unspooled_batches: int = 0
    unspooled_records: int = 0
    """Batches (and their records) that were not on disk: shipped while durability was off, or removed with the
    spool's files before every tracker had them. A crash or an actor restart meanwhile could not bring them back."""
    disk_error: str | None = None
    """The last error the spool's disk gave."""
    held_for: dict[str, int] = field(default_factory=dict)
    """Trackers of the run this process does not deliver to (a replay ``--to`` others, a resume with fewer
    loggers), each with the records its store lacks: kept in the spool for it."""

    def line(self) -> str:
        text = f"spool {self.directory}: {self.batches} batches, {self.nbytes / 2**20:.1f} MiB on disk"
        if self.recovered_batches:
            text += f", {self.recovered_batches} recovered from the previous process"
        if self.repeated_points and self.repeated_steps:
            low, high = self.repeated_steps
            steps = f"step {low}" if low == high else f"steps {low}-{high}"
            text += (f", {self.repeated_points} points of {steps} re-logged after the resume left out (an earlier "
                     "process logged them)")
        if self.evicted_records:
            text += f", {self.evicted_records} records evicted by spool_max_bytes before delivery"
        if self.damaged or self.torn_bytes:
            text += f", {self.damaged} damaged frame(s) lost, {self.torn_bytes} torn byte(s) cut"
        if self.durability_off_since:
            since = time.strftime("%H:%M:%S", time.localtime(self.durability_off_since))
            text += f", durability OFF since {since} ({self.disk_error})"
        elif self.durability_outages:
            text += (f", durability was off {self.durability_outages} time(s), {self.durability_off_s:.1f} s in all, "
                     f"back on (last disk error: {self.disk_error})")
        if self.unspooled_batches:
            text += f", {self.unspooled_batches} batch(es) ({self.unspooled_records} records) not spooled"
        return text

    def replay_command(self, lanes: list[str]) -> str:
        return f"tracklane replay {self.directory} --to {','.join(lanes)}"


@dataclass(slots=True, kw_only=True, frozen=True)
class LaneInfo:
    """Where one lane runs, for tests, benchmarks and the curious (``Tracking.lanes()``)."""

    name: str
    pid: int
    """Process of the lane's sink host: its Ray actor, or the trainer itself on the synchronous path."""
    node_id: str
    """Ray node id of that process ("" outside Ray)."""
    unstored_bytes: int
    """Encoded bytes shipped to the lane and not stored by its tracker yet (0 on the synchronous path)."""
