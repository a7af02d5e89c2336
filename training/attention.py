"""Attention for packed rows: block-causal FlexAttention on CUDA, PyTorch's SDPA otherwise.

A packed row holds several documents whose position ids restart at 0 (training/dataset.py).
Left to itself, transformers turns such position ids into a dense block-diagonal causal mask
of [batch, 1, seq, seq] booleans and runs a masked SDPA kernel over the whole square: no
flash or cuDNN kernel takes an arbitrary mask, and every block off the diagonal is computed and
then thrown away. FlexAttention (`torch.nn.attention.flex_attention`, compiled by Inductor into
one Triton kernel) instead takes a `BlockMask`: per 128 x 128 tile, whether it is empty, full
or partial. Empty tiles (every pair of tokens from two different documents) are skipped, so a
row of about 13 documents of 300 tokens costs about a tenth of the causal square.

How it plugs into transformers: the model is built with `attn_implementation=PACKED_ATTENTION`,
registered here in transformers' attention interface (and, for the mask, as SDPA's mask
builder). The loss forward (training/loss.py) builds one `BlockMask` per micro-batch from the
position ids (`document_block_mask`) and passes it as the model's `attention_mask`; transformers
hands a ready 4-D mask to every layer unchanged. The attention function runs FlexAttention when
it receives a `BlockMask`, and transformers' own SDPA function for anything else (no mask: a
plain causal kernel, cuDNN on H100/H200; a dense mask: the masked kernel, as before). Weights,
parameter names and checkpoints are those of the Hugging Face model; only the forward's kernel
differs.

CPU: FlexAttention has no backward on the CPU in torch 2.11 to 2.13, so CPU training keeps the
dense-mask SDPA path (the block mask is built only on CUDA: `use_document_mask`). Its forward
does run there (unfused), which is how the tests check that both paths give a packed document
the loss it has alone (tests/training/test_data.py).
"""

from __future__ import annotations

import torch

PACKED_ATTENTION = "packed_flex_sdpa"
"""The attention implementation the package builds its models with (see the module docstring)."""


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Per token, the index of its document in the row: a new document starts where the
    position id is 0 (the padding after the last document restarts too, so it is a document of
    its own, which no earlier token can attend to)."""
    return (position_ids == 0).cumsum(-1)


def document_block_mask(position_ids: torch.Tensor):
    """The block-causal `BlockMask` of packed rows: token q attends to token k when k <= q and
    both belong to the same document. Built on the device from the [batch, seq] position ids,
    once per micro-batch (shared by every layer), without a host sync."""
    from torch.nn.attention.flex_attention import create_block_mask

    docs = document_ids(position_ids)

    def block_causal(b, h, q, kv):
        return (q >= kv) & (docs[b, q] == docs[b, kv])

    batch, seq = position_ids.shape
    return create_block_mask(block_causal, batch, None, seq, seq, device=position_ids.device,
                             _compile=position_ids.device.type == "cuda")


def use_document_mask(choice: str, device: torch.device) -> bool:
    """Whether the loss forward builds block masks: --packed-attention flex on a CUDA device
    (see the module docstring for the CPU)."""
    return choice == "flex" and device.type == "cuda"


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    """transformers' attention-function signature: FlexAttention for a `BlockMask`, else
    transformers' SDPA function. Returns (output [batch, seq, heads, head_dim], None)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    if dropout and module.training:
        raise ValueError("--packed-attention flex does not support attention dropout; the "
                         "model's config sets it")
    out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register PACKED_ATTENTION with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, sdpa_mask)
    return PACKED_ATTENTION
