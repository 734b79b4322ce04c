"""The SwanLab sink: one SwanLab run per tracklane run, started the way verl starts it.

Written against swanlab 0.10.3, where ``swanlab.init`` returns a ``Run`` object that
is logged to and finished directly. SwanLab allows one active run per process.

Rich records (swanlab has no table or histogram type; media land under ``<run>/media/<kind>/``):

    generations   a ``swanlab.echarts.Table`` per step (media/echarts/), headers GENERATION_COLUMNS
    trajectories  the same, headers TRAJECTORY_COLUMNS (messages, tool calls, rewards, meta as JSON)
    histogram     an ``echarts.Bar`` of 30 bin counts of the finite values (x labels: left bin edges),
                  and scalars <name>/mean, /std (population), /min, /max, /count (finite values; only
                  /count, 0, when there is none)
    text          ``swanlab.Text`` (media/text/)
    alert         the text ``alert/<rule>`` (SwanLab's notifications are webhook plugins, nothing in the run)
    image         ``swanlab.Image`` of the decoded PNG, which swanlab encodes again as PNG (media/image/)
    artifact      a copy under <run>/files/artifacts/<type>/<name>/step_<N>/ registered with
                  ``run.save`` (which itself only links to the source: the trainer may delete it)

Table cells that are not finite floats (a NaN score) are written as the strings "NaN", "Infinity",
"-Infinity": swanlab's JSON writer would turn them into null. Records of one key at one step in one
batch become one log call; a step with no samples logs nothing. Metrics go a log call a record, as verl
logs them: swanlab keeps the first value of a key at a step (verl's store is the oracle:
tests/e2e/test_verl_oracle_trackers.py).

Two things about swanlab 0.10.3's run store (``run-<id>.swanlab``), written by ``DataStoreWriter``
(swanlab/sdk/internal/core_python/store) through an 8 KiB Python file buffer, with no lock:

- Its hardware monitor is off. The monitor's timer thread writes its records into the same store
  as the consumer thread that writes what we log; two unsynchronised writers interleave one record's
  chunk header with another's data, and the store reads "bad checksum" from there on.
- ``flush()`` makes what was logged so far readable by another process even if this one is then
  SIGKILLed: it waits until swanlab's consumer thread has handed our records to the store (seen
  through a swanlab ``Callback``) and then flushes the writer's buffer to the OS (no fsync).

A run folder whose store has no start record is one swanlab's own reader refuses (``DataStoreReader``:
"header is 0 bytes", and ``swanlab sync`` with it). ``swanlab.init`` creates the store empty and its first
bytes sit in that buffer: a kill before the first flush, any time until the first batch, left such a folder
(measured: every kill from the store's creation to the first ``flush()``, 40 of 52 moments of an open). So
the store is flushed as soon as swanlab reports the run started (``on_run_initialized``), which leaves only
the few folder creations in between (4-8 ms here), and ``open()`` sets aside what a kill there left: a
folder of this run id with no start record on disk is renamed ``.<name>.unstarted`` (it holds no logged
data; hidden from ``run-*``), before swanlab makes the new one.
"""

from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracklane.core.errors import SinkError
from tracklane.core.records import Artifact, Generations, Histogram, Image, Metrics, Record, RunSpec, Text, Trajectories
from tracklane.host.sink import Sink, import_sdk
from tracklane.workers.sinks import media
from tracklane.workers.sinks.steps import R, merged_values, records_by_step

log = logging.getLogger("tracklane")

# verl's defaults (verl/utils/tracking.py); "cloud" is SwanLab's old name for "online".
DEFAULT_MODE = "cloud"
DEFAULT_LOGDIR = "swanlog"
_ONLINE = ("cloud", "online")
# flush() gives up waiting for swanlab's consumer after this long without progress (it hands records
# to the store at least every 0.5 s of idleness or every 100 records, so a stall means it dropped some).
FLUSH_STALL_S = 5.0
# swanlab's consumer hands records to the store after 0.5 s without a new one; a lane flushes after
# every batch, so it would wait that long each time. Shortened on our runs (a private attribute).
CONSUMER_IDLE_S = 0.02


class SwanlabSink(Sink):
    """Logs metrics to SwanLab; hyper-parameters go to the run config."""

    name = "swanlab"
    sdk_module = "swanlab"
    extra = "swanlab"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        """Mode and log folder from the same variables verl reads. ``SWANLAB_API_KEY`` is not among
        them: settings travel as Ray actor arguments, so the key is read in ``open()`` from the
        environment of the process that logs in (the actor inherits it from Ray's workers)."""
        return {
            "mode": env.get("SWANLAB_MODE") or DEFAULT_MODE,
            "logdir": os.path.abspath(env.get("SWANLAB_LOG_DIR") or DEFAULT_LOGDIR),
        }

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._run: Any = None  # swanlab Run, None until open() and after close()
        self._swanlab: Any = None  # the swanlab module once open
        self._where = f"swanlab: {self.settings.get('mode')} run (not started)"
        self._handed = _HandedOver()

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        swanlab = self._swanlab = import_sdk(type(self))
        run_id = (resume or {}).get("id") or self.run.run_id or None
        self._handed = _HandedOver()  # counts belong to one swanlab run
        if run_id and self.settings["mode"] != "disabled":
            _set_aside_unstarted(Path(self.settings["logdir"]), run_id)
        try:
            self._run = swanlab.init(
                project=self.run.project,
                experiment_name=self.run.experiment,
                # On resume the same config goes again: every init rewrites the run's config
                # snapshot (an empty one if none is given, which would replace the real one on
                # upload), so identical content keeps it intact instead of duplicating it.
                config={"FRAMEWORK": "tracklane", **self.run.params},
                logdir=self.settings["logdir"],
                mode=self.settings["mode"],
                # "allow": re-attach when a run with this id exists (online), else create it.
                id=run_id,
                resume="allow" if run_id else None,
                settings=self._sdk_settings(swanlab),
                callbacks=[_handover_callback(swanlab, self._handed)],
            )
        except Exception as exc:  # translated at the boundary; the cause is kept
            raise SinkError(f"swanlab.init failed: {exc}") from exc
        _shorten_consumer_wait(self._run)
        self._where = _describe(self._run, self.settings["logdir"])
        return {"id": self._run.id}

    def _sdk_settings(self, swanlab: Any) -> Any:
        # Never prompt for a login (a lane actor has no terminal); the key is only needed
        # to log in to the cloud, so offline and local runs never receive it. No hardware monitor:
        # its thread would write into the run store beside the consumer, unlocked (module docstring).
        common = {"interactive": False, "probe": swanlab.Settings.Probe(monitor=False)}
        api_key = os.environ.get("SWANLAB_API_KEY")
        if api_key and self.settings["mode"] in _ONLINE:
            return swanlab.Settings(**common, api_key=api_key)
        return swanlab.Settings(**common)

    def _log(self, values: dict[str, Any], step: int) -> None:
        """One ``run.log`` call, counted so that ``flush()`` knows how many records to wait for."""
        self._handed.logged(_records_of(values))
        self._run.log(values, step=step)

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        # A log call a record, as verl logs each call: swanlab keeps a key's first value at a step and skips a later
        # one ("duplicate or too old"). Merged, records of one step in one batch stored the later value instead.
        for record in self._live(records):  # swanlab reports its own logging errors, never raises
            self._log(merged_values([record]), record.step)

    def write_generations(self, records: Sequence[Generations]) -> None:
        self._log_tables(records, media.GENERATION_COLUMNS, media.generation_rows)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._log_tables(records, media.TRAJECTORY_COLUMNS, media.trajectory_rows)

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        for step, group in records_by_step(self._live(records)):
            values: dict[str, Any] = {}
            for record in group:
                figures = record.summary()
                values.update({f"{record.name}/{stat}": value for stat, value in media.histogram_stats(figures).items()})
                if figures.count:
                    bar = self._swanlab.echarts.Bar()
                    bar.add_xaxis([f"{edge:.6g}" for edge in figures.bin_edges[:-1]])
                    bar.add_yaxis("count", figures.counts)
                    values[record.name] = bar
            self._log(values, step)

    def write_text(self, records: Sequence[Text]) -> None:
        for step, group in records_by_step(self._live(records)):
            self._log({record.name: self._swanlab.Text(record.text) for record in group}, step)

    def write_image(self, records: Sequence[Image]) -> None:
        from PIL import Image as PILImage  # installed with swanlab

        for step, group in records_by_step(self._live(records)):
            self._log({record.name: self._swanlab.Image(PILImage.open(io.BytesIO(record.png))) for record in group}, step)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        self._live(records)
        files = Path(self._run.dir) / "files" if self._run.mode != "disabled" else None
        for record in records:
            if files is None:
                continue
            folder = files / "artifacts" / media.safe_name(record.type) / media.safe_name(record.name) / f"step_{record.step}"
            copy = folder / os.path.basename(os.path.normpath(record.path))
            if os.path.isdir(record.path):
                shutil.copytree(record.path, copy, dirs_exist_ok=True)
                copies = sorted(path for path in copy.rglob("*") if path.is_file())
            else:
                folder.mkdir(parents=True, exist_ok=True)
                copies = [Path(shutil.copy2(record.path, copy))]
            for path in copies:  # one file per call: run.save takes a glob and refuses more than 100 matches
                self._run.save(glob.escape(str(path)), base_path=str(files), policy="now")

    def _log_tables(self, records: Sequence[Any], columns: list[str], rows_of: Callable[[Any], list[list[Any]]]) -> None:
        """One echarts Table per key and step, holding that step's rows (a NaN cell as "NaN": swanlab's JSON: null)."""
        for step, rows in media.tables_by_step(self._live(records), rows_of, media.named_nonfinite):
            values = {key: self._swanlab.echarts.Table().add(columns, key_rows) for key, key_rows in rows.items()}
            if values:
                self._log(values, step)

    def _live(self, records: Sequence[R]) -> Sequence[R]:
        if self._run is None:
            raise SinkError("swanlab sink written to before open() or after close()")
        return records

    def flush(self) -> None:
        """Everything logged so far into the store file, in the OS's hands (readable after a SIGKILL).

        ``run.save`` registrations (artifacts) are not reported by swanlab's callbacks and are not
        waited for; the artifact copies themselves are already on disk."""
        run = self._run
        if run is None or not run.alive or run.mode == "disabled":
            return
        missing = self._handed.wait(FLUSH_STALL_S)
        if missing:
            log.warning("tracklane: swanlab: %d logged value(s) not handed to the store after %.0f s without "
                        "progress (dropped by swanlab?); flushing the rest", missing, FLUSH_STALL_S)
        _store_writer(run).ensure_flushed()

    # -- exactly once: the run store is append-only; cut it back to the last batch handed
    def mark(self, records: Sequence[Record]) -> dict[str, Any] | None:
        """The store file and its size now (every earlier batch was flushed before its acknowledgement)."""
        if self._run is None or not self._run.alive:
            return None
        path = getattr(getattr(_store_writer(self._run), "_fp", None), "name", None)
        if not isinstance(path, str) or not os.path.exists(path):
            return None
        return {"store": path, "size": os.path.getsize(path)}

    def rollback(self, mark: Mapping[str, Any]) -> None:
        path, size = str(mark["store"]), int(mark["size"])
        if os.path.exists(path) and os.path.getsize(path) > size:
            os.truncate(path, size)

    def close(self, exit_code: int) -> None:
        run, self._run = self._run, None
        if run is None or not run.alive:  # closed already, or finished by swanlab's atexit hook
            return
        if exit_code == 0:
            run.finish(state="success")
        else:
            run.finish(state="crashed", error=f"trainer exited with code {exit_code}")

    def where(self) -> str:
        return self._where


def _shorten_consumer_wait(run: Any) -> None:
    """Make swanlab's consumer hand records over after CONSUMER_IDLE_S of quiet (if this swanlab has one)."""
    consumer = getattr(getattr(run, "_components", None), "consumer", None)
    if consumer is not None and isinstance(getattr(consumer, "_flush_timeout", None), (int, float)):
        consumer._flush_timeout = CONSUMER_IDLE_S


class _HandedOver:
    """Values logged to swanlab against records its consumer thread has handed to the run store.

    swanlab's ``run.log`` only queues an event; a consumer thread batches the records and writes
    them to the store later, then reports each batch to the run's callbacks."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._logged = 0
        self._stored = 0

    def logged(self, n: int) -> None:
        with self._changed:
            self._logged += n

    def stored(self, n: int) -> None:
        with self._changed:
            self._stored += n
            self._changed.notify_all()

    def wait(self, stall_s: float) -> int:
        """Block until every value logged so far is stored; returns how many were still missing
        when ``stall_s`` passed without progress (0: all stored). Missing ones are then written
        off, so that later calls do not wait for them again."""
        with self._changed:
            target = self._logged
            while self._stored < target:
                before = self._stored
                self._changed.wait(stall_s)
                if self._stored == before:
                    missing = target - self._stored
                    self._stored = target
                    return missing
            return 0


def _handover_callback(swanlab: Any, handed: _HandedOver) -> Any:
    """A swanlab Callback counting the scalar and media records handed to the store (one per logged value)."""

    class HandOver(swanlab.Callback):
        @property
        def name(self) -> str:
            return "tracklane-store-handover"

        def on_run_initialized(self, *args: Any, **kwargs: Any) -> None:
            # The store holds its start record, still in the writer's buffer: on disk now (module docstring).
            writer = getattr(getattr(swanlab.get_run(), "_core", None), "_store", None)
            if writer is not None and hasattr(writer, "ensure_flushed"):
                writer.ensure_flushed()

        def on_scalar_flush(self, scalar_records: list[Any], *args: Any, **kwargs: Any) -> None:
            handed.stored(len(scalar_records))

        def on_media_flush(self, media_records: list[Any], *args: Any, **kwargs: Any) -> None:
            handed.stored(len(media_records))

    return HandOver()


def _set_aside_unstarted(logdir: Path, run_id: str) -> None:
    """Rename each run folder of ``run_id`` under ``logdir`` whose store holds no start record (module docstring)."""
    name = re.compile(rf"run-\d{{8}}_\d{{6}}-{re.escape(run_id)}")  # swanlab's run-<YYYYmmdd_HHMMSS>-<id>
    for folder in logdir.glob(f"run-*-{glob.escape(run_id)}"):
        if name.fullmatch(folder.name) and folder.is_dir() and not _started(folder / f"run-{run_id}.swanlab"):
            aside = folder.with_name(f".{folder.name}.unstarted")
            try:
                os.rename(folder, aside)
            except OSError as exc:  # e.g. a folder of that name set aside before: leave this one, open anyway
                log.warning("tracklane: swanlab: could not set aside %s, which has no start record: %s", folder, exc)
                continue
            log.warning("tracklane: swanlab: %s has no start record on disk (its process was killed while it "
                        "was created); set aside as %s", folder, aside.name)


def _started(store: Path) -> bool:
    """Whether swanlab's own reader finds the start record in a run store."""
    from google.protobuf.message import DecodeError
    from swanlab.exceptions import DataStoreError
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader, record = DataStoreReader(), Record()
    try:
        reader.open(store)
        first = reader.scan()
        if first is None:
            return False
        record.ParseFromString(first)
        return record.HasField("start")
    except (OSError, AssertionError, DataStoreError, DecodeError):  # missing, shorter than its header, damaged
        return False
    finally:
        with contextlib.suppress(AssertionError):  # close() asserts that open() got as far as opening the file
            reader.close()


def _records_of(values: Mapping[str, Any]) -> int:
    """How many records swanlab hands to its store for one ``run.log(values)``: one a key as swanlab cleans it
    (``validate_key``: leading and trailing whitespace, "." and "/" trimmed). Two keys cleaned alike are one record
    (the later value), a key left empty none; counted as logged, they held ``flush()`` FLUSH_STALL_S and warned of
    values swanlab dropped (seen with "a" and "a." in one call)."""
    try:
        from swanlab.sdk.internal.run.fmt import validate_key
    except ImportError:  # another swanlab than 0.10.3: one record a key
        return len(values)
    names = set()
    for key in values:
        try:
            names.add(validate_key(key))
        except ValueError:  # swanlab drops it ("invalid or empty after sanitization")
            pass
    return len(names)


def _store_writer(run: Any) -> Any:
    """The run store's writer: swanlab 0.10.3 has no public flush, so this reaches into its Python
    core (``CorePython._store``, a ``DataStoreWriter`` whose ``ensure_flushed`` flushes the buffer)."""
    writer = getattr(getattr(run, "_core", None), "_store", None)
    if writer is None or not hasattr(writer, "ensure_flushed"):
        raise SinkError("swanlab: this version has no run-store writer to flush (written against 0.10.3)")
    return writer


def _describe(run: Any, logdir: str) -> str:
    """One line: where the run lives and the command that shows it."""
    if run.mode == "online":
        return f"swanlab: run {run.id} at {run.url}"
    if run.mode == "local":
        return f"swanlab: local run {run.id} in {run.dir}; view with `swanlab watch {logdir}`"
    if run.mode == "offline":
        return f"swanlab: offline run {run.id} in {run.dir}; upload with `swanlab sync {run.dir}`"
    return "swanlab: disabled, nothing recorded"
