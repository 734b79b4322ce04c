"""Deliver metrics and rich records to one Weights & Biases run, started the way verl starts it.

Rich records, as wandb 0.31 stores them (offline: under the run's ``files/``):

    generations   one INCREMENTAL ``wandb.Table`` per key for the whole run, columns step, input, output,
                  score; each log writes only the step's new rows (files/media/table/<key>_*.table.json)
    trajectories  the same, columns TRAJECTORY_COLUMNS (messages, tool calls, rewards, meta as JSON)
    histogram     ``wandb.Histogram`` of the finite values (30 bins, as the other trackers); non-finite
                  values are left out and counted (``LaneReport.cuts["histogram_nonfinite"]``)
    text          an INCREMENTAL table per name, columns step, text (exact text back; ``wandb.Html``
                  would need escaping and wraps the text in markup)
    alert         the text ``alert/<rule>``, and ``run.alert`` (title "tracklane: <rule>", level WARN or ERROR;
                  offline an alert record in the run file, sent on sync)
    image         ``wandb.Image`` of the PNG file as given (files/media/images/)
    artifact      ``wandb.Artifact(name, type)`` with the file (or directory), metadata {"step": N}

Steps: wandb drops a row whose step is lower than its newest, and producers log at their own pace (a
rollout worker a step behind the trainer, a producer on its own axis). So the sink numbers the rows itself
(``_step``: the trainer's step while steps increase, else the next number) and logs every key against a
step metric (``define_metric``): ``STEP_AXIS`` for the trainer's step, a producer's axis
(``Metrics.axis``) for its own. Every point is kept, in any order, and charts use the true step.

Durability: a batch is stored once the run file holds a row of the step open when it ended (``written``/``stored``,
read from the file itself: ``workers/sinks/wandb_store.py`` says why). A sink that takes over a run skips the re-sent
records the run's earlier files hold, by each row's ``ROW_TAG``, so nothing lands twice (``workers/sinks/wandb_resent.py``).

Records of one key at one step in one batch become one log call; a step with no samples logs nothing.
Logged table rows are released (set to None) so the lane's memory stays flat over a long run. A log
call that raises drops the key's table (the lane retries the batch; a new table avoids duplicate
rows, at the cost of the wandb UI chaining later increments to the earlier ones).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tracklane.core.errors import SinkError
from tracklane.core.records import (
    ALERT_TITLE,
    Alert,
    Artifact,
    Generations,
    Histogram,
    Image,
    Metrics,
    RunSpec,
    Text,
    Trajectories,
)
from tracklane.host.sink import Sink, import_sdk
from tracklane.workers.sinks import media
from tracklane.workers.sinks.media import GENERATION_COLUMNS, TRAJECTORY_COLUMNS, generation_rows, safe_name, trajectory_rows
from tracklane.workers.sinks.steps import R, merged_values, records_by_step
from tracklane.workers.sinks.wandb_resent import ResentRows
from tracklane.workers.sinks.wandb_store import ROW_TAG, LogTail

log = logging.getLogger("tracklane")

TEXT_COLUMNS = ["step", "text"]
WANDB_MAX_BINS = 512  # wandb.Histogram refuses more (wandb 0.31: "The maximum length of a histogram is 512")
STEP_AXIS = "tracklane/step"
"""The step metric of what is logged at the trainer's step (a hidden key of every row)."""


class WandbSink(Sink):
    """One wandb run per tracker run; ``flush`` is the base no-op (wandb-core writes in the background)."""

    name = "wandb"
    takes_pieces = True  # each log adds the chunk's rows to the key's INCREMENTAL table
    sdk_module = "wandb"
    extra = "wandb"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        # The lane actor may run with another cwd and environment: pin the folder here.
        return {
            "mode": env.get("WANDB_MODE"),
            "dir": os.path.abspath(env.get("WANDB_DIR") or "."),
            "entity": env.get("WANDB_ENTITY"),
            "proxy": trainer.get("wandb_proxy"),
        }

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        super().__init__(run, settings)
        self._run: Any = None  # the wandb Run; kept, since wandb.run is only the latest one
        self._wandb: Any = None  # the wandb module once open
        self._run_dir: str | None = None
        self._tables = IncrementalTables()  # key -> the run's INCREMENTAL wandb.Table
        self._tail: LogTail | None = None  # follows this run file on disk
        self._row: int | None = None  # ``_step`` of the newest row handed (-1: only artifacts; None: nothing yet)
        self._open: tuple[str, str, int] | None = None  # (sender, axis, step) of that row: wandb keeps it open
        self._defined: set[str] = set()  # keys (and axes) given their step metric
        self._resent = ResentRows()  # what the run's earlier files hold; the batch's positions (begin_batch)
        self._tail_warned = False

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        wandb = self._wandb = import_sdk(type(self))
        proxy = self.settings.get("proxy")
        kwargs: dict[str, Any] = {
            "project": self.run.project,
            "name": self.run.experiment,
            "entity": self.settings.get("entity"),
            "mode": self.settings.get("mode"),
            "dir": self.settings.get("dir"),
            "settings": wandb.Settings(https_proxy=proxy) if proxy else None,
            "reinit": "create_new",  # several runs may live in one process, one after another
        }
        if resume:  # an actor restart: the same run; its hyper-parameters are logged unless they never hit the disk
            kwargs.update(id=resume["id"], resume="allow")
            if not self._resent.read_earlier(self.settings.get("dir") or ".", resume["id"]).config:
                kwargs.update(config=self.run.params, allow_val_change=True)
        elif self.run.resume:  # training resumed from a checkpoint: continue the run with this id
            self._resent.read_earlier(self.settings.get("dir") or ".", self.run.run_id)
            kwargs.update(id=self.run.run_id, resume="allow", config=self.run.params, allow_val_change=True)
        else:
            kwargs.update(id=self.run.run_id or None, config=self.run.params)
        try:
            self._run = wandb.init(**kwargs)
        except wandb.Error as exc:
            raise SinkError(f"wandb.init failed: {exc}") from exc
        self._run_dir = os.path.dirname(self._run.dir)  # run.dir is the run's files/ folder
        self._tail = LogTail(self._run.settings.sync_file)
        if self._resent.earlier.step >= 0:  # number the rows on from the earlier files'
            self._row = self._resent.earlier.step
        return {"id": str(self._run.id)}

    # -- durability -----------------------------------------------------------------------
    def written(self) -> int | None:
        return self._row

    def stored(self, point: int) -> bool:
        # The row of the step open when the batch ended (or a later one) is in the file: wandb-core
        # wrote everything handed to it before that step closed. Only artifacts so far (-1): any row.
        if self._tail is None:
            return False
        stored = self._tail.advance()
        if self._tail.error and not self._tail_warned:
            self._tail_warned = True
            log.warning("tracklane: wandb: cannot follow the run file (%s); its batches count as stored only once "
                        "the run is closed", self._tail.error)
        return stored >= max(point, 0)

    def begin_batch(self, sender: str, seq: int, records: Sequence[Any]) -> None:
        self._resent.begin_batch(sender, seq, records)

    def write(self, records: Sequence[Any]) -> None:
        if self._resent.earlier.artifacts:
            records = [r for r in records if not self._resent.stored_artifact(r)]
        super().write(records)

    def _fresh_steps(self, records: Sequence[R]) -> Iterator[tuple[int, list[R]]]:
        """(step, its records), leaving out rows the run's earlier files hold (a batch sent again after a takeover)."""
        return ((step, group) for step, group in records_by_step(records) if self._resent.fresh(group, self._run))

    def _log(self, values: dict[str, Any], step: int, group: Sequence[Any]) -> None:
        """One history row: ``values`` at ``step`` of the group's axis, tagged with its last record's position."""
        axis = getattr(group[0], "axis", None) or STEP_AXIS
        if not self._defined.issuperset(values) or axis not in self._defined:
            self._define(values, axis)
        opened = (self._resent.sender, axis, step)
        if self._open != opened or self._row is None or self._row < 0:  # a new row; else wandb merges into it
            after = -1 if self._row is None else self._row
            self._row = max(after + 1, step if axis == STEP_AXIS else 0)
            self._open = opened
        row = dict(values)
        row[axis] = step
        tag = self._resent.tag(group)
        if tag is not None:
            row[ROW_TAG] = tag
        self._run.log(row, step=self._row)

    def _define(self, values: dict[str, Any], axis: str) -> None:
        if axis not in self._defined:
            self._run.define_metric(axis, hidden=True)
            self._defined.add(axis)
        for key in values:
            if key not in self._defined:
                self._run.define_metric(key, step_metric=axis)
                self._defined.add(key)

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        # wandb keeps the newest row open, so a record of the same step in the next batch still merges into it.
        for step, group in self._fresh_steps(records):
            self._log(merged_values(group), step, group)

    def write_generations(self, records: Sequence[Generations]) -> None:
        self._log_rows(records, GENERATION_COLUMNS, lambda r: r.key, generation_rows)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._log_rows(records, TRAJECTORY_COLUMNS, lambda r: r.key, trajectory_rows)

    def write_text(self, records: Sequence[Text]) -> None:
        self._log_rows(records, TEXT_COLUMNS, lambda r: r.name, lambda r: [[r.step, r.text]])

    def write_alert(self, records: Sequence[Alert]) -> None:
        """The text ``alert/<rule>`` in the run's table, and wandb's own alert (offline: an alert record in the run
        file, sent when it is synced; online: to the user's Slack or email as their wandb settings say)."""
        for record in records:
            if self._resent.fresh([record], self._run):
                self._run.alert(title=f"{ALERT_TITLE}{record.rule}", text=f"step {record.step}: {record.text}",
                                level=record.level, wait_duration=1)
        super().write_alert(records)

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        for step, group in self._fresh_steps(records):
            values = {}
            for record in group:
                figures = record.summary()
                if figures.nonfinite:  # wandb.Histogram needs finite values
                    self.counts.add(self.counts.cuts, "histogram_nonfinite", figures.nonfinite)
                if figures.count:  # nothing finite: an empty histogram would only mislead
                    values[record.name] = self._wandb.Histogram(np_histogram=self._at_most_512_bins(figures))
            if values:
                self._log(values, step, group)

    def _at_most_512_bins(self, figures: Any) -> tuple[list[int], list[float]]:
        """(counts, edges), neighbouring bins summed when there are more than wandb takes (512: it raises
        ValueError beyond, failing the batch; a migrated torch histogram has ~600), counted."""
        counts, edges = list(figures.counts), list(figures.bin_edges)
        if len(counts) <= WANDB_MAX_BINS:
            return counts, edges
        width = -(-len(counts) // WANDB_MAX_BINS)
        self.counts.add(self.counts.cuts, "histogram_bins_merged", 1)
        return [sum(counts[i:i + width]) for i in range(0, len(counts), width)], edges[::width] + (
            [edges[-1]] if (len(edges) - 1) % width else [])

    def write_image(self, records: Sequence[Image]) -> None:
        for step, group in self._fresh_steps(records):
            # wandb.Image(path) copies the file as given (no decode-and-encode: ~5x cheaper than from PIL);
            # with media symlinks on it would link to our temporary file, so go through PIL then.
            via_file = not self._run.settings.allow_media_symlink
            with tempfile.TemporaryDirectory(prefix="tracklane-wandb-") as folder:
                values = {}
                for index, record in enumerate(group):
                    values[record.name] = self._wandb.Image(media.png_file(folder, str(index), record.png) if via_file
                                                            else media.pil_image(record.png))
                self._log(values, step, group)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        for record in records:
            # wandb allows only alphanumerics, dashes, underscores and dots in artifact names and types
            artifact = self._wandb.Artifact(safe_name(record.name, "-"), type=safe_name(record.type, "-"),
                                            metadata={"step": record.step, "source": record.path})
            if os.path.isdir(record.path):
                artifact.add_dir(record.path)
            else:
                artifact.add_file(record.path)  # "mutable": wandb copies it, the trainer may delete it
            self._run.log_artifact(artifact)
            self._row = -1 if self._row is None else self._row

    def _log_rows(self, records: Sequence[R], columns: list[str], key_of: Callable[[R], str],
                  rows_of: Callable[[R], list[list[Any]]]) -> None:
        """Add each step's rows to the key's incremental table and log them at that step."""
        for step, group in self._fresh_steps(records):  # before the rows join a table
            values = {}
            for record in group:
                key, rows = key_of(record), rows_of(record)
                if rows:
                    values[key] = self._tables.add(key, columns, rows)
            if values:
                try:
                    self._log(values, step, group)
                except Exception:
                    # The lane retries the whole batch: a fresh table then gets these rows once, not twice.
                    self._tables.drop(values)
                    raise
                self._tables.release(values)

    def close(self, exit_code: int) -> None:
        self._tables = IncrementalTables()
        run, self._run = self._run, None
        if run is not None:
            run.finish(exit_code=exit_code)
            self._wait_for_files()

    def _wait_for_files(self) -> None:
        """finish() returns before wandb-core has flushed and closed the run file; its teardown
        waits for that. Skipped while another wandb run of this process is still active."""
        if self._wandb.setup().most_recent_active_run is not None:
            return
        try:
            self._wandb.teardown()
        except SystemExit as exc:  # wandb exits when its service process failed
            raise SinkError(f"wandb service ended with status {exc.code}") from exc

    def where(self) -> str:
        folder = self._run_dir or os.path.join(self.settings.get("dir") or ".", "wandb")
        return f"wandb: run files in {folder} (upload offline runs with `wandb sync {folder}`)"


class IncrementalTables:
    """The run's INCREMENTAL ``wandb.Table`` per key; rows already logged are released (set to None)."""

    def __init__(self) -> None:
        self._tables: dict[str, Any] = {}  # key -> the run's INCREMENTAL wandb.Table
        self._released: dict[str, int] = {}  # key -> rows of that table already logged and released

    def __getitem__(self, key: str) -> Any:
        return self._tables[key]

    def add(self, key: str, columns: list[str], rows: list[list[Any]]) -> Any:
        """The key's table (made at its first rows) with ``rows`` added."""
        table = self._tables.get(key)
        if table is None:
            wandb = import_sdk(WandbSink)
            # Mixed types: a meta value may be an int in one row and None or a str in the next.
            table = self._tables[key] = wandb.Table(columns=columns, log_mode="INCREMENTAL",
                                                    allow_mixed_types=columns is TRAJECTORY_COLUMNS)
            self._released[key] = 0
        for row in rows:
            table.add_data(*row)
        return table

    def release(self, keys: Iterable[str]) -> None:
        """Forget the content of rows already written: wandb only reads the rows after the last logged one."""
        for key in keys:
            data = self._tables[key].data
            for index in range(self._released[key], len(data)):
                data[index] = None
            self._released[key] = len(data)

    def drop(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._tables.pop(key, None)
