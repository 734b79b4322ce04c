"""Test helpers shipped with tracklane (like ``structlog.testing``): read back what each real tracker stored."""
