"""The world-size-1 optimizer step alone, on the parameters of the Llama-2-7B shape cut to
--layers decoder layers (16: 3.5 B parameters, as the peer runs), timed per variant on the GPU:

- before: what the step cost before `training.optim` (bf16 gradients cast to fp32, then
  `clip_grad_norm_`, PyTorch's fused AdamW, and the next forward's weight casts);
- LocalAdamW: `training.optim.LocalAdamW.clip_and_step` as the trainer calls it;
- LocalAdamW with other forms of the update (VARIANTS), to choose between them; measured
  2026-12-01 on one H200 (docs/performance.md): before 55.8 ms, LocalAdamW with pow 33.3 ms,
  with exp2 (now optim.py's) 30.3 ms.

    python docs/benchmarks/fused_step_bench.py [--layers 16] [--steps 5]

One line per variant: milliseconds per optimizer step (CUDA events around --steps steps after
3 warm-up steps), the bandwidth its bytes make, and its largest weight difference from the
'before' step after one step from the same state (relative to the largest weight).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU machine's copy

from training import optim  # noqa: E402
from training.optim import (  # noqa: E402
    LocalAdamW,
    adamw_moments,
    adamw_update,
    compile_update,
    param_groups,
)

MAX_NORM = 1.0


def update_pow(param, grad, exp_avg, exp_avg_sq, copy, lr, step, factor, beta1, beta2, eps,
               weight_decay):
    """The first form of adamw_update: beta ** step (libdevice's pow, per element)."""
    adamw_moments(param, grad, exp_avg, exp_avg_sq, lr, factor, beta1, beta2, weight_decay)
    denom = exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
    param.sub_(lr / (1 - beta1 ** step) * exp_avg / denom)
    copy.copy_(param)


def update_one_division(param, grad, exp_avg, exp_avg_sq, copy, lr, step, factor, beta1, beta2,
                        eps, weight_decay):
    """adamw_update rearranged to one division per element (rounds differently from torch)."""
    adamw_moments(param, grad, exp_avg, exp_avg_sq, lr, factor, beta1, beta2, weight_decay)
    bc1 = 1 - torch.exp2(step * math.log2(beta1))
    bc2_sqrt = (1 - torch.exp2(step * math.log2(beta2))).sqrt()
    param.sub_(exp_avg * (lr * bc2_sqrt / bc1) / (exp_avg_sq.sqrt() + eps * bc2_sqrt))
    copy.copy_(param)


VARIANTS = {"LocalAdamW (optim.py)": adamw_update, "LocalAdamW, pow": update_pow,
            "LocalAdamW, one division": update_one_division}


def shapes(layers: int, hidden=4096, ffn=11008, vocab=32000) -> list[tuple[int, ...]]:
    block = [(hidden, hidden)] * 4 + [(ffn, hidden)] * 2 + [(hidden, ffn)] + [(hidden,)] * 2
    return [(vocab, hidden)] + block * layers + [(hidden,), (vocab, hidden)]


class Params(torch.nn.Module):
    def __init__(self, layers: int, device: torch.device):
        super().__init__()
        gen = torch.Generator(device=device).manual_seed(0)
        self.ps = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(s, generator=gen, device=device) * 0.02)
            for s in shapes(layers))


class Handed:
    """Stands in for LocalMixedPrecision: the same bf16 gradients every step, and copies."""

    def __init__(self, model: Params):
        gen = torch.Generator(device=model.ps[0].device).manual_seed(1)
        self.grads = {p: (torch.randn(p.shape, generator=gen, device=p.device) * 1e-4).bfloat16()
                      for p in model.parameters()}
        self.copies = {p: p.detach().bfloat16() for p in model.parameters()}

    def grad_of(self, p):
        return self.grads[p]

    take_grad = grad_of  # the same gradients every step: kept

    def copy_for(self, p):
        return self.copies[p]

    def drop_grads(self):
        pass


def before(model: Params, handed: Handed):
    adamw = torch.optim.AdamW(param_groups(model, 0.1), lr=2e-5, betas=optim.BETAS, eps=optim.EPS,
                              fused=True)

    def step():
        for p in model.parameters():
            p.grad = handed.grads[p].float()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        adamw.step()
        adamw.zero_grad()
        for p in model.parameters():
            handed.copies[p] = p.detach().bfloat16()
    return step


def local(model: Params, handed: Handed, update):
    optimizer = LocalAdamW(param_groups(model, 0.1), handed, lr=2e-5)
    optimizer._update = compile_update(update)
    return lambda: optimizer.clip_and_step(MAX_NORM)


def timed(step, steps: int) -> float:
    for _ in range(3):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    device = torch.device("cuda")
    numel = sum(math.prod(s) for s in shapes(args.layers))
    ref_model = Params(args.layers, device)
    ref_handed = Handed(ref_model)
    before(ref_model, ref_handed)()
    reference = [p.detach().clone() for p in ref_model.parameters()]
    scale = max(float(r.abs().max()) for r in reference)
    del ref_model, ref_handed
    runs = {"before": (lambda m, h: before(m, h), 52)}
    runs.update({name: (lambda m, h, u=u: local(m, h, u), 30) for name, u in VARIANTS.items()})
    print(f"{numel / 1e9:.2f} B parameters, {args.layers} layers", flush=True)
    for name, (build, bytes_per) in runs.items():
        model = Params(args.layers, device)
        handed = Handed(model)
        step = build(model, handed)
        step()
        diff = max(float((p.detach() - r).abs().max()) for p, r in
                   zip(model.parameters(), reference)) / scale
        ms = timed(step, args.steps)
        print(f"{name:28s} {ms:7.2f} ms/step  {bytes_per} B/param  "
              f"{bytes_per * numel / ms / 1e9:5.2f} TB/s  weights vs before {diff:.1e}", flush=True)
        del model, handed, step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
