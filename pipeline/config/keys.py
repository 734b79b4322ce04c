"""The one check every ``trainer.<section>`` reader makes first: no key the section does not have."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tracklane.core.errors import ConfigError


def refuse_unknown_keys(section: Mapping[str, Any], valid: Iterable[str], where: str) -> None:
    """ConfigError naming each key of ``section`` not in ``valid`` (as ``<where>.<key>``) and the valid ones."""
    valid = list(valid)
    unknown = sorted(set(section) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key(s) {where}.{f', {where}.'.join(unknown)}; valid keys: {', '.join(valid)}")
