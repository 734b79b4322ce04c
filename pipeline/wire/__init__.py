"""What travels between processes, as msgpack (+ zstd, never pickle): batches, metric key tables, openings, acks.

Public here, for tools that read or write a spool's batches: ``encode_batch``, ``decode_batch`` and the
``Batch`` and record types they carry. The modules are internal.
"""

from pipeline.core.records import Batch, Metrics
from pipeline.wire.batch import decode_batch, encode_batch

__all__ = ["encode_batch", "decode_batch", "Batch", "Metrics"]
