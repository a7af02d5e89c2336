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
registered here in transformers' attention interface and deliberately not as a mask builder:
transformers then builds no mask of its own and never looks at the position ids. (With a mask
builder, it checks every forward whether the position ids restart, and that check reads a value
back from the GPU: a host sync per step, after which the GPU waits for the host to queue the
rest of the step.) The loss forward (training/loss.py) passes the mask itself
(`attention_mask`): none for rows of one document each (the plain causal kernel, cuDNN on
H100/H200), one `BlockMask` per micro-batch for packed rows on the FlexAttention path
(`document_block_mask`), else the dense block-diagonal causal mask (`dense_document_mask`).
transformers hands a 4-D mask to every layer unchanged. The attention function runs
FlexAttention when it receives a `BlockMask`, and transformers' own SDPA function for anything
else. Weights, parameter names and checkpoints are those of the Hugging Face model; only the
forward's kernel differs.

CPU: FlexAttention has no backward on the CPU in torch 2.11 to 2.13, so CPU training keeps the
dense-mask SDPA path (the block mask is built only on CUDA: `use_document_mask`). Its forward
does run there (unfused), which is how the tests check that both paths give a packed document
the loss it has alone (tests/training/test_data.py).
"""

from __future__ import annotations

import torch

from training.errors import UserError

PACKED_ATTENTION = "packed_flex_sdpa"
"""The attention implementation the package builds its models with (see the module docstring)."""


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Per token, the index of its document in the row: a new document starts where the
    position id is 0 (the padding after the last document restarts too, so it is a document of
    its own, which no earlier token can attend to)."""
    return (position_ids == 0).cumsum(-1)


def dense_document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The block-causal mask of packed rows as SDPA's dense boolean mask [batch, 1, seq, seq]
    (True: attend): token q attends to token k when k <= q and both belong to the same
    document. The whole square is materialised and attention runs its masked kernel over it
    (the CPU's path, and --packed-attention sdpa)."""
    docs = document_ids(position_ids)
    seq = docs.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=docs.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def attention_mask(position_ids: torch.Tensor | None, block: bool):
    """The mask the loss forward passes to the model: None for rows of one document each (no
    position ids: positions 0..n-1 and the plain causal kernel), a `BlockMask` for packed rows
    on the FlexAttention path (`block`, `use_document_mask`), else the dense mask."""
    if position_ids is None:
        return None
    return document_block_mask(position_ids) if block else dense_document_mask(position_ids)


TILE = 128
"""FlexAttention's default block size: the granularity at which tiles are skipped."""


def document_block_mask(position_ids: torch.Tensor):
    """The block-causal `BlockMask` of packed rows: token q attends to token k when k <= q and
    both belong to the same document. Built on the device from the [batch, seq] position ids,
    once per micro-batch (shared by every layer), without a host sync.

    The tile tables come straight from the documents' ranges: document ids never decrease
    along a row, so a tile's first and last ids bound it. A (query tile, key tile) pair below
    the diagonal is empty when the key tile's last document precedes the query tile's first,
    full when both tiles lie inside one and the same document (and are whole tiles), partial
    otherwise (the mask function decides per element there). `create_block_mask` would
    evaluate the mask function on every element of the batch x seq x seq square instead
    (3.4 ms per micro-batch at 3 x 4,096 on an H200, compiled)."""
    from torch.nn.attention.flex_attention import BlockMask

    docs = document_ids(position_ids)

    def block_causal(b, h, q, kv):
        return (q >= kv) & (docs[b, q] == docs[b, kv])

    batch, seq = docs.shape
    tiles = -(-seq // TILE)
    padded = torch.cat([docs, docs[:, -1:].expand(batch, tiles * TILE - seq)], dim=1)
    first, last = padded[:, ::TILE], padded[:, TILE - 1::TILE]  # [batch, tiles]
    index = torch.arange(tiles, device=docs.device)
    below = index[None, :] <= index[:, None]  # [query tile, key tile]: causal
    strictly_below = index[None, :] < index[:, None]
    whole = (index + 1) * TILE <= seq
    touching = below & (last[:, None, :] >= first[:, :, None])
    single = (first == last) & whole
    full = (strictly_below & single[:, :, None] & single[:, None, :]
            & (first[:, :, None] == first[:, None, :]))

    def table(tiles_on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = tiles_on.sum(-1, dtype=torch.int32)
        order = torch.argsort((~tiles_on).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[:, None], order[:, None]  # one head dimension: the mask is per row

    partial_num, partial_idx = table(touching & ~full)
    full_num, full_idx = table(full)
    return BlockMask.from_kv_blocks(partial_num, partial_idx, full_num, full_idx,
                                    BLOCK_SIZE=TILE, mask_mod=block_causal,
                                    seq_lengths=(seq, seq))


def use_document_mask(choice: str, device: torch.device, compiled: bool) -> bool:
    """Whether the loss forward builds block masks: --packed-attention flex on a CUDA device
    (see the module docstring for the CPU) with compiled decoder layers. Uncompiled,
    FlexAttention falls back to an unfused kernel that materialises the whole score matrix
    (batch x heads x seq^2), slower and larger than the dense-mask path it replaces."""
    return choice == "flex" and device.type == "cuda" and compiled


def check_no_attention_dropout(document_mask: bool, config) -> None:
    """FlexAttention has no dropout: on its path (``document_mask``, `use_document_mask`) a
    model config with attention dropout is refused when the model is built, not at the first
    forward (after the weights are loaded and the layers compiled)."""
    dropout = getattr(config, "attention_dropout", 0.0)
    if document_mask and dropout:
        raise UserError(
            f"--packed-attention flex: the model's config.json sets attention_dropout {dropout}, "
            "which FlexAttention cannot apply; use --packed-attention sdpa (a dense mask, "
            "dropout applied), or a model directory whose config.json sets attention_dropout "
            "to 0")


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    """transformers' attention-function signature: FlexAttention for a `BlockMask`, else
    transformers' SDPA function. Returns (output [batch, seq, heads, head_dim], None)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    if dropout and module.training:  # an architecture whose dropout is not attention_dropout
        raise ValueError("--packed-attention flex does not support attention dropout; the "
                         "model's config sets it")
    out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register PACKED_ATTENTION with transformers' attention interface (idempotent) and return
    its name. Not as a mask builder: see the module docstring."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    return PACKED_ATTENTION
