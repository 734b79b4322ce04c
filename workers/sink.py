"""The one small protocol every tracker implements, and the registry of backends.

A sink is a plain class, one per tracker, one file each. The same object runs
in-process (``log_async: false``) and inside a lane's Ray actor (``log_async: true``):

    settings = SinkClass.resolve(run, env, trainer)   # trainer side, once: env read at the edge
    sink = SinkClass(run, settings)
    resume = sink.open(None)      # create the tracker run, log hyper-parameters once;
                                  # returns what is needed to re-attach (e.g. a run id)
    sink.write(records)           # any number of times, records in step order; the base class
                                  # hands each run of one kind to write_<kind>() (write_metrics,
                                  # write_generations, write_trajectories, write_histogram,
                                  # write_text, write_image, write_artifact)
    sink.flush()
    sink.close(exit_code)         # end the tracker run (FINISHED / FAILED, exit code ...)

After an actor restart the sink is built again and ``open(resume)`` re-attaches to
the same tracker run without logging the hyper-parameters a second time.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from typing import Any, ClassVar, Mapping, Sequence

from pipeline.errors import ConfigError, MissingExtraError
from pipeline.records import Record, RunSpec

log = logging.getLogger("tracklane")

# backend name -> "module:Class"; modules are imported only when a backend is used.
BACKENDS: dict[str, str] = {
    "console": "workers.console_sink:ConsoleSink",
    "wandb": "workers.wandb_sink:WandbSink",
    "mlflow": "workers.mlflow_sink:MlflowSink",
    "swanlab": "workers.swanlab_sink:SwanlabSink",
    "tensorboard": "workers.tensorboard_sink:TensorboardSink",
    "file": "workers.file_sink:FileSink",
}
# Not user-selectable by name in a config, but usable by tests and by users' own tests.
EXTRA_SINKS: dict[str, str] = {"memory": "workers.memory_sink:MemorySink"}


class Sink:
    """Base class with the defaults; subclasses override what their tracker needs."""

    name: ClassVar[str] = ""
    sdk_module: ClassVar[str | None] = None
    """Top-level module of the tracker SDK, checked before anything starts."""
    extra: ClassVar[str | None] = None
    """The pip extra that installs the SDK: ``pip install 'tracklane[<extra>]'``."""

    @classmethod
    def resolve(cls, run: RunSpec, env: Mapping[str, str], trainer: Mapping[str, Any]) -> dict[str, Any]:
        """Settings from the environment and ``config.trainer``, read once on the trainer side.

        The result must hold only plain values: it is sent to the lane actor with msgpack.
        """
        return {}

    def __init__(self, run: RunSpec, settings: Mapping[str, Any]) -> None:
        self.run = run
        self.settings = dict(settings)
        self.unsupported: dict[str, int] = {}
        """Records of kinds this tracker cannot store, by kind."""
        self.artifacts_missing = 0
        """Artifact records whose path did not exist when the sink reached them (skipped)."""

    def open(self, resume: Mapping[str, Any] | None) -> dict[str, Any]:
        return {}

    def write(self, records: Sequence[Record]) -> None:
        """Hand each run of consecutive records of one kind to ``write_<kind>``, keeping their order."""
        start = 0
        for index in range(1, len(records) + 1):
            if index == len(records) or records[index].kind != records[start].kind:
                self._write_kind(records[start].kind, records[start:index])
                start = index

    def _write_kind(self, kind: str, records: Sequence[Record]) -> None:
        handler = getattr(self, f"write_{kind}", None)
        if handler is not None:
            if kind == "artifact":
                records = self._existing_files(records)
            if records:
                handler(records)
            return
        self.unsupported[kind] = self.unsupported.get(kind, 0) + len(records)
        if self.unsupported[kind] == len(records):
            log.warning("tracklane: the %s backend does not store %s records; skipping them (counted)", self.name, kind)

    def _existing_files(self, records: Sequence[Record]) -> list[Record]:
        """Artifacts whose file is gone are skipped and counted: retrying cannot help, and failing
        the write would fail the whole batch around them."""
        kept = []
        for record in records:
            if os.path.exists(record.path):
                kept.append(record)
                continue
            self.artifacts_missing += 1
            log.warning("tracklane: %s: artifact %r (%s) not found at %s; skipped (counted)",
                        self.name, record.name, record.type, record.path)
        return kept

    def flush(self) -> None:
        pass

    def close(self, exit_code: int) -> None:
        pass

    def where(self) -> str:
        """One line saying where this sink wrote, for the end-of-run summary."""
        return self.name


def backend_class(name: str) -> type[Sink]:
    """The sink class registered for ``name`` (imports its module, not its SDK)."""
    target = BACKENDS.get(name) or EXTRA_SINKS.get(name)
    if target is None:
        raise ConfigError(f"unknown backend {name!r}; valid backends are: {', '.join(BACKENDS)}")
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def check_installed(cls: type[Sink]) -> None:
    """Raise ``MissingExtraError`` naming the pip extra if the tracker SDK is absent."""
    if cls.sdk_module and importlib.util.find_spec(cls.sdk_module) is None:
        raise MissingExtraError(cls.name, cls.sdk_module, cls.extra or cls.name)


def import_sdk(cls: type[Sink], module: str | None = None) -> Any:
    """Import the tracker SDK inside a sink, translating ImportError to ``MissingExtraError``."""
    module = module or cls.sdk_module
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(cls.name, module, cls.extra or cls.name) from exc
