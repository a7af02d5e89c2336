"""The training loss: summed next-token cross-entropy of a causal LM, computed by its root forward.

`install_loss_forward` makes the model's root `forward(input_ids, labels)` return the loss summed
over target tokens (labels == IGNORE_INDEX carry none), so FSDP2's root hooks (which gather the
embedding, final norm and output head) run around the whole computation, loss included.

Two implementations of the output head + loss:

- ``fused`` (default): a chunked linear + cross-entropy (`fused_linear_cross_entropy`) that never
  materialises the [tokens, vocab] logits of the whole batch. It walks the tokens in equal
  chunks of at most `CHUNK_ELEMENTS / vocab` rows and, for each chunk, computes the logits (bf16
  matmul, upcast to fp32 as the plain path does), the loss and the gradient of the loss sum with
  respect to the logits (softmax - one-hot, cast back to the compute dtype as autograd would;
  that arithmetic compiled on CUDA when the layers are). The logit gradients of a group of
  chunks (at most `GRAD_ELEMENTS`) are kept in bf16, and the gradients with respect to the
  hidden states and the head's weight are one matmul each over the group, already in forward.
  Backward only scales those by the incoming gradient. Same three matmuls as the plain path, no
  recomputation; peak extra memory one fp32 chunk, the group's bf16 logit gradients and the two
  gradients, instead of bf16 logits + fp32 logits + fp32 log-softmax + fp32 and bf16 gradients
  of the whole batch (at 3 x 4096 tokens and Llama 2's 32,000-word vocabulary: about 1.4 GB
  instead of about 4-5 GB). One matmul per group and not per chunk: at Llama 3's 128,256-word
  vocabulary a weight gradient per chunk summed in fp32 cost a 17 ms fp32 addition kernel of a
  405 ms step (16 layers, 2 x 4,096 tokens, H200; docs/benchmarks/h200-llama3/). Same idea as Liger-Kernel's fused linear cross-entropy, in
  plain PyTorch.
- ``plain``: the Hugging Face head, `.float()` on the full logits, `F.cross_entropy`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from training import attention
from training.dataset import IGNORE_INDEX

CHUNK_ELEMENTS = 2**27
"""Most logits per chunk of the fused loss (512 MiB in fp32): 3 chunks of 4,096 tokens for
3 x 4,096 tokens at a 32,000 vocabulary."""

GRAD_ELEMENTS = 2**30
"""Most logit gradients the fused loss holds at once (2 GiB in bf16): the gradients of the
hidden states and of the head's weight are then one matmul each over the group instead of one
per chunk. 2 x 4,096 tokens at Llama 3's 128,256-word vocabulary are one group (1.05e9); a
larger batch takes several, whose weight gradients are summed in fp32."""


def chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's summed cross-entropy and its gradient with respect to the logits (softmax -
    one-hot, zero on ignored targets), computed in fp32 and returned in the logits' dtype as
    autograd would. In place, so the eager path holds one fp32 copy of the chunk and its
    one-hot; compiled (`compile_chunk_loss`) the upcast, the log-sum-exp and the gradient are two
    kernels that read the bf16 logits instead of a dozen passes over their fp32 copy."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    valid = labels != IGNORE_INDEX
    target = labels.clamp(min=0).unsqueeze(1)
    loss = ((lse - x.gather(1, target).squeeze(1)) * valid).sum()
    grad = x.sub_(lse.unsqueeze(1)).exp_()
    grad.sub_((torch.arange(x.shape[1], device=x.device) == target).to(x.dtype))  # one-hot
    grad.mul_(valid.unsqueeze(1))
    return loss, grad.to(logits.dtype)


def compile_chunk_loss():
    """`chunk_loss_and_grad` compiled as the fused loss runs it when the model's layers are
    compiled on CUDA: the whole graph or an error, sizes symbolic so that every chunk size (the
    last chunk, evaluation batches) shares one kernel."""
    return torch.compile(chunk_loss_and_grad, dynamic=True, fullgraph=True)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """sum over valid tokens of CE(hidden @ weight.T, labels); gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                chunk: int, group: int, chunk_loss) -> torch.Tensor:
        n = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        summed = None if group >= n else torch.zeros(weight.shape, dtype=torch.float32,
                                                     device=weight.device)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for first in range(0, n, group):
            h = hidden[first:first + group]
            grad_logits = torch.empty((h.shape[0], weight.shape[0]), dtype=hidden.dtype,
                                      device=hidden.device)
            for start in range(0, h.shape[0], chunk):
                chunk_sum, grad = chunk_loss(h[start:start + chunk] @ weight.t(),
                                             labels[first + start:first + start + chunk])
                loss += chunk_sum
                grad_logits[start:start + chunk] = grad
                del grad
            torch.mm(grad_logits, weight, out=grad_hidden[first:first + group])
            grad_weight = grad_logits.t() @ h  # one product over the group, fp32 accumulation
            del grad_logits
            if summed is not None:
                summed += grad_weight  # summed in fp32 (type promotion: no fp32 copy)
        if summed is not None:
            grad_weight = summed.to(weight.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss.to(grad_hidden.dtype)
        return grad_hidden * scale, grad_weight * scale, None, None, None, None


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor,
                               labels: torch.Tensor, chunk_loss=chunk_loss_and_grad
                               ) -> torch.Tensor:
    """Summed cross-entropy of `hidden @ weight.T` against `labels` (any leading shape), in
    chunks of equal size (at most CHUNK_ELEMENTS logits each), their gradients gathered in
    groups of whole chunks (at most GRAD_ELEMENTS logits each, or one chunk)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    chunks = max(1, -(-h.shape[0] * weight.shape[0] // CHUNK_ELEMENTS))
    chunk = -(-h.shape[0] // chunks)
    group = chunk * max(1, GRAD_ELEMENTS // (chunk * weight.shape[0]))
    return _FusedLinearCrossEntropy.apply(h, weight, y, chunk, group, chunk_loss)


def _loss_forward(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor,
                  position_ids: torch.Tensor | None = None, *, fused: bool,
                  document_mask: bool, chunk_loss) -> torch.Tensor:
    # Position ids that restart per packed document: a block-causal BlockMask for FlexAttention,
    # else a dense block-diagonal causal mask; no position ids: no mask, the plain causal kernel
    # (training/attention.py). No cache, so none is built.
    mask = attention.attention_mask(position_ids, block=document_mask)
    hidden = model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                         use_cache=False).last_hidden_state
    head = model.get_output_embeddings()
    if fused:
        return fused_linear_cross_entropy(hidden, head.weight, labels, chunk_loss)
    logits = head(hidden)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def install_loss_forward(model: nn.Module, fused: bool, document_mask: bool = False,
                         compiled: bool = False) -> None:
    """Make `model(input_ids, labels[, position_ids])` return the summed token loss (see the module docstring).
    `document_mask`: packed rows (position ids given) attend block-causally through FlexAttention
    (`attention.use_document_mask`). `compiled`: the fused loss's per-chunk arithmetic runs
    compiled (`compile_chunk_loss`; for CUDA runs whose layers are compiled).

    An attribute on the instance, so parameter names, state_dict keys and checkpoints are those
    of the Hugging Face model; `nn.Module.__call__` still runs the hooks FSDP2 registers.
    """
    model.forward = functools.partial(
        _loss_forward, model, fused=fused, document_mask=document_mask,
        chunk_loss=compile_chunk_loss() if compiled else chunk_loss_and_grad)
