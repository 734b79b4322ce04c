"""Hyper-parameters: a trainer config made plain, secrets redacted, flattened for trackers.

``plain_config`` runs once on the trainer side; its result is what every sink gets
in ``RunSpec.params``, so no tracker ever sees a secret.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from pathlib import PurePath
from typing import Any

REDACTED = "***REDACTED***"
# A key is secret if it holds one of these words anywhere ("wandb_api_key", "db_password",
# "client_secret") or ends with "token" ("hf_token", "access_token"); "max_token_len" or
# "tokenizer" are ordinary settings and stay visible.
_SECRET_ANYWHERE = re.compile(r"api_?key|password|passwd|secret", re.IGNORECASE)
_SECRET_SUFFIX = re.compile(r"token$", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_ANYWHERE.search(key) or _SECRET_SUFFIX.search(key))


def plain_config(config: Any) -> dict[str, Any]:
    """A dict/OmegaConf/dataclass config as nested plain values, secrets replaced by ``REDACTED``."""
    if config is None:
        return {}
    container = _to_container(config)
    if not isinstance(container, dict):
        return {"config": _plain(container)}
    return _plain(container)


def _to_container(config: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    if isinstance(config, (DictConfig, ListConfig)):
        try:
            return OmegaConf.to_container(config, resolve=True)
        except Exception:  # an unresolvable interpolation must not stop the run
            return OmegaConf.to_container(config, resolve=False)
    return config


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): (REDACTED if is_secret_key(str(k)) else _plain(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):  # verl expands lists only: a tuple (a dataclass default) is one value, as MLflow
        return str(value)         # shows it ("(0.9, 0.999)"); OmegaConf configs hold lists
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


def flatten_params(params: dict[str, Any], sep: str = "/") -> dict[str, Any]:
    """Nested params -> one level, keys joined with ``sep``; lists expanded as verl does
    (``key/list_len`` plus ``key/0``, ``key/1``...). Beyond verl: an empty dict is kept as ``"{}"`` (verl's pandas
    flattening drops the key)."""
    out: dict[str, Any] = {}
    _flatten(out, "", params, sep)
    return out


def _flatten(out: dict[str, Any], prefix: str, value: Any, sep: str) -> None:
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix[: -len(sep)]] = "{}"
        for key, item in value.items():
            _flatten(out, f"{prefix}{key}{sep}", item, sep)
    elif isinstance(value, list):
        out[f"{prefix}list_len"] = len(value)
        for index, item in enumerate(value):
            _flatten(out, f"{prefix}{index}{sep}", item, sep)
    else:
        out[prefix[: -len(sep)]] = value

