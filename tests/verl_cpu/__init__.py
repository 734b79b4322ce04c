"""Fixtures that let verl 0.9.1 run its own jobs on this CPU-only machine, loaded by verl's own mechanisms."""
