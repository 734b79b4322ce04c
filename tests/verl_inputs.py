"""What the verl-oracle tests generate (hypothesis): ``log()`` keys and numbers, and configs, as users pass them.

Shared by test_verl_oracle.py (MLflow, TensorBoard) and test_verl_oracle_trackers.py (wandb, SwanLab, trackio,
ClearML): the same inputs go to verl 0.9.1's own ``Tracking`` and to tracklane's.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import numpy as np
import torch
from hypothesis import strategies as st

segment = st.text(st.sampled_from(list("ab_-: @#é%.")), min_size=1, max_size=5).filter(lambda s: s.strip(".") != "")
keys = st.lists(segment, min_size=1, max_size=3).map("/".join).filter(lambda key: not key.startswith("tracklane"))
"""Metric names with characters MLflow refuses (verl sanitises them), never tracklane's own."""
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**53), 2**53), st.booleans(),
    st.floats().map(np.float64), st.floats(width=32).map(np.float32), st.integers(-(2**53), 2**53).map(np.int64),
)
"""Python and numpy numbers, NaN and +-Inf among them."""
torch_scalars = st.one_of(
    st.floats(width=32).map(torch.tensor), st.floats().map(lambda x: torch.tensor(x, dtype=torch.float64)),
    st.floats(width=16).map(lambda x: torch.tensor(x, dtype=torch.bfloat16)),
    st.integers(-(2**31), 2**31 - 1).map(lambda i: torch.tensor(i, dtype=torch.int32)),
)
"""0-d tensors, as a trainer's loss or grad norm arrives."""


class Color(enum.Enum):
    RED = "red"
    SIZE = 3


@dataclasses.dataclass
class Optim:
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    name: str = "adam"


param_keys = st.text(st.sampled_from(list("abc_-. 1")), min_size=1, max_size=6).filter(
    lambda key: key.strip(".") != "" and key != "trainer" and not key.startswith((".", " ")) and key == key.strip())
param_values = st.one_of(
    st.integers(-(2**62), 2**62), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none(),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=10), st.sampled_from(list(Color)),
    st.builds(lambda name: Path("/data") / name, st.text(st.sampled_from(list("abc")), min_size=1, max_size=4)),
    st.builds(Optim, lr=st.floats(1e-6, 1.0), name=st.sampled_from(["adam", "sgd"])),
)
"""A config's leaves: numbers, bools, None, strings, Enums, Paths and dataclasses (with a tuple field)."""


def configs(leaves: st.SearchStrategy = param_values) -> st.SearchStrategy:
    """Nested configs (dicts and lists) of ``leaves``."""
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(param_keys, inner, max_size=3)),
                        max_leaves=10).filter(lambda c: isinstance(c, dict))
