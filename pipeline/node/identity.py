"""Which Ray node this process is on ("" outside Ray): the label of its system metrics and lane notes."""

from __future__ import annotations

import sys


def ray_node_id() -> str:
    """The Ray node id of this process, or "" when Ray is not imported or not started here."""
    ray = sys.modules.get("ray")  # never imports Ray: a process without it is on no Ray node
    try:
        return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""
    except Exception:  # a Ray without a runtime context here (tests run the lane actor in-process)
        return ""
