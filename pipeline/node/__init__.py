"""Internal. Per-node services of the trainer's process: system metrics sampling and the terminal."""
