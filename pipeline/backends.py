"""The edge: backend names -> sink classes and their settings, read once from the environment."""

from __future__ import annotations

import warnings
from typing import Any, Mapping

from workers.sink import BACKENDS, Sink, backend_class, check_installed

from .errors import ConfigError
from .records import RunSpec

_ALIASES = {"tracking": "wandb"}  # verl's deprecated name for wandb


def backend_names(default_backend: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Normalise verl's ``default_backend`` / ``trainer.logger``: a name or a list of names."""
    if default_backend is None:
        return []
    names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"backend names must be strings, got {name!r}; valid backends are: {', '.join(BACKENDS)}")
        if name in _ALIASES:
            warnings.warn(f"`{name}` logger is deprecated. use `{_ALIASES[name]}` instead.", DeprecationWarning, stacklevel=3)
            name = _ALIASES[name]
        if name not in out:
            out.append(name)
    return out


def resolve_backends(names: list[str], run: RunSpec, env: Mapping[str, str],
                     trainer: Mapping[str, Any]) -> dict[str, tuple[type[Sink], dict[str, Any]]]:
    """name -> (sink class, settings). Raises ValueError for an unknown name, ImportError for a missing SDK."""
    classes = {name: backend_class(name) for name in names}  # every name checked before anything starts
    for cls in classes.values():
        check_installed(cls)
    return {name: (cls, cls.resolve(run, env, trainer)) for name, cls in classes.items()}
