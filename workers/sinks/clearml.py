"""The ClearML sink: one ClearML task per tracklane run, started the way verl starts it; offline unless a
server is configured.

Written against clearml 2.1.12 (paths below are in that package).

Offline or not (``resolve``): ``CLEARML_OFFLINE_MODE`` decides when it is set (ClearML's truth words: 1, true,
yes, on...). Otherwise the task is offline unless a server is configured: ``CLEARML_API_HOST``, an access key
or auth token in the environment, or a ClearML config file with credentials where ClearML looks for one
(``CLEARML_CONFIG_FILE``, else ``~/clearml.conf``, ``~/trains.conf``). Keys never enter the settings:
ClearML reads ``CLEARML_API_ACCESS_KEY`` / ``CLEARML_API_SECRET_KEY`` from the lane's environment itself.
Offline, ClearML writes a session folder ``<cache>/offline/<task id>/`` (``task.json``, ``metrics.jsonl``,
``log.jsonl``, ``data/``) and, at close, a zip of it beside it; ``<cache>`` is ``CLEARML_CACHE_DIR``, else
ClearML's ``$TMPDIR/clearml_cache``. ``CLEARML_CACHE_DIR`` and ``CLEARML_CONFIG_FILE`` are made absolute on the
trainer side and set again in the lane's process. ``clearml-task --import-offline-session <zip>`` uploads a
session later (that needs a server: offline it raises "Creating task in offline mode"). Every ``Task.init``
also records the task in ``$HOME/.clearml/.session.json`` (clearml/config/cache.py; no variable moves it).

``Task.init`` as verl calls it (project, experiment name, ``output_uri=False``, the config as the
"Hyperparameters" configuration object), and without what would intercept a lane actor: no stdout/stderr
capture, no argparse or framework hooks, no resource monitor, no repository or script detection (offline
it copied the running script and a pip requirement scan into task.json). One task per tracklane run
(``reuse_last_task_id=False``: verl's ``continue_last_task=True`` appends to the last task of the same
names); it is tagged ``tracklane.run_id:<id>`` so a resumed run (``RunSpec.resume``) finds it.

Metrics: ``Logger.report_scalar(title, series, value, iteration=step)``, the key split at its first "/" into
title and series as verl does ("actor/pg_loss" -> actor / pg_loss); a key without "/" (verl would crash)
is its own title and series ("loss" -> loss / loss; a later "loss/loss" would be the same graph line, so
it is skipped and counted: ``cuts["scalar_name_clash"]``). Records on a producer's own axis (``Metrics.axis``,
e.g. ``system/elapsed_s``) keep their step as the iteration, as in MLflow: their keys name their own graphs.
ClearML stores NaN and +-Inf as 0.0 (``MetricsEventAdapter.default_nan_value``; its server keeps no
non-finite number), so those values are skipped and counted (``cuts["scalar_nonfinite"]``) rather than
charted as a false 0. The records of a step in a batch are one report per key, the later finite value
(ClearML's server keeps one scalar per iteration, title and series: the last reported). The record's time
is not kept: ``report_scalar`` takes none and the event is stamped when it is reported (``ScalarEvent``,
backend_interface/metrics/events.py).

Rich records (offline files under ``data/<project>/<task>.<id>/``):

    generations   ``report_table`` per key and step, title/series from the key, header GENERATION_COLUMNS
    trajectories  the same, header TRAJECTORY_COLUMNS (messages, tool calls, rewards, meta as JSON text)
    histogram     ``report_histogram``: the 30 bin counts of the finite values at the bin centres, and
                  scalars <name>/mean, /std (population), /min, /max, /count (only /count, 0, when no value
                  is finite); non-finite values are counted (``cuts["histogram_nonfinite"]``)
    text          a ``.txt`` debug sample (``report_media``): name and step kept, the exact UTF-8 bytes
                  (``report_text`` would only append to the console log, without name or step)
    alert         the text ``alert/<rule>``, and the task tag ``tracklane.alert=<rule>``
    image         a ``.png`` debug sample of the PNG bytes as given (``report_media``: the same debug-image
                  event as ``report_image``, which takes pixels and re-encodes them as JPEG by default)
    artifact      ``task.upload_artifact("<type>/<name>/step_<N>", Path)``, waiting for the copy; a directory
                  is zipped by ClearML; metadata name, type, step

Tables go as lists of rows: a DataFrame goes through pandas' ``to_json``, which keeps 10 significant
digits (utilities/plotly_reporter.py ``create_plotly_table``). Non-finite cells are written "NaN", "Inf",
"-Inf", as ClearML writes them for a DataFrame. Debug samples keep every file (``max_history=-1``; ClearML
recycles file names after 100 per title/series by default).

ClearML quirks handled here, with the evidence:

- Its reporter runs in a forked child process on Linux (``development.report_use_subprocess``): a fork of
  a Ray worker, a flush that took 6 s offline, and a zombie child after ``close()``. Threads instead
  (``Task._report_subprocess_enabled``, no public switch): flush ~2 ms, nothing left after close.
- ``Task.init`` writes ``CLEARML_PROC_MASTER_ID=<pid>:<task>`` into the environment; a process that inherits
  it (a Ray worker of a trainer that used ClearML) gets a do-nothing ``StubObject`` from ``Task.init``.
  ``open`` drops a marker of another process and checks it got a real Task; ``close`` drops its own.
- ``Task.flush(wait_for_uploads=True)`` waits for the reporter thread to end one write cycle; a cycle
  already running (started by its 100-event threshold) ends without the events queued during it. A
  second call waits for a full cycle started after them.
- ``continue_last_task=<id>`` shifts every later iteration by the task's last iteration + 1; ``0`` with
  ``reuse_last_task_id=<id>`` re-attaches without a shift.
- Offline, status changes are not stored (``InterfaceBase._send`` returns at once offline) and an import
  always marks the task completed. So ``close`` also tags the task ``tracklane.exit_code=<n>``. Online,
  ``close()`` marks it completed and a failure is then marked with ``mark_failed(force=True)``;
  ``mark_completed()`` is never called: from the process that runs the task it ends that process online.
- Debug sample files are numbered per title/series from 0 in each process (``UploadEvent._metric_counters``):
  a task re-attached offline would overwrite the first files. ``open`` continues the numbers from the
  session's ``metrics.jsonl`` (online this is not done).
- While a task is open ClearML holds SIGINT, SIGTERM, SIGSEGV, SIGABRT, SIGILL, SIGFPE, SIGQUIT and
  ``sys.excepthook`` (utilities/process/exit_hooks.py; on SIGTERM it runs its whole shutdown, flush and
  zip, before the previous handler); ``close`` gives them back. What stays for the process: ``sys.exit``
  wrapped, ``os.register_at_fork`` callbacks (a fork while a task is open attaches the child to it),
  and ``Task._report_subprocess_enabled`` off for any later ClearML task of the process.
- Offline, ``task.json`` is rewritten in place at every change of the task (``_save_data_to_offline_dir``:
  ``open(..., "wt")``, then ``json.dump``; four times in ``open``, twice in ``close``). A kill in between left it
  empty or cut, and the whole session unreadable (``import_offline_session``: "Could not read Task object"; a
  resumed run no longer finds its task): measured, kills at the first write of each rewrite, 6 of 6. Our tasks
  are of a subclass (``_atomic_task_json``) that has ClearML write it under a temporary name in the session
  folder, then puts it in place with ``os.replace``: every kill leaves the previous or the new ``task.json``.
- ``connect_configuration`` writes HOCON; when a key holds one of ``$}[]:=+#`^?!@*&.`` it goes through JSON
  and non-ASCII strings come back escaped ("é" -> "\\u00e9"); NaN comes back as "NaN".
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracklane.core.errors import SinkError
from tracklane.core.records import Alert, Artifact, Generations, Histogram, Image, Metrics, Record, RunSpec, Text, Trajectories
from tracklane.host.sink import Sink, import_sdk
from tracklane.workers.sinks import media
from tracklane.workers.sinks.steps import records_by_step

log = logging.getLogger("tracklane")

CONFIG_NAME = "Hyperparameters"  # verl's name for the configuration object
RUN_TAG = "tracklane.run_id:"
EXIT_TAG = "tracklane.exit_code="
ALERT_TAG = "tracklane.alert="
"""A task tag per rule that fired (the task list filters on tags), as the exit code is tagged."""
KEEP_ALL_SAMPLES = -1
FLUSH_ROUNDS = 2  # see the module docstring: one reporter cycle may end without the newest events
# Task.init's auto_connect_frameworks: a key left out counts as True (task.py, should_connect), so all are named.
NO_FRAMEWORKS = {name: False for name in (
    "matplotlib", "tensorflow", "tensorboard", "pytorch", "xgboost", "scikit", "fastai", "lightgbm", "hydra",
    "detect_repository", "tfdefines", "joblib", "megengine", "catboost", "gradio")}
_MASTER_ENV = ("CLEARML_PROC_MASTER_ID", "TRAINS_PROC_MASTER_ID")
_SERVER_ENV = ("CLEARML_API_HOST", "TRAINS_API_HOST", "CLEARML_API_ACCESS_KEY", "TRAINS_API_ACCESS_KEY",
               "CLEARML_AUTH_TOKEN")
_TRUE = ("y", "yes", "t", "true", "on", "1")  # ClearML's strtobool (backend_config/converters.py)
_FALSE = ("n", "no", "f", "false", "off", "0")
_SAMPLE_NUMBER = re.compile(r"_(\d{8})(\.[^/]*)?$")  # <title>_<series>_<n:08d>.<ext> (UploadEvent)


class ClearmlSink(Sink):
    """Logs to one ClearML task; ``flush`` waits for ClearML's reporter thread to write what was reported."""

    name = "clearml"
    sdk_module = "clearml"
    extra = "clearml"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        """Offline or not, and ClearML's cache folder and config file as absolute paths (the lane actor may have
        another cwd and environment). No key or token: ClearML reads them from the lane's own environment."""
        return {"offline": _offline(env),
                "cache_dir": _absolute(env.get("CLEARML_CACHE_DIR") or env.get("TRAINS_CACHE_DIR")),
                "config_file": _absolute(env.get("CLEARML_CONFIG_FILE") or env.get("TRAINS_CONFIG_FILE"))}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._task: Any = None  # clearml Task, None until open() and after close()
        self._folder: Path | None = None  # the offline session folder
        self._names: dict[str, tuple[str, str] | None] = {}  # metric key -> (title, series); None: a clash
        self._owners: dict[tuple[str, str], str] = {}  # (title, series) -> the key that has it
        self._warned: set[str] = set()
        mode = "offline" if self.settings.get("offline") else "online"
        self._where = f"clearml: {mode} task (not started)"

    # -- open ----------------------------------------------------------------------------
    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        clearml = import_sdk(type(self))
        offline = bool(self.settings.get("offline"))
        _prepare_process(clearml.Task, self.settings)
        task_id = (resume or {}).get("task_id") or (_tagged_task_id(clearml.Task, self.run, offline) if self.run.resume else "")
        task = _init_task(clearml.Task, self.run, task_id, offline)
        try:
            self._attach(task)
        except Exception as exc:  # close it, or the next open() would find it still running
            task.close()
            _forget_master_marker(own=True)
            raise SinkError(f"clearml task {task.id} opened but could not be set up: {exc}") from exc
        self._task = task
        self._where = self._describe(task)
        return {"task_id": task.id}

    def _attach(self, task: Any) -> None:
        """The config, once (a re-attached task keeps its own), and offline the session's sample numbers."""
        if task.get_configuration_object(CONFIG_NAME) is None:
            task.connect_configuration(self.run.params, name=CONFIG_NAME)
        if self.settings.get("offline"):
            self._folder = Path(task.get_offline_mode_folder())
            _continue_sample_numbers(self._folder / "metrics.jsonl")

    def _describe(self, task: Any) -> str:
        if self._folder is not None:
            return (f"clearml: offline task {task.id} in {self._folder} (a zip beside it after close); "
                    f"import with `clearml-task --import-offline-session {self._folder}.zip`")
        return f"clearml: task {task.id} at {task.get_output_log_web_page()}"

    # -- scalars ---------------------------------------------------------------------------
    def write_metrics(self, records: Sequence[Metrics]) -> None:
        logger = self._logger()
        for step, group in records_by_step(records):
            for key, value in self._finite(group).items():
                self._scalar(logger, key, value, step)

    def _finite(self, group: Sequence[Metrics]) -> dict[str, float | int]:
        """A step's values, the later finite value of a key winning; each non-finite value skipped and counted
        before the merge. Skipped after it, a NaN following a finite value would drop both when one batch holds
        the two, and not when two batches do (ClearML's server keeps a step's last report): what the key shows
        would depend on the batching. (verl's shows 0.0 there: ClearML's NaN.)"""
        return {key: value for record in group for key, value in record.values.items() if self._finite_value(key, value)}

    def _scalar(self, logger: Any, key: str, value: float | int, step: int) -> None:
        names = self._title_series(key) if self._finite_value(key, value) else None
        if names is not None:
            logger.report_scalar(names[0], names[1], float(value), iteration=step)

    def _finite_value(self, key: str, value: float | int) -> bool:
        if not math.isfinite(value):
            self._cut("scalar_nonfinite", f"{key} = {value} (ClearML would store 0.0)")
        return math.isfinite(value)

    def _title_series(self, key: str) -> tuple[str, str] | None:
        """verl's split at the first "/"; a key without one is its own title and series. None: the pair
        already belongs to another key (counted, warned once)."""
        if key in self._names:
            names = self._names[key]
            if names is None:
                self.counts.add(self.counts.cuts, "scalar_name_clash", 1)
            return names
        pair = _split(key)
        owner = self._owners.setdefault(pair, key)
        self._names[key] = pair if owner == key else None
        if owner != key:
            self._cut("scalar_name_clash", f"{key} would share the graph line {pair} with {owner}")
        return self._names[key]

    def _cut(self, what: str, detail: str) -> None:
        self.counts.add(self.counts.cuts, what, 1)
        if what not in self._warned:
            self._warned.add(what)
            log.warning("tracklane: clearml: skipping %s (counted as %s; warned once)", detail, what)

    # -- rich records --------------------------------------------------------------------
    def write_generations(self, records: Sequence[Generations]) -> None:
        self._tables(records, media.GENERATION_COLUMNS, media.generation_rows)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._tables(records, media.TRAJECTORY_COLUMNS, media.trajectory_rows)

    def _tables(self, records: Sequence[Any], columns: list[str], rows_of: Callable[[Any], list[list[Any]]]) -> None:
        """One table per key and step, holding that step's rows; a step without rows reports nothing."""
        logger = self._logger()
        for step, rows in media.tables_by_step(records, rows_of, _cell):
            for key, key_rows in rows.items():
                title, series = _split(key)
                logger.report_table(title, series, iteration=step, table_plot=[list(columns), *key_rows])

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        logger = self._logger()
        for record in records:
            figures = record.summary()
            if figures.nonfinite:
                self.counts.add(self.counts.cuts, "histogram_nonfinite", figures.nonfinite)
            for stat, value in media.histogram_stats(figures).items():
                self._scalar(logger, f"{record.name}/{stat}", value, record.step)
            if figures.count:
                edges = figures.bin_edges
                centres = [(low + high) / 2 for low, high in zip(edges[:-1], edges[1:], strict=True)]
                title, series = _split(record.name)
                logger.report_histogram(title, series, values=figures.counts, iteration=record.step,
                                        xlabels=centres, xaxis=record.name, yaxis="count")

    def write_text(self, records: Sequence[Text]) -> None:
        for record in records:
            self._sample(record.name, record.step, record.text.encode("utf-8"), ".txt")

    def write_alert(self, records: Sequence[Alert]) -> None:
        """The text ``alert/<rule>`` (a debug sample), and a tag per rule that fired."""
        task = self._live()
        tags = [f"{ALERT_TAG}{rule}" for rule in dict.fromkeys(r.rule for r in records)]
        task.add_tags([tag for tag in tags if tag not in task.get_tags()])
        super().write_alert(records)

    def write_image(self, records: Sequence[Image]) -> None:
        for record in records:
            self._sample(record.name, record.step, record.png, ".png")

    def _sample(self, name: str, step: int, content: bytes, extension: str) -> None:
        title, series = _split(name)
        self._logger().report_media(title, series, iteration=step, stream=io.BytesIO(content),
                                    file_extension=extension, max_history=KEEP_ALL_SAMPLES)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        task = self._live()
        for record in records:
            name = f"{record.type}/{record.name}/step_{record.step}"
            metadata = {"name": record.name, "type": record.type, "step": record.step}
            # A Path, not a str: ClearML stores a str that names no file as a text artifact.
            if not task.upload_artifact(name, artifact_object=Path(record.path), metadata=metadata,
                                        wait_on_upload=True):
                raise SinkError(f"clearml could not store artifact {name!r} from {record.path}")

    def _live(self) -> Any:
        if self._task is None:
            raise SinkError("clearml sink written to before open() or after close()")
        return self._task

    def _logger(self) -> Any:
        return self._live().get_logger()

    # -- durability ------------------------------------------------------------------------
    def flush(self) -> None:
        """Everything reported so far written by ClearML's reporter thread: offline, appended to
        ``metrics.jsonl`` (debug sample files copied before their line), in the OS's hands (no fsync)."""
        if self._task is None:
            return
        for _ in range(FLUSH_ROUNDS):
            self._task.flush(wait_for_uploads=True)

    def mark(self, records: Sequence[Record]) -> dict[str, Any] | None:
        """Offline: the size of ``metrics.jsonl`` (append-only, one line per reporter write) before the batch."""
        if self._folder is None or self._task is None:
            return None
        events = self._folder / "metrics.jsonl"
        return {"events": str(events), "size": events.stat().st_size if events.exists() else 0}

    def rollback(self, mark: Mapping[str, Any]) -> None:
        """Cut what a killed actor wrote after ``mark`` (its debug sample files stay, unreferenced;
        artifacts are stored again under the same name, which replaces them)."""
        path, size = str(mark["events"]), int(mark["size"])
        if os.path.exists(path) and os.path.getsize(path) > size:
            os.truncate(path, size)

    def close(self, exit_code: int) -> None:
        """Tag the exit code, close the task (ClearML flushes, marks it completed online, zips the offline
        session), then mark a failure online. A second call does nothing."""
        task, self._task = self._task, None
        if task is None:
            return
        try:
            try:
                for _ in range(FLUSH_ROUNDS):  # everything reported written before close zips the session: its own
                    task.flush(wait_for_uploads=True)  # flush may end a reporter cycle without the newest events
                tags = [tag for tag in task.get_tags() if not tag.startswith(EXIT_TAG)]
                task.set_tags([*tags, f"{EXIT_TAG}{exit_code}"])  # offline, the only record of how it ended
            finally:
                task.close()
            if exit_code != 0 and not self.settings.get("offline"):
                task.mark_failed(status_reason=f"exit code {exit_code}", force=True)
        except Exception as exc:
            raise SinkError(f"clearml could not close task {task.id}: {exc}") from exc
        finally:
            _forget_master_marker(own=True)

    def where(self) -> str:
        return self._where


def _prepare_process(task_cls: Any, settings: Mapping[str, Any]) -> None:
    """ClearML's process-wide switches, set before anything asks it for the current task."""
    _forget_master_marker(own=False)
    if settings.get("cache_dir"):
        os.environ["CLEARML_CACHE_DIR"] = settings["cache_dir"]  # read by ClearML on each use
    if settings.get("config_file"):  # read when ClearML first loads its config in this process
        os.environ["CLEARML_CONFIG_FILE"] = settings["config_file"]
    if task_cls.current_task() is not None:
        raise SinkError(f"a ClearML task ({task_cls.current_task().id}) is already running in this process; "
                        "ClearML allows one main task per process")
    task_cls.set_offline(bool(settings.get("offline")))
    task_cls._report_subprocess_enabled = False  # threads, not a forked reporter (module docstring)


def _init_task(task_cls: Any, run: RunSpec, task_id: str, offline: bool) -> Any:
    """``Task.init``: a new task, or (``task_id``) the same one again, its iterations unshifted."""
    if task_id and offline:
        _check_session(task_id)
    tags = [RUN_TAG + run.run_id] if run.run_id and not task_id else None
    try:
        task = _atomic_task_json(task_cls).init(
            project_name=run.project, task_name=run.experiment, tags=tags,
            reuse_last_task_id=task_id or False, continue_last_task=0 if task_id else False,
            output_uri=False, auto_connect_frameworks=NO_FRAMEWORKS, auto_connect_arg_parser=False,
            auto_resource_monitoring=False, auto_connect_streams=False)
    except Exception as exc:  # translated at the boundary; the cause is kept
        raise SinkError(f"clearml Task.init failed: {exc}") from exc
    if not isinstance(task, task_cls):
        raise SinkError(f"clearml Task.init returned {type(task).__name__}, not a task (another process's "
                        "CLEARML_PROC_MASTER_ID?)")
    if task_id and task.id != task_id:  # ClearML falls back to a new task when it cannot load the old one
        task.close()
        raise SinkError(f"clearml could not re-attach to task {task_id} (it made {task.id})")
    return task


def _check_session(task_id: str) -> None:
    from clearml.config import get_offline_dir

    folder = Path(get_offline_dir(task_id=task_id))
    if not (folder / "task.json").is_file():  # ClearML would start an empty task under the same id
        raise SinkError(f"clearml: cannot re-attach to offline task {task_id}: {folder}/task.json is not on "
                        "this node (the offline session lives in the lane's CLEARML_CACHE_DIR)")


def _tagged_task_id(task_cls: Any, run: RunSpec, offline: bool) -> str:
    """The newest task of this project tagged with our run id ("" when there is none)."""
    if not run.run_id:
        return ""
    tag = RUN_TAG + run.run_id
    if offline:
        return _tagged_offline_task(run.project, tag)
    found = task_cls.get_tasks(project_name=run.project, tags=[tag],  # online: not run in tests here
                               task_filter={"order_by": ["-last_update"]})
    return found[0].id if found else ""


def _offline(env: Mapping[str, str]) -> bool:
    """``CLEARML_OFFLINE_MODE`` if set, else offline unless a server is configured (module docstring)."""
    flag = (env.get("CLEARML_OFFLINE_MODE") or env.get("TRAINS_OFFLINE_MODE") or "").strip().lower()
    if flag:
        return flag in _TRUE or flag not in _FALSE  # ClearML: any other non-empty text is true
    if any(env.get(name) for name in _SERVER_ENV):
        return False
    return not any(_has_credentials(path) for path in _config_files(env))


def _absolute(path: str | None) -> str:
    return os.path.abspath(os.path.expanduser(path)) if path else ""


def _config_files(env: Mapping[str, str]) -> list[str]:
    """Where ClearML reads its config file (backend_config/defs.py): the override alone, if set."""
    override = env.get("CLEARML_CONFIG_FILE") or env.get("TRAINS_CONFIG_FILE")
    if override:
        return [os.path.expanduser(override)]
    home = env.get("HOME") or os.path.expanduser("~")
    return [os.path.join(home, "trains.conf"), os.path.join(home, "clearml.conf")]


def _has_credentials(path: str) -> bool:
    """Whether a config file names an API key (``clearml-init`` writes ``api { credentials { access_key``).
    A text check: parsing HOCON here would import ClearML on the trainer side (1.1 s)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return "access_key" in file.read()
    except OSError:
        return False


@functools.cache
def _atomic_task_json(task_cls: Any) -> Any:
    """``task_cls`` (clearml's ``Task``), whose offline ``task.json`` is replaced whole, never rewritten in place
    (module docstring). ``Task.init`` on it makes its tasks of this class."""

    class AtomicTaskJson(task_cls):
        _offline_filename: str  # ClearML's class attribute, "task.json"; only annotated here

        def _save_data_to_offline_dir(self, **kwargs: Any) -> None:
            folder = self.get_offline_mode_folder()
            if not folder:
                super()._save_data_to_offline_dir(**kwargs)
                return
            with self._edit_lock:  # reentrant; ClearML reads and writes the file name under it
                final = Path(folder) / self._offline_filename
                self._offline_filename = f".{final.name}.tracklane-tmp"
                try:
                    super()._save_data_to_offline_dir(**kwargs)
                finally:
                    del self._offline_filename  # the class's "task.json" again
                os.replace(final.with_name(f".{final.name}.tracklane-tmp"), final)

    return AtomicTaskJson


def _forget_master_marker(own: bool) -> None:
    """Drop ClearML's ``<pid>:<task id>`` process marker: one inherited from another process (``own=False``;
    it turns ``Task.init`` into a stub), or this process's own after close (so children start clean)."""
    for name in _MASTER_ENV:
        pid = os.environ.get(name, "").partition(":")[0]
        if pid and (pid == str(os.getpid())) == own:
            del os.environ[name]


def _tagged_offline_task(project: str, tag: str) -> str:
    """The newest offline session of ``project`` whose task carries ``tag`` ("" when there is none)."""
    from clearml.config import get_offline_dir

    found = []
    for path in Path(get_offline_dir()).glob("*/task.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # a session being written, or a foreign file: not ours
            continue
        if data.get("project_name") == project and tag in (data.get("tags") or []):
            found.append((path.stat().st_mtime, str(data.get("id", ""))))
    return max(found)[1] if found else ""


def _continue_sample_numbers(events: Path) -> None:
    """Start ClearML's per-title/series debug sample numbers after those a session already used."""
    from clearml.backend_interface.metrics.events import UploadEvent

    if not events.exists():
        return
    used: dict[str, int] = {}
    for event in _events(events):
        match = _SAMPLE_NUMBER.search(str(event.get("key") or ""))
        if event.get("url") and match:
            name = f"{event.get('metric')}_{event.get('variant')}"
            used[name] = max(used.get(name, -1), int(match.group(1)))
    counters = UploadEvent._metric_counters
    with UploadEvent._metric_counters_lock:
        for name, number in used.items():
            counters[name] = max(counters.get(name, -1), number)


def _events(path: Path) -> list[dict[str, Any]]:
    """The event dicts of a ``metrics.jsonl`` (one JSON list per line; a torn last line is left out)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as file:
        for line in file:
            try:
                out += json.loads(line)
            except ValueError:
                continue
    return out


def _split(key: str) -> tuple[str, str]:
    """A key or name as title and series (verl's split; one without "/" is both)."""
    title, _, series = key.partition("/")
    return (title, series) if title and series else (key, key)


_cell = functools.partial(media.named_nonfinite, infinity="Inf")  # as ClearML writes a DataFrame's: "NaN", "Inf", "-Inf"
