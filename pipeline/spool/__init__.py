"""The durable log on the trainer's disk: segment files, the run manifest, lane states, recovery at open.

Public here, for tools that read a spool (``tracklane inspect`` does the same): ``Spool`` (open one with
``readonly=True`` and read its batches) and ``RunManifest`` (what the folder says about its run). The modules
are internal.
"""

from tracklane.spool.manifest import RunManifest
from tracklane.spool.segments import Spool

__all__ = ["Spool", "RunManifest"]
