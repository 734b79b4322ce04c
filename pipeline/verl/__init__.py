"""verl's extra loggers routed through ``Tracking``, and ``install()``: tracklane in place of verl's tracking classes."""
