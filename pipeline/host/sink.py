"""The one small contract every tracker implements, and the optional capabilities some have.

A sink is a plain class, one per tracker, one file each, registered by name in
``pipeline/host/registry.py``. The same object runs in-process (``log_async: false``) and inside a
lane's Ray actor (``log_async: true``), always behind a ``SinkHost`` (sink_host.py):

    settings = SinkClass.resolve(run, env, trainer)   # trainer side, once: env read at the edge
    sink = SinkClass(run, settings)
    resume = sink.open(None)      # create the tracker run, log hyper-parameters once;
                                  # returns what is needed to re-attach (e.g. a run id)
    sink.write(records)           # any number of times, records in step order; each run of one
                                  # kind goes to its hook: write_metrics, write_generations,
                                  # write_trajectories, write_histogram, write_text, write_image,
                                  # write_artifact (the base's hooks count the kind unsupported)
    sink.flush()
    sink.close(exit_code)         # end the tracker run (FINISHED / FAILED, exit code ...)

After an actor restart the sink is built again and ``open(resume)`` re-attaches to
the same tracker run without logging the hyper-parameters a second time.

A sink with more to offer implements one of the ``typing.Protocol``s below as well (torchtitan's
checkpoint storage does the same); the host asks ``isinstance`` once and uses it when it is there:

    BatchPositions   begin_batch(sender, seq, records)   rows keyed by their place in a lane's batch
    LaggingStore     written() / stored(point)           a store that lands in the background (wandb-core)
    Undoable         mark(records) / rollback(mark)      a partial write undone by the next actor
    CapturedOutput   capture_output() / take_output()    printed lines sent to the trainer's terminal
    Judging          judge_into(emitter) / judged()      computes from what it receives and sends the result into every
                                                         tracker as a sender of its own (reduce, health)
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, cast, runtime_checkable

from tracklane.core.acks import SinkCounts
from tracklane.core.errors import MissingExtraError
from tracklane.core.records import (
    Alert,
    Artifact,
    Generations,
    Histogram,
    Image,
    Metrics,
    Record,
    Reduction,
    RunSpec,
    Text,
    Trace,
    Trajectories,
)

log = logging.getLogger("tracklane")


class Sink:
    """The narrow base: open, write (each record kind to its hook), flush, close. Subclasses override the hooks
    their tracker stores; a kind whose hook is not overridden is counted unsupported."""

    name: ClassVar[str] = ""
    sdk_module: ClassVar[str | None] = None
    """Top-level module of the tracker SDK, checked before anything starts."""
    extra: ClassVar[str | None] = None
    """The pip extra that installs the SDK: ``pip install 'tracklane[<extra>]'``."""
    reads_packed_metrics: ClassVar[bool] = False
    """In a lane, its metrics records' ``values`` may be ``PackedValues`` (core/packed_values.py): a Mapping whose
    dict is built only if read. The file tracker renders verl's line from the packed numbers instead."""
    writes_verl_lines: ClassVar[bool] = False
    """It writes each ``log()`` call's dict as verl's FileLogger writes it: the converter renders those bytes from the
    caller's own dict (``Metrics.verl_data``: strings and nested values too, which no other tracker keeps)."""
    judges: ClassVar[bool] = False
    """No tracker but a judge (``Judging``): it takes the step metrics (and rank 0's notices), never samples, media or
    artifacts, and what it computes it emits into the trackers as a sender of its own."""
    reduces: ClassVar[bool] = False
    """The run's reducer (a judge): ``log(..., reduce=)`` values and rank 0's notices (``Reduction`` records) go to
    it alone; a run without one refuses the values and leaves the notices out."""
    takes_pieces: ClassVar[bool] = False
    """It adds up a step's samples (rollouts, generations) logged in several records of one key: a dump too big to
    ship at once reaches it a chunk at a time. Trackers that store one document per key and step get it whole."""

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        """Settings from the environment and ``config.trainer``, read once on the trainer side.

        The result must hold only plain values and no secret: it is sent to the lane actor with
        msgpack, and Ray keeps it to restart the actor. A sink reads its API key in ``open()``.
        """
        return {}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        self.run = run
        self.settings = dict(settings)
        self.counts = SinkCounts()
        """What this tracker did not store; the host may hand in the counts of an earlier actor."""
        self._hooks: dict[str, Callable[[Any], None]] = {
            Metrics.kind: self.write_metrics, Generations.kind: self.write_generations,
            Trajectories.kind: self.write_trajectories, Histogram.kind: self.write_histogram,
            Text.kind: self.write_text, Alert.kind: self.write_alert, Image.kind: self.write_image,
            Artifact.kind: self.write_artifact, Trace.kind: self.write_traces,
            Reduction.kind: _not_a_trackers,  # the reduce lane's (core/reduction.py): a tracker never stores them
        }

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        return {}

    def write(self, records: Sequence[Record]) -> None:
        """Hand each run of consecutive records of one kind to its hook, keeping their order."""
        start = 0
        for index in range(1, len(records) + 1):
            if index == len(records) or records[index].kind != records[start].kind:
                kind, run = records[start].kind, records[start:index]
                if kind == Artifact.kind and type(self).write_artifact is not Sink.write_artifact:
                    run = self._existing_files(run)  # type: ignore[arg-type]
                if run:
                    self._hooks[kind](run)
                start = index

    # -- the hooks: a tracker overrides what it stores ------------------------------------
    def write_metrics(self, records: Sequence[Metrics]) -> None:
        self._unsupported(Metrics.kind, len(records))

    def write_generations(self, records: Sequence[Generations]) -> None:
        self._unsupported(Generations.kind, len(records))

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._unsupported(Trajectories.kind, len(records))

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        self._unsupported(Histogram.kind, len(records))

    def write_text(self, records: Sequence[Text]) -> None:
        self._unsupported(Text.kind, len(records))

    def write_alert(self, records: Sequence[Alert]) -> None:
        """A rule that fired: as the text ``alert/<rule>``. A tracker with an alert mechanism of its own uses it too."""
        self.write_text(cast("Sequence[Text]", records))  # an Alert reads as a Text (records.py)

    def write_image(self, records: Sequence[Image]) -> None:
        self._unsupported(Image.kind, len(records))

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        self._unsupported(Artifact.kind, len(records))

    def write_traces(self, records: Sequence[Trace]) -> None:
        self._unsupported(Trace.kind, len(records))

    def _unsupported(self, kind: str, n: int) -> None:
        first = kind not in self.counts.unsupported
        self.counts.add(self.counts.unsupported, kind, n)
        if first:
            log.warning("tracklane: the %s backend does not store %s records; skipping them (counted)", self.name, kind)

    def _existing_files(self, records: Sequence[Artifact]) -> list[Artifact]:
        """Artifacts whose file is still there; the others are skipped and counted (retrying cannot
        help, and failing the write would fail the whole batch around them)."""
        kept = []
        for record in records:
            if os.path.exists(record.path):
                kept.append(record)
                continue
            self.counts.artifacts_missing += 1
            log.warning("tracklane: %s: artifact %r (%s) not found at %s; skipped (counted)",
                        self.name, record.name, record.type, record.path)
        return kept

    def flush(self) -> None:
        """Make everything written so far stored in the tracker (its own buffers handed on): the lane
        acknowledges a batch only after this returned."""

    def close(self, exit_code: int) -> None:
        pass

    @classmethod
    def is_outage(cls, exc: BaseException) -> bool:
        """True if ``exc`` says the tracker cannot be reached (retry later, count nothing) rather than
        that it refused these records (count them failed). The default: a connection or timeout error
        anywhere in the exception's chain."""
        return any(isinstance(e, (ConnectionError, TimeoutError)) for e in exception_chain(exc))

    def where(self) -> str:
        """One line saying where this sink wrote, for the end-of-run summary."""
        return self.name


@runtime_checkable
class BatchPositions(Protocol):
    def begin_batch(self, sender: str, seq: int, records: Sequence[Record]) -> None:
        """Batch ``seq`` of ``sender`` (the trainer "", a producer) is about to be written: ``records`` is
        the whole batch, in its order, before a lane's ``only`` filter (positions stay the same when it is
        sent again). Not called on the synchronous path."""


@runtime_checkable
class LaggingStore(Protocol):
    """A tracker whose store lands in the background: ``flush()`` returning does not make a write stored."""

    def written(self) -> Any:
        """A point standing for everything handed to the tracker so far, to ask ``stored`` about later
        (None: already stored)."""

    def stored(self, point: Any) -> bool:
        """Whether the tracker's own store now holds everything handed to it up to ``point`` (a value
        ``written()`` returned). After a clean ``close()`` everything is."""


@runtime_checkable
class Undoable(Protocol):
    """A tracker whose partial write can be undone, so a batch an actor died in is handed exactly once."""

    def mark(self, records: Sequence[Record]) -> dict[str, Any] | None:
        """Where the tracker stands before ``records`` are written (plain values), or None if this write
        cannot be undone. Saved with the lane's state before the write."""

    def rollback(self, mark: Mapping[str, Any]) -> None:
        """Undo whatever was written after ``mark`` (the actor died before acknowledging it); called
        before ``open()`` by the actor that takes over."""


@runtime_checkable
class CapturedOutput(Protocol):
    """A sink that prints (the console): in a lane actor its lines go to the trainer's terminal instead."""

    def capture_output(self) -> None:
        """Keep what this sink would print for ``take_output()`` instead (the lane actor sends it to the
        trainer, whose stdout is the user's; the actor's own reaches it late, through Ray, prefixed)."""

    def take_output(self) -> str:
        """The text kept since the last call (whole lines), and forget it."""


def _not_a_trackers(records: Sequence[Record]) -> None:
    pass


class Emitter(Protocol):
    """How a judge sends what it computed: into every tracker of the run, as a sender of its own (in a lane actor,
    a producer with its own spool, shipping/judge_emitter.py; in-process, straight into the other sinks)."""

    def emit(self, records: Sequence[Record]) -> None:
        """Send ``records`` (each on its own step and keys) into every tracker but the judges that get none."""

    def keep(self) -> None:
        """Block until everything emitted so far is on disk (or counted as not spooled): called before a judge
        saves a state that says it was emitted, so a restarted judge neither loses nor repeats it."""


@runtime_checkable
class Judging(Protocol):
    """A sink that is no tracker: it judges what it receives (the reducer, the RL health rules) and emits."""

    def judge_into(self, emitter: Emitter) -> None:
        """Where to emit, given before ``open()``."""

    def judged(self) -> dict[str, Any]:
        """Its figures for the run's report (plain values): what the report at ``finish()`` says of it."""


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during (SDKs wrap the network's errors in their own)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def import_sdk(cls: Any, module: str | None = None) -> Any:
    """Import the tracker SDK inside a sink (or a migrate source: the same ``name``, ``sdk_module`` and ``extra``),
    translating ImportError to ``MissingExtraError``."""
    module = module or cls.sdk_module
    assert module is not None, f"{cls.__name__} names no SDK module"
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(cls.name, module, cls.extra or cls.name) from exc
