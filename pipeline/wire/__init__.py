"""Internal. What travels between processes, as msgpack (+ zstd): batches, metric key tables, openings, acks."""
