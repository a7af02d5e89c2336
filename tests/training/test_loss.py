"""The fused chunked linear + cross-entropy (training/loss.py), checked against the plain
computation in float64: full logits, F.cross_entropy(reduction='sum'), autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training import loss as loss_mod
from training.dataset import IGNORE_INDEX


def _reference(hidden, weight, labels):
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    value = F.cross_entropy((h @ w.t()).flatten(0, 1), labels.flatten(),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    (value * 0.37).backward()
    return value, h.grad, w.grad


@pytest.mark.parametrize("chunk_elements,grad_elements,compiled", [
    (2**27, 2**30, False),  # one chunk
    (200, 2**30, False),    # many chunks, ragged tail, one group of gradients
    (200, 1000, False),     # many chunks in several groups (5 chunks of 4 rows each), ragged
    (200, 2**30, True),     # the compiled per-chunk arithmetic (Inductor's CPU backend)
])
def test_fused_matches_plain_float64(monkeypatch, chunk_elements, grad_elements, compiled):
    """Loss and both gradients (with an upstream scale of 0.37, as train_step applies) agree
    with the float64 reference to 1e-5 relative in fp32, also when the batch spans several
    chunks or several groups of logit gradients and some targets are ignored (the prompt
    mask), eager and compiled."""
    monkeypatch.setattr(loss_mod, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(loss_mod, "GRAD_ELEMENTS", grad_elements)
    chunk_loss = loss_mod.compile_chunk_loss() if compiled else loss_mod.chunk_loss_and_grad
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 37, 16, generator=gen, requires_grad=True)
    weight = (0.3 * torch.randn(50, 16, generator=gen)).requires_grad_()
    labels = torch.randint(0, 50, (3, 37), generator=gen)
    labels[0, :5] = IGNORE_INDEX
    labels[2, 30:] = IGNORE_INDEX
    value = loss_mod.fused_linear_cross_entropy(hidden, weight, labels, chunk_loss)
    (value * 0.37).backward()
    ref, ref_h, ref_w = _reference(hidden, weight, labels)
    rel = lambda a, b: float((a.double() - b).norm() / b.norm())  # noqa: E731
    assert abs(float(value.detach()) - float(ref.detach())) / float(ref.detach()) < 1e-5
    assert rel(hidden.grad, ref_h) < 1e-5
    assert rel(weight.grad, ref_w) < 1e-5


def test_all_ignored_gives_zero():
    """A batch whose targets are all ignored contributes no loss and no gradient."""
    hidden = torch.randn(2, 4, 8, requires_grad=True)
    weight = torch.randn(10, 8, requires_grad=True)
    labels = torch.full((2, 4), IGNORE_INDEX)
    value = loss_mod.fused_linear_cross_entropy(hidden, weight, labels)
    value.backward()
    assert float(value.detach()) == 0.0
    assert float(hidden.grad.abs().max()) == 0.0 and float(weight.grad.abs().max()) == 0.0
