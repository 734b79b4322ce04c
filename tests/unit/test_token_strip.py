"""trainer/token_strip.py: the strip of each picked row holds its valid response tokens only, in order, with their
rounded figures, the loss mask as a string of 0/1, and a non-finite figure as null (strict JSON)."""

from __future__ import annotations

import json
import math

import torch

from tracklane.trainer.token_strip import token_strips


class Letters:
    def decode(self, ids: list[int]) -> str:
        return "" if ids == [0] else chr(ord("a") + ids[0] - 1)


def test_each_picked_row_keeps_its_valid_tokens_and_figures():
    responses = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 0, 0, 0]])
    logp = torch.tensor([[-0.1234, -2.0, -0.5, 0.0], [-1.0, math.nan, 0.0, 0.0], [-3.0, 0.0, 0.0, 0.0]])
    entropy = torch.tensor([[0.5, 1.25, 0.75, 0.0], [0.1, 0.2, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, True, False], [True, True, False, False], [True, False, False, False]])
    strips = token_strips(Letters(), responses, logp, entropy, mask, valid, [0, 1])
    assert set(strips) == {0, 1}
    first, second = (json.loads(strips[row]) for row in (0, 1))
    assert first == {"tokens": ["a", "b", "c"], "logprob": [-0.123, -2.0, -0.5], "entropy": [0.5, 1.25, 0.75],
                     "loss_mask": "101"}
    assert second["tokens"] == ["d", "e"] and second["logprob"] == [-1.0, None] and second["loss_mask"] == "11"
    assert "NaN" not in strips[1]  # Python's json would read NaN; the page's JSON.parse would not
