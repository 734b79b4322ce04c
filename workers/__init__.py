"""tracklane's tracker side: one sink per tracker, the sink host both paths share, and the lane actor."""
