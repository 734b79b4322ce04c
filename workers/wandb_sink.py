"""Deliver metrics and rich records to one Weights & Biases run, started the way verl starts it.

Rich records, as wandb 0.31 stores them (offline: under the run's ``files/``):

    generations   one INCREMENTAL ``wandb.Table`` per key for the whole run, columns step, input, output,
                  score; each log writes only the step's new rows (files/media/table/<key>_*.table.json)
    trajectories  the same, columns TRAJECTORY_COLUMNS (messages, tool calls, rewards, meta as JSON)
    histogram     ``wandb.Histogram`` of the finite values (30 bins, as the other trackers); non-finite
                  values are left out and counted (``LaneReport.cuts["histogram_nonfinite"]``)
    text          an INCREMENTAL table per name, columns step, text (exact text back; ``wandb.Html``
                  would need escaping and wraps the text in markup)
    image         ``wandb.Image`` of the PNG file as given (files/media/images/)
    artifact      ``wandb.Artifact(name, type)`` with the file (or directory), metadata {"step": N}

Records of one key at one step in one batch become one log call; a step with no samples logs nothing.
Logged table rows are released (set to None) so the lane's memory stays flat over a long run. A log
call that raises drops the key's table (the lane retries the batch; a new table avoids duplicate
rows, at the cost of the wandb UI chaining later increments to the earlier ones).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.errors import SinkError
from pipeline.records import Artifact, Generations, Histogram, Image, Metrics, RunSpec, Text, Trajectories
from workers.media import GENERATION_COLUMNS, TRAJECTORY_COLUMNS, generation_rows, safe_name, trajectory_rows
from workers.sink import Sink, import_sdk
from workers.steps import R, merge_by_step, records_by_step

log = logging.getLogger("tracklane")

TEXT_COLUMNS = ["step", "text"]


class WandbSink(Sink):
    """One wandb run per tracker run; ``flush`` is the base no-op (wandb-core writes in the background)."""

    name = "wandb"
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
        self._run_dir: str | None = None
        self._tables: dict[str, Any] = {}  # key -> the run's INCREMENTAL wandb.Table
        self._released: dict[str, int] = {}  # key -> rows of that table already logged and released

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        wandb = import_sdk(type(self))
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
        if resume:  # an actor restart: same run, hyper-parameters already logged
            kwargs.update(id=resume["id"], resume="allow")
        elif self.run.resume:  # training resumed from a checkpoint: continue the run with this id
            kwargs.update(id=self.run.run_id, resume="allow", config=self.run.params, allow_val_change=True)
        else:
            kwargs.update(id=self.run.run_id or None, config=self.run.params)
        try:
            self._run = wandb.init(**kwargs)
        except wandb.Error as exc:
            raise SinkError(f"wandb.init failed: {exc}") from exc
        self._run_dir = os.path.dirname(self._run.dir)  # run.dir is the run's files/ folder
        return {"id": str(self._run.id)}

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        # wandb keeps the newest step's row open, so a record of the same step in the
        # next batch still merges into it.
        for step, values in merge_by_step(records):
            self._run.log(values, step=step)

    def write_generations(self, records: Sequence[Generations]) -> None:
        self._log_rows(records, GENERATION_COLUMNS, lambda r: r.key, generation_rows)

    def write_trajectories(self, records: Sequence[Trajectories]) -> None:
        self._log_rows(records, TRAJECTORY_COLUMNS, lambda r: r.key, trajectory_rows)

    def write_text(self, records: Sequence[Text]) -> None:
        self._log_rows(records, TEXT_COLUMNS, lambda r: r.name, lambda r: [[r.step, r.text]])

    def write_histogram(self, records: Sequence[Histogram]) -> None:
        wandb = import_sdk(type(self))
        for step, group in records_by_step(records):
            values = {}
            for record in group:
                figures = record.summary()
                if figures.nonfinite:  # wandb.Histogram needs finite values
                    self.counts.add(self.counts.cuts, "histogram_nonfinite", figures.nonfinite)
                if figures.count:  # nothing finite: an empty histogram would only mislead
                    values[record.name] = wandb.Histogram(np_histogram=(figures.counts, figures.bin_edges))
            if values:
                self._run.log(values, step=step)

    def write_image(self, records: Sequence[Image]) -> None:
        wandb = import_sdk(type(self))
        for step, group in records_by_step(records):
            # wandb.Image(path) copies the file as given (no decode-and-encode: ~5x cheaper than from PIL);
            # with media symlinks on it would link to our temporary file, so go through PIL then.
            via_file = not self._run.settings.allow_media_symlink
            with tempfile.TemporaryDirectory(prefix="tracklane-wandb-") as folder:
                values = {}
                for index, record in enumerate(group):
                    values[record.name] = wandb.Image(_png_file(folder, index, record.png) if via_file
                                                      else _pil_image(record.png))
                self._run.log(values, step=step)

    def write_artifact(self, records: Sequence[Artifact]) -> None:
        wandb = import_sdk(type(self))
        for record in records:
            # wandb allows only alphanumerics, dashes, underscores and dots in artifact names and types
            artifact = wandb.Artifact(safe_name(record.name, "-"), type=safe_name(record.type, "-"),
                                      metadata={"step": record.step, "source": record.path})
            if os.path.isdir(record.path):
                artifact.add_dir(record.path)
            else:
                artifact.add_file(record.path)  # "mutable": wandb copies it, the trainer may delete it
            self._run.log_artifact(artifact)

    def _log_rows(self, records: Sequence[R], columns: list[str], key_of: Callable[[R], str],
                  rows_of: Callable[[R], list[list[Any]]]) -> None:
        """Add each step's rows to the key's incremental table and log them at that step."""
        for step, group in records_by_step(records):
            values = {}
            for record in group:
                key = key_of(record)
                rows = rows_of(record)
                if rows:
                    table = self._table(key, columns)
                    for row in rows:
                        table.add_data(*row)
                    values[key] = table
            if values:
                try:
                    self._run.log(values, step=step)
                except Exception:
                    # The lane retries the whole batch: a fresh table then gets these rows once, not twice.
                    for key in values:
                        self._tables.pop(key, None)
                    raise
                for key in values:
                    self._release(key)

    def _table(self, key: str, columns: list[str]) -> Any:
        table = self._tables.get(key)
        if table is None:
            wandb = import_sdk(type(self))
            # Mixed types: a meta value may be an int in one row and None or a str in the next.
            table = self._tables[key] = wandb.Table(columns=columns, log_mode="INCREMENTAL",
                                                    allow_mixed_types=columns is TRAJECTORY_COLUMNS)
            self._released[key] = 0
        return table

    def _release(self, key: str) -> None:
        """Forget the content of rows already written: wandb only reads the rows after the last logged one."""
        data = self._tables[key].data
        for index in range(self._released[key], len(data)):
            data[index] = None
        self._released[key] = len(data)

    def close(self, exit_code: int) -> None:
        self._tables.clear()
        self._released.clear()
        run, self._run = self._run, None
        if run is not None:
            run.finish(exit_code=exit_code)
            self._wait_for_files()

    def _wait_for_files(self) -> None:
        """finish() returns before wandb-core has flushed and closed the run file; its teardown
        waits for that. Skipped while another wandb run of this process is still active."""
        wandb = import_sdk(type(self))
        if wandb.setup().most_recent_active_run is not None:
            return
        try:
            wandb.teardown()
        except SystemExit as exc:  # wandb exits when its service process failed
            raise SinkError(f"wandb service ended with status {exc.code}") from exc

    def where(self) -> str:
        folder = self._run_dir or os.path.join(self.settings.get("dir") or ".", "wandb")
        return f"wandb: run files in {folder} (upload offline runs with `wandb sync {folder}`)"


def _png_file(folder: str, index: int, png: bytes) -> str:
    path = os.path.join(folder, f"{index}.png")
    with open(path, "wb") as handle:
        handle.write(png)
    return path


def _pil_image(png: bytes) -> Any:
    import io

    from PIL import Image as PILImage

    image = PILImage.open(io.BytesIO(png))
    image.load()
    return image
