"""The exceptions tracklane raises, as one small tree.

    TracklaneError
    ├── ConfigError          bad Tracking arguments or trainer.async_log keys (also a ValueError)
    ├── MissingExtraError    a tracker SDK is not installed; names the pip extra (also an ImportError)
    ├── CodecError           an encoded batch is malformed, oversized or hostile (also a ValueError)
    └── SinkError            a tracker SDK failed; the SDK's exception is the __cause__
"""

from __future__ import annotations


class TracklaneError(Exception):
    """Base of every error tracklane raises on purpose."""


class ConfigError(TracklaneError, ValueError):
    """A constructor argument or a ``trainer.async_log`` key is invalid."""


class MissingExtraError(TracklaneError, ImportError):
    """A backend was asked for but its tracker SDK is not installed."""

    def __init__(self, backend: str, module: str, extra: str) -> None:
        super().__init__(
            f"backend {backend!r} needs the {module!r} package: pip install 'tracklane[{extra}]'"
        )
        self.backend = backend
        self.extra = extra


class CodecError(TracklaneError, ValueError):
    """An encoded batch could not be decoded safely."""


class SinkError(TracklaneError):
    """A tracker rejected a write, open or close."""
