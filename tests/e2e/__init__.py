"""End to end: the main job, the trainer, the benchmarks' quick runs, verl's own code side by side with tracklane
(Tracking, fit loops, Hydra, the oracles, rollout traces) and the vLLM engine."""
