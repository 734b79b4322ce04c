"""What a lane actor is started with, as msgpack bytes (never pickle).

Ray keeps an actor's constructor arguments to restart it, so they hold no secret: settings
come from each sink's ``resolve()``, which leaves API keys to the actor's own environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from tracklane.core.acks import plain_counts
from tracklane.core.records import RunSpec


@dataclass(slots=True, kw_only=True, frozen=True)
class LaneOpening:
    backend: str
    """Backend name in the registry (host/registry.py)."""
    run: RunSpec
    settings: dict[str, Any]
    """The sink's resolved settings (plain values)."""
    state_dir: str
    """Folder of the lane's saved state (its stored watermark)."""
    sink_retries: int
    retry_backoff_s: float
    trainer_node: str = ""
    """Ray node id of the trainer: a lane on another node says so where it reports its paths."""
    priority: str | int = "normal"
    """CPU priority of the actor's process (``background_priority``: "idle", "normal" or a nice level)."""
    env: dict[str, str] = field(default_factory=dict)
    """Tracker settings from the trainer's environment (placement.lane_env: no secret), set in the actor's own
    before its SDK starts."""
    stored: dict[str, int] = field(default_factory=dict)
    """Rank 0's copy of what the tracker's store holds, per sender (a resumed run; the actor's own state may be
    on another node's disk, or gone)."""

    def pack(self) -> bytes:
        return msgpack.packb({
            "backend": self.backend, "run": self.run.to_plain(),
            "settings": self.settings, "state_dir": self.state_dir,
            "sink_retries": self.sink_retries, "retry_backoff_s": self.retry_backoff_s,
            "trainer_node": self.trainer_node, "stored": self.stored, "priority": self.priority, "env": self.env,
        }, use_bin_type=True)

    @classmethod
    def unpack(cls, blob: bytes) -> LaneOpening:
        spec = msgpack.unpackb(blob, raw=False)
        return cls(backend=spec["backend"], run=RunSpec.from_plain(spec["run"]), settings=spec["settings"],
                   state_dir=spec["state_dir"], sink_retries=int(spec["sink_retries"]),
                   retry_backoff_s=float(spec["retry_backoff_s"]), trainer_node=str(spec.get("trainer_node") or ""),
                   stored=plain_counts(spec.get("stored")), priority=spec.get("priority", "normal"),
                   env={str(k): str(v) for k, v in (spec.get("env") or {}).items()})
