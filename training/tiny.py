"""The `tiny` model preset: a random 2-layer Llama and a byte-level tokenizer, built offline.

`materialize` writes it as an ordinary Hugging Face model directory (config.json, sharded
safetensors with an index, tokenizer files), so tests and the demo load it through exactly the
same meta-device / shard-by-shard path as a real Llama checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from training.export import Shards

VERSION = 2
"""Bump when the preset changes, so stale cached copies are not reused (2: chat template)."""

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
BYTE_OFFSET = 3
"""Token ids 0..2 are the special tokens; byte b is token b + 3, so the vocabulary is 259."""

LLAMA_KWARGS = dict(
    vocab_size=320,  # 259 used, padded to a multiple of 64
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention, like Llama-2-70B
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
SHARD_BYTES = 64 * 1024
"""Small on purpose: the preset's weights span several safetensors files and an index."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenizers use)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
"""Zephyr's chat format (HuggingFaceH4/zephyr-7b-beta's tokenizer_config.json) without its
newlines between turns: `<s><|user|>\\nHi</s><|assistant|>\\nHello</s>`. Each turn ends with
`</s>`, so an assistant turn's trained tokens are its text and `</s>`; offline chat data works
in tests and the demo."""


def build_tokenizer():
    """A byte-level tokenizer: every UTF-8 byte is one token; no training, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for b, ch in sorted(_bytes_to_unicode().items()):
        vocab[ch] = b + BYTE_OFFSET
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                        pad_token=PAD, model_max_length=LLAMA_KWARGS[
                                            "max_position_embeddings"])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def directory(cache_dir: str | None, seed: int) -> Path:
    root = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir())
    return root / "fsdp-eks-tiny" / f"v{VERSION}-seed{seed}"


def materialize(target: Path, seed: int) -> Path:
    """Write the preset to `target` (atomically: a half-written copy is never visible)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_KWARGS))
        shards = Shards(tmp, max_bytes=SHARD_BYTES)
        for name, tensor in model.state_dict().items():
            shards.add(name, tensor)
        shards.finish()  # not save_pretrained: it writes only on global rank 0
        model.config.save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another node sharing this cache won the race; its copy is identical
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
