"""The world-size-1 optimizer step alone, on the parameters of a --shape (training/shapes.py;
default Llama-2-7B) cut to --layers decoder layers (16: 3.5 B parameters of Llama 2, 4.5 B of
Llama 3, as the peer runs), timed per variant on the GPU:

- before: what the step cost before `training.optim` (bf16 gradients cast to fp32, then
  `clip_grad_norm_`, PyTorch's fused AdamW, and the next forward's weight casts);
- LocalAdamW: `training.optim.LocalAdamW.clip_and_step` as the trainer calls it;
- LocalAdamW with other forms of the update (VARIANTS), to choose between them; measured
  2026-12-01 on one H200 (docs/performance.md): before 55.8 ms, LocalAdamW with pow 33.3 ms,
  with exp2 (now optim.py's) 30.3 ms;
- LocalAdamW's update compiled with Inductor's own choice of launch configuration
  ("autotuned"): it benchmarks two block sizes at the first launch and keeps the faster for
  every later size, so the choice can differ from one process to the next.

    python docs/benchmarks/fused_step_bench.py [--shape llama3-8b] [--layers 16] [--steps 5]
        [--variants NAME,...] [--repeat N]

Each variant runs in a process of its own with Inductor's caches off (`--one` runs one), so
every variant compiles and chooses afresh; --repeat runs each that many times. One line per
run: milliseconds per optimizer step (CUDA events around --steps steps after 3 warm-up steps),
the bandwidth its bytes make, the elements each block of the update kernel takes (from the grid
of its launch on the largest parameter), and the largest weight difference from the 'before'
step after one step from the same state (relative to the largest weight; 'before' runs first
in each process only when it is measured or compared against).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU machine's copy

from training import optim  # noqa: E402
from training.shapes import SHAPES  # noqa: E402
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


def autotuned(update=adamw_update):
    """The update compiled as optim.py compiled it before its launch configuration was fixed:
    Inductor's default, which benchmarks candidate block sizes at the first launch."""
    return torch.compile(update, dynamic=True, fullgraph=True)


VARIANTS = {"optim.py": (adamw_update, compile_update),
            "autotuned": (adamw_update, autotuned),
            "pow": (update_pow, compile_update),
            "one-division": (update_one_division, compile_update)}
"""LocalAdamW with each form of the update and each way of compiling it, by --variants name."""


def shapes(shape: str, layers: int) -> list[tuple[int, ...]]:
    """The parameter shapes of `shape` cut to `layers` layers, in the model's order."""
    row = SHAPES[shape]
    h, kv, ffn = row.hidden, row.kv_width, row.intermediate
    block = [(h, h), (kv, h), (kv, h), (h, h), (ffn, h), (ffn, h), (h, ffn), (h,), (h,)]
    return [(row.vocab, h)] + block * layers + [(h,), (row.vocab, h)]


class Params(torch.nn.Module):
    def __init__(self, sizes: list[tuple[int, ...]], device: torch.device):
        super().__init__()
        gen = torch.Generator(device=device).manual_seed(0)
        self.ps = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(s, generator=gen, device=device) * 0.02)
            for s in sizes)


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


def local(model: Params, handed: Handed, update, compiler):
    optimizer = LocalAdamW(param_groups(model, 0.1), handed, lr=2e-5)
    optimizer._update = compiler(update)
    return lambda: optimizer.clip_and_step(MAX_NORM)


def elements_per_block(step, numel: int) -> int | None:
    """Elements per block of the update kernel: the largest parameter's numel over the grid of
    the widest Triton launch in one profiled step (None when the profile shows none)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    grids = [e.get("args", {}).get("grid", [0])[0] for e in _kernel_events(prof)
             if e["name"].startswith("triton_poi")]
    return -(-numel // max(grids)) if grids else None


def _kernel_events(prof) -> list[dict]:
    import json
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return [e for e in json.load(open(f.name))["traceEvents"] if e.get("cat") == "kernel"]


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


def one(args: argparse.Namespace, name: str) -> None:
    """One variant in this process: its time, launch configuration and difference."""
    device = torch.device("cuda")
    sizes = shapes(args.shape, args.layers)
    numel = sum(math.prod(s) for s in sizes)
    reference = scale = None
    if name == "before" or args.compare:
        ref_model = Params(sizes, device)
        ref_handed = Handed(ref_model)
        before(ref_model, ref_handed)()
        reference = [p.detach().clone() for p in ref_model.parameters()]
        scale = max(float(r.abs().max()) for r in reference)
        del ref_model, ref_handed
    model = Params(sizes, device)
    handed = Handed(model)
    if name == "before":
        step, bytes_per = before(model, handed), 52
    else:
        update, compiler = VARIANTS[name]
        step, bytes_per = local(model, handed, update, compiler), 30
    step()
    diff = "" if reference is None else " weights vs before %.1e" % (max(
        float((p.detach() - r).abs().max()) for p, r in zip(model.parameters(), reference)) / scale)
    ms = timed(step, args.steps)
    block = None if name == "before" else elements_per_block(step, max(map(math.prod, sizes)))
    print(f"{name:28s} {ms:7.2f} ms/step  {bytes_per} B/param  "
          f"{bytes_per * numel / ms / 1e9:5.2f} TB/s  {block} elements/block{diff}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variants", default=",".join(["before", *VARIANTS]),
                   help="comma-separated: before, " + ", ".join(VARIANTS))
    p.add_argument("--repeat", type=int, default=1, help="runs of each variant")
    p.add_argument("--compare", action="store_true",
                   help="also step 'before' from the same state and print the difference")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        return one(args, args.one)
    numel = sum(math.prod(s) for s in shapes(args.shape, args.layers))
    print(f"{numel / 1e9:.2f} B parameters, {args.shape} cut to {args.layers} layers", flush=True)
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    common = ["--shape", args.shape, "--layers", str(args.layers), "--steps", str(args.steps)]
    for name in args.variants.split(","):
        for _ in range(args.repeat):
            subprocess.run([sys.executable, __file__, *common, *(["--compare"] if args.compare
                                                               else []), "--one", name],
                           env=env, check=False)


if __name__ == "__main__":
    main()
