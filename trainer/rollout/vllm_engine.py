"""The vLLM rollout engine (optional, GPU only): the policy exported as a local GPT-2 model, weights synced each step.

NOT EXERCISED HERE: vLLM is not installed on the machines this project is built and tested on
(no GPU in CI, and vLLM is far too large to carry to the lent GPU machines), so this module has
never run. It is kept small and isolated behind the ``RolloutEngine`` interface; everything
around it is tested with the torch engine. Install with ``pip install vllm`` on a CUDA machine.

How it works, through vLLM's public API only:
* at start, the policy (GPT-2-shaped, see ``trainer.model``) is written to a temporary folder as
  a Hugging Face ``GPT2LMHeadModel`` (config.json + model.safetensors), and ``vllm.LLM`` loads
  that local path with ``skip_tokenizer_init=True`` (prompts go in as token ids);
* ``sync_weights()`` sends the policy's current tensors to the engine's workers with
  ``LLM.collective_rpc`` into ``WeightSync.load_policy_weights`` (a ``worker_extension_cls``, as in
  vLLM's RLHF examples), which calls the model's own ``load_weights``;
* ``generate()`` uses ``SamplingParams(n, temperature, max_tokens, logprobs=0, stop_token_ids=[eos])``.
Without vLLM or CUDA it refuses at construction with ``RolloutUnavailable``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from ..model import GPT
from .base import Rollout, RolloutUnavailable, left_pad, per_prompt, response_mask

_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_gpt2_weights(model: GPT) -> dict[str, torch.Tensor]:
    """The policy's tensors under GPT-2's names (HF's Conv1D stores [in, out], nn.Linear [out, in])."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("value_head"):
            continue
        out[name] = tensor.t().contiguous() if name.endswith(_TRANSPOSED) else tensor
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def hf_gpt2_config(model: GPT, tokenizer: Any) -> dict[str, Any]:
    cfg = model.cfg
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": model.vocab_size,
            "n_positions": model.block_size, "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "n_inner": 4 * cfg.n_embd, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "bos_token_id": tokenizer.BOS, "eos_token_id": tokenizer.EOS, "pad_token_id": tokenizer.PAD,
            "tie_word_embeddings": True, "torch_dtype": "float32"}


class WeightSync:
    """Runs inside vLLM's workers (``worker_extension_cls``): loads tensors sent by ``collective_rpc``."""

    def load_policy_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        self.model_runner.model.load_weights(weights=[(n, w.to(device)) for n, w in weights])  # type: ignore[attr-defined]


class VllmRollout:
    def __init__(self, model: GPT, tokenizer: Any, gpu_memory_utilization: float = 0.3) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise RolloutUnavailable("actor_rollout_ref.rollout.name=vllm needs vLLM: pip install vllm "
                                     "(CUDA only); or use actor_rollout_ref.rollout.name=torch")
        if not torch.cuda.is_available():
            raise RolloutUnavailable("actor_rollout_ref.rollout.name=vllm needs a CUDA GPU, and torch sees none; "
                                     "use actor_rollout_ref.rollout.name=torch")
        import vllm

        self.model, self.tokenizer = model, tokenizer
        self._dir = tempfile.mkdtemp(prefix="tracklane-vllm-")
        self._export()
        self.llm = vllm.LLM(model=self._dir, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=model.block_size,
                            worker_extension_cls=f"{__name__}.WeightSync")

    def _export(self) -> None:
        from safetensors.torch import save_file

        with open(os.path.join(self._dir, "config.json"), "w") as handle:
            json.dump(hf_gpt2_config(self.model, self.tokenizer), handle)
        weights = {k: v.detach().cpu().contiguous() for k, v in hf_gpt2_weights(self.model).items()}
        weights.pop("lm_head.weight")  # tied: safetensors refuses shared tensors
        save_file(weights, os.path.join(self._dir, "model.safetensors"))

    def sync_weights(self) -> None:
        weights = [(n, t.detach().cpu()) for n, t in hf_gpt2_weights(self.model).items() if n != "lm_head.weight"]
        self.llm.collective_rpc("load_policy_weights", args=(weights,))

    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int | Sequence[int], temperature: float,
                 stop_ids: Sequence[int] = ()) -> Rollout:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        tok = self.tokenizer
        limits = per_prompt(max_new_tokens, len(prompts))
        params = [SamplingParams(n=n, temperature=temperature, max_tokens=limit, logprobs=0,
                                 stop_token_ids=[tok.EOS, *stop_ids], detokenize=False) for limit in limits]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        device = next(self.model.parameters()).device
        ids, valid = left_pad([p for p in prompts for _ in range(n)], tok.PAD, device)
        responses = torch.full((len(prompts) * n, max(limits)), tok.PAD, dtype=torch.long)
        logprobs = torch.zeros(len(prompts) * n, max(limits))
        for i, output in enumerate(outputs):
            for j, sample in enumerate(output.outputs):
                row, token_ids = i * n + j, list(sample.token_ids)[:limits[i]]
                responses[row, :len(token_ids)] = torch.tensor(token_ids, dtype=torch.long)
                for t, (token, entry) in enumerate(zip(token_ids, sample.logprobs or [], strict=False)):
                    logprobs[row, t] = entry[token].logprob
        responses, logprobs = responses.to(device), logprobs.to(device)
        mask = response_mask(responses, [tok.EOS, *stop_ids], torch.tensor(limits, device=device).repeat_interleave(n))
        return Rollout(prompts=ids, prompt_valid=valid, responses=responses, response_mask=mask,
                       logprobs=logprobs * mask, n=n)
