"""Figures that show the training loop is unaffected by logging."""

import os

# Every Ray a benchmark starts binds 127.0.0.1: Ray reads this when it is first imported, which `python -m
# benchmarks.<name>` does after this package's __init__ (the harness's own setdefault came too late for its process).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
