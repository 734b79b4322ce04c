"""The one small protocol every migration source implements: another tracker's run read as tracklane records.

A source is a plain class, one per tracker, one file each, registered by name in ``pipeline/host/registry.py``
(``SOURCES``); ``tracklane migrate --from <name>`` uses it like this:

    source = SourceClass.from_options(options, env)   # the command line's --run-id, --logdir, --path ...
    with source:                                 # leaving removes what it downloaded (artifact copies)
        origin = source.run()                    # project, experiment, hyper-parameters, its own run id
        for record in source.records():          # tracklane.core.records types, each with the step and the
            ...                                  # time the tracker kept (in step order per key)

The same classes read a migration's targets back: ``SourceClass.of_target(settings, run)`` opens what the
target's sink wrote (``settings`` as its ``resolve()`` gave them, ``run`` the target run), so each source
doubles as the verifier. How a tracker stores a key, a value or a rich record's name and step is its source's
knowledge too (``stored_key``, ``stored_value``, ``stored_as``, ``stored_name``): the comparison
asks it.

What a source cannot carry (a wandb HTML panel, a TensorBoard audio clip ...) is counted in ``skipped`` and
warned about once per kind; nothing is left out silently.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar

from tracklane.core.errors import ConfigError
from tracklane.core.records import Record, RunSpec

log = logging.getLogger("tracklane")


@dataclass(slots=True, kw_only=True)
class SourceRun:
    """Who the source's run is."""

    project: str
    experiment: str
    params: dict[str, Any] = field(default_factory=dict)
    """Hyper-parameters as the tracker keeps them (nested or flattened, strings for MLflow)."""
    run_id: str = ""
    """The tracker's own id of the run ("" where it has none)."""
    where: str = ""
    """One line saying what was read."""


class Source:
    """Base class with the defaults; a subclass reads one tracker."""

    name: ClassVar[str] = ""
    sdk_module: ClassVar[str | None] = None
    """Top-level module of the tracker SDK, checked before anything starts."""
    extra: ClassVar[str | None] = None
    """The pip extra that installs the SDK: ``pip install 'tracklane[<extra>]'``."""
    value_note: ClassVar[str] = ""
    """How ``stored_value`` changes values, for the comparison's heading ("compared as float32")."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        """What could not be carried, by what (e.g. ``"html-file"``)."""
        self._scratch: str | None = None

    # -- building one --------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> Source:
        """The source the command line names (``options``: the parsed ``migrate`` arguments, by dest; ``env``:
        the environment, read here once, e.g. ``MLFLOW_TRACKING_URI``)."""
        raise NotImplementedError

    @classmethod
    def of_target(cls, settings: Mapping[str, Any], run: RunSpec) -> Source:
        """What the sink of this tracker wrote for ``run`` with ``settings``, read back."""
        raise NotImplementedError(f"the {cls.name} source cannot read a migration target")

    # -- the protocol ------------------------------------------------------------------------
    def run(self) -> SourceRun:
        raise NotImplementedError

    def records(self) -> Iterator[Record]:
        raise NotImplementedError

    # -- how this tracker stores what a sink hands it (for comparing a target with the source) --
    @classmethod
    def stored_key(cls, key: str) -> str:
        """The name this tracker gives a metric key."""
        return key

    @classmethod
    def stored_value(cls, value: float) -> float:
        """A value as this tracker gives it back (applied to both sides before comparing)."""
        return value

    @classmethod
    def stored_as(cls, kind: str) -> str | None:
        """The kind a rich record of ``kind`` is read back as from this tracker; None: not read back."""
        return None

    @classmethod
    def stored_name(cls, kind: str, name: str) -> str:
        """The name a rich record (its ``name`` or ``key``) is read back with."""
        return name

    # -- helpers -----------------------------------------------------------------------------
    def skip(self, what: str, n: int = 1) -> None:
        """Count ``n`` things that cannot be carried; warn the first time."""
        if what not in self.skipped:
            log.warning("tracklane: migrate: the %s source cannot carry %s; skipping (counted)", self.name, what)
        self.skipped[what] += n

    def scratch(self) -> str:
        """A folder for downloaded or re-packed files, kept until the source is closed (lane actors on
        this node read artifact files from it while the migration is delivered)."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix=f"tracklane-migrate-{self.name}-")
        return self._scratch

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def option(options: Mapping[str, Any], name: str, source: str) -> str:
    """A command-line value the source needs, or ConfigError naming the flag."""
    value = options.get(name)
    if not value:
        raise ConfigError(f"--from {source} needs --{name.replace('_', '-')}")
    return str(value)

