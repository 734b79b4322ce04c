"""Figures that show the training loop is unaffected by logging."""
