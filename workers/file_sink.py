"""File tracker: JSON lines ``{"step": ..., "data": {...}}``, the format of verl's file logger.

The first line is a header with the run's config (``"step": null, "data": {}`` so that
readers of verl's format skip it). NaN and +-Inf are written as the JSON tokens
``NaN``/``Infinity``, which Python's ``json`` and pandas read back exactly.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from pipeline.records import Metrics, RunSpec
from workers.sink import Sink
from workers.steps import merge_by_step


class FileSink(Sink):
    name = "file"

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        path = env.get("VERL_FILE_LOGGER_PATH")
        if not path:
            root = os.path.expanduser(env.get("VERL_FILE_LOGGER_ROOT", "."))
            path = os.path.join(root, run.project, f"{run.experiment}.jsonl")
        return {"path": os.path.abspath(path)}

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        path = self.settings["path"]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # A fresh run truncates like verl; a restarted actor appends to what it wrote before.
        self._handle = open(path, "a" if resume is not None else "w", encoding="utf-8")
        if resume is None:
            header = {"step": None, "data": {}, "project": self.run.project,
                      "experiment": self.run.experiment, "run_id": self.run.run_id, "config": self.run.params}
            self._handle.write(json.dumps(header) + "\n")
            self._handle.flush()
        return {"path": path}

    def write_metrics(self, records: Sequence[Metrics]) -> None:
        lines = [json.dumps({"step": step, "data": values})
                 for step, values in merge_by_step(records)]
        if lines:
            self._handle.write("\n".join(lines) + "\n")
            self._handle.flush()  # a crash of the actor loses nothing it acknowledged

    def close(self, exit_code: int) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and not handle.closed:
            handle.close()

    def where(self) -> str:
        return f"file: {self.settings['path']}"
