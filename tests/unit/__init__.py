"""The unit tier: no Ray, no tracker, no server (one check starts a bare interpreter), seconds in all: the buffer, the
codec, the converter, the spool, the sink host, reductions, the trainer's pure parts, the layering and the docs'
self-checks."""
