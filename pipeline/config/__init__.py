"""Internal. Typed settings read once at the edge: ``trainer.async_log``, record limits, placement, the console."""
