"""What a spool folder says about its run: enough to deliver it again without the trainer.

``run.msgpack`` beside the segments: the run (project, experiment, id, hyper-parameters, already
redacted), each backend's resolved settings (plain values, no secret: the same as a lane actor is
started with) and, once ``finish()`` answered, the exit code the runs were closed with. Lane actors
keep their acknowledgement state in ``lanes/<backend>.state`` (lane_state.py) in the same folder.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from tracklane.core.errors import ConfigError
from tracklane.core.files import write_atomically
from tracklane.core.records import RunSpec

MANIFEST = "run.msgpack"
LANES = "lanes"
VERSION = 1


@dataclass(slots=True, kw_only=True)
class RunManifest:
    run: RunSpec
    backends: dict[str, dict[str, Any]]
    """Backend name -> its sink's resolved settings."""
    created: float = field(default_factory=time.time)
    exit_code: int | None = None
    """What finish() closed the trackers with; None while the run is live, or if it crashed."""

    def save(self, directory: str) -> None:
        write_atomically(os.path.join(directory, MANIFEST), msgpack.packb({
            "version": VERSION, "created": self.created, "exit_code": self.exit_code, "backends": self.backends,
            "run": self.run.to_plain(),
        }, use_bin_type=True))

    @classmethod
    def load(cls, directory: str) -> RunManifest:
        path = os.path.join(directory, MANIFEST)
        try:
            with open(path, "rb") as handle:
                data = msgpack.unpackb(handle.read(), raw=False)
            return cls(run=replace(RunSpec.from_plain(data["run"]), resume=True),  # delivering it again continues it
                       backends={str(k): dict(v) for k, v in data["backends"].items()},
                       created=float(data["created"]), exit_code=data.get("exit_code"))
        except FileNotFoundError:
            raise ConfigError(f"{directory} is not a tracklane spool (no {MANIFEST})") from None
        except Exception as exc:  # a damaged manifest: say so, do not guess
            raise ConfigError(f"the spool manifest {path} cannot be read: {type(exc).__name__}: {exc}") from exc


def lanes_dir(directory: str) -> str:
    return os.path.join(directory, LANES)


def state_path(directory: str, backend: str) -> str:
    return os.path.join(lanes_dir(directory), f"{backend}.state")


def stored_copy_path(directory: str, backend: str) -> str:
    """Rank 0's copy of a lane's state (what its acknowledgements said), for a lane whose own is on another node.
    A spool written before this name holds it as ``<backend>.seen``: read from there while there is no other."""
    path = os.path.join(lanes_dir(directory), f"{backend}.stored")
    old = os.path.join(lanes_dir(directory), f"{backend}.seen")
    return old if not os.path.exists(path) and os.path.exists(old) else path


def default_spool_dir(run: RunSpec, trainer: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Under the run's local output folder (verl's ``trainer.default_local_dir``) when the config has one,
    else under ``$TRACKLANE_SPOOL_ROOT`` or ``./tracklane_spool``; one folder per run id."""
    local = trainer.get("default_local_dir")
    if local:
        return os.path.abspath(os.path.join(str(local), "tracklane_spool", run.run_id))
    root = env.get("TRACKLANE_SPOOL_ROOT") or "tracklane_spool"
    return os.path.abspath(os.path.join(root, run.project, run.experiment, run.run_id))


def holds_a_spool(directory: str) -> bool:
    """Whether ``directory`` holds an earlier run's spool (its manifest or a segment)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(n == MANIFEST or n.startswith("seg-") for n in names)
