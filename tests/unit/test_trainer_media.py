"""What the trainer renders for the trackers: the KL heatmap, the gradient probe, the Markdown samples."""

from __future__ import annotations

import numpy as np
import torch

from tracklane.trainer.config import load_config
from tracklane.trainer.episode import Episode, ToolCall, Turn
from tracklane.trainer.gradients import GradientProbe, layer_of
from tracklane.trainer.heatmap import PAD_WHITE, TOOL_GREY, colormap, kl_heatmap
from tracklane.trainer.model import GPT
from tracklane.trainer.rewards import score_episodes
from tracklane.trainer.sample_text import markdown_sample
from tracklane.trainer.task import Problem
from tracklane.trainer.tool_task import ToolAdditionTask


def test_heatmap_cells_scale_and_bar():
    """One cell per token: tool tokens grey, padding white, the largest KL at the bright end, 0 at the dark end,
    and a scale bar running from dark to bright along the bottom."""
    kl = np.array([[0.0, 4.0, 1.0], [1.0, 0.0, 0.0]])
    policy = np.array([[True, True, False], [True, False, False]])
    valid = np.array([[True, True, True], [True, False, False]])
    image, top = kl_heatmap(kl, policy, valid, cell=4, bar=2)
    assert top == 4.0 and image.dtype == np.uint8 and image.shape == (2 * 4 + 1 + 2, 3 * 4, 3)
    cell = lambda r, c: tuple(image[r * 4 + 1, c * 4 + 1])  # noqa: E731
    assert cell(0, 0) == tuple(colormap(np.array(0.0))) and cell(0, 1) == tuple(colormap(np.array(1.0)))
    assert cell(1, 0) == tuple(colormap(np.array(0.5)))  # square-root scale: 1/4 of the top is half-way
    assert cell(0, 2) == TOOL_GREY and cell(1, 1) == PAD_WHITE and cell(1, 2) == PAD_WHITE
    assert tuple(image[-1, 0]) == tuple(colormap(np.array(0.0))) and tuple(image[-1, -1]) == tuple(colormap(np.array(1.0)))


def test_heatmap_with_no_policy_token_is_blank_not_an_error():
    """Nothing to colour (every token a tool's or padding): the image is drawn, its top is 0."""
    image, top = kl_heatmap(np.full((1, 2), np.nan), np.zeros((1, 2), bool), np.ones((1, 2), bool), cell=2)
    assert top == 0.0 and tuple(image[0, 0]) == TOOL_GREY


def test_gradient_probe_groups_layers_and_its_norms_match_torch():
    """Layers are the blocks, embeddings and final norm; each layer's gradient norm equals torch's over its
    parameters, the histograms hold every gradient and weight, and a probe is taken once a step."""
    cfg = load_config([])
    model = GPT(cfg.actor_rollout_ref.model, 19, 16)
    assert layer_of("transformer.h.1.attn.c_attn.weight") == "h.1" and layer_of("transformer.wte.weight") == "wte"
    assert layer_of("value_head.bias") == "value_head"
    probe = GradientProbe(model, "actor")
    ids = torch.randint(0, 19, (4, 8))
    hidden = model(ids, torch.arange(8).expand(4, 8), torch.ones(4, 1, 8, 8, dtype=torch.bool).tril())
    model.logits(hidden).square().mean().backward()
    assert probe.wanted
    probe.capture()
    assert not probe.wanted
    expected = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for n, p in model.named_parameters()
                                                   if n.startswith("transformer.h.0.")]))
    histograms, norms, seconds = probe.figures()
    assert set(norms) == {f"actor/grad_norm/{layer}" for layer in ("wte", "wpe", "h.0", "h.1", "ln_f")}
    assert abs(norms["actor/grad_norm/h.0"] - float(expected)) < 1e-5 * float(expected)
    params_h1 = sum(p.numel() for n, p in model.named_parameters() if n.startswith("transformer.h.1."))
    assert histograms["actor/gradients/h.1"].size == histograms["actor/weights/h.1"].size == params_h1
    assert seconds > 0 and probe.wanted  # ready for the next due step


def test_markdown_sample_shows_every_turn_the_call_and_the_rewards():
    """The Markdown names the data source, each turn in order, the call with its arguments and result, and a
    reward table whose score is the components' sum."""
    task = ToolAdditionTask(load_config([]).task, seed=0)
    tok = task.tokenizer
    call = [tok.id("<call>"), *tok.encode("37+48"), tok.id("</call>")]
    episode = Episode(task.prompt_ids(Problem(37, 48)),
                      turns=[Turn("assistant", call, is_call=True), Turn("tool", [tok.id("<tool>"), *tok.encode("85"),
                                                                                  tok.id("</tool>")]),
                             Turn("assistant", [*tok.encode("85"), tok.EOS])],
                      calls=[ToolCall("calculator", '{"expression": "37+48"}', "85", ok=True)], ended="answer")
    scored = score_episodes(task, [Problem(37, 48)], [episode], torch.device("cpu"))
    text = markdown_sample(task, 7, Problem(37, 48), episode, scored, 0, "best sample")
    assert text.startswith("### Step 7: best sample (tool_addition_2digit, 2 turn(s), ended: answer)")
    order = [text.index(part) for part in ("**user**: `37+48=`", "**assistant** (7 tokens): `<call>37+48</call>`",
                                           '**tool** `calculator({"expression": "37+48"})` -> `85`',
                                           "**assistant** (3 tokens): `85`")]
    assert order == sorted(order)
    assert "| correct | 1.00 |" in text and "| tool | 0.20 |" in text and "| **score** | **1.30** |" in text
