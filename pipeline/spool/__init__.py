"""Internal. The durable log on the trainer's disk: segment files, the run manifest, lane states, recovery at open."""
