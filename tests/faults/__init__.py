"""Faults staged for real: SIGKILLed trainers, lane actors and producers, trackers down behind a cut proxy, full and
failing disks, power loss, a seeded chaos run."""
