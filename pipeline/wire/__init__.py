"""What travels between processes, as msgpack (+ zstd, never pickle): batches, metric key tables, openings, acks.

Public here, for tools that read or write a spool's batches: ``encode_batch``, ``decode_batch`` and the
``Batch`` and record types they carry. The modules are internal.
"""

from tracklane.core.records import Batch, Metrics
from tracklane.wire.batch import decode_batch, encode_batch

__all__ = ["encode_batch", "decode_batch", "Batch", "Metrics"]
