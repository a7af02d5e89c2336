"""The optimizer step: AdamW with gradient-norm clipping, and at world size 1 a fused variant
that also writes the next step's compute-dtype weights; and its learning-rate schedule.

With FSDP the step is PyTorch's fused AdamW after `clip_grad_norm_`. At world size 1 with
`parallel.LocalMixedPrecision` that sequence costs five passes over memory per parameter and step:
the bf16 gradient cast to fp32, the norm, the clipping multiply, AdamW, and the next forward's
cast of the fp32 weight to bf16 (60 ms of a 496 ms step on one H200, docs/performance.md).
`LocalAdamW` does the same arithmetic in two: the norm over the gradients as backward produced
them (accumulated in fp32), then one kernel per parameter that reads the gradient, applies the
clipping factor, updates the fp32 weight and both moments, and writes the weight's bf16 copy
for the next forward: 30 bytes per parameter instead of 52 (3.5 B parameters on one H200:
27.6 ms instead of 55.8, docs/benchmarks/fused_step_bench.py). Its state has AdamW's names
and shapes (`step`, `exp_avg`, `exp_avg_sq`), so checkpoints move between it and the FSDP
path at any world size.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from training.config import OptimConfig
from training.parallel import LocalMixedPrecision, float8_post_step

BETAS, EPS = (0.9, 0.95), 1e-8


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (not on norms and biases)."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device,
                    compiled: bool = True,
                    local: LocalMixedPrecision | None = None) -> torch.optim.Optimizer:
    """`LocalAdamW` for a model under the local mixed precision ``local`` (`Parallelism.local`;
    its update compiled on CUDA unless `compiled` is off, as --no-compile asks), else
    `ClippedAdamW` (fused on CUDA); float8 all-gathers' scales are computed after each step.
    Both take the step as ``clip_and_step(max_grad_norm)``."""
    groups = param_groups(model, cfg.weight_decay)
    if local is not None:
        return LocalAdamW(groups, local, lr=cfg.learning_rate, compiled=compiled)
    optimizer = ClippedAdamW(groups, model, lr=cfg.learning_rate, fused=device.type == "cuda")
    post_step = float8_post_step(model)
    if post_step is not None:
        optimizer.register_step_post_hook(post_step)
    return optimizer


class ClippedAdamW(torch.optim.AdamW):
    """PyTorch's AdamW, stepped after `clip_grad_norm_` over the model's parameters (in the
    model's order: the norm's summation order is the model's, as it always was)."""

    def __init__(self, params, model: nn.Module, lr: float, fused: bool = False):
        super().__init__(params, lr=lr, betas=BETAS, eps=EPS, fused=fused)
        self.model_params = list(model.parameters())

    def clip_and_step(self, max_grad_norm: float) -> torch.Tensor:
        """Scale the gradients to a global L2 norm of at most `max_grad_norm` (0: no
        clipping), take the step, and return the norm before clipping as a 0-d device tensor."""
        norm = torch.nn.utils.clip_grad_norm_(self.model_params, max_grad_norm or math.inf)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self.step()
        return norm


def clip_factor(norm: torch.Tensor, max_grad_norm: float) -> torch.Tensor | None:
    """What `clip_grad_norm_` multiplies the gradients by, or None when it would not clip."""
    if not max_grad_norm:
        return None
    return (max_grad_norm / (norm + 1e-6)).clamp(max=1.0)


def adamw_moments(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                  exp_avg_sq: torch.Tensor, lr: torch.Tensor, factor: torch.Tensor | None,
                  beta1: float, beta2: float, weight_decay: float) -> None:
    """AdamW's first half, in place: the gradient upcast to fp32 and scaled by the clipping
    factor, the decoupled weight decay, both moments (adamw_update's, and the benchmark's
    other forms of the update: docs/benchmarks/fused_step_bench.py)."""
    grad = grad.float()
    if factor is not None:
        grad = grad * factor
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)


def adamw_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                 exp_avg_sq: torch.Tensor, copy: torch.Tensor, lr: torch.Tensor,
                 step: torch.Tensor, factor: torch.Tensor | None, beta1: float, beta2: float,
                 eps: float, weight_decay: float) -> None:
    """One AdamW step of one parameter, in place, in torch's order of operations (decoupled
    decay, moments, bias-corrected update); the gradient is upcast to fp32 and scaled by the
    clipping factor on the way in, and `copy` receives the new weight in its dtype.
    On CUDA this compiles to a single kernel; `lr`, `step` and `factor` are 0-d device tensors
    so that neither a new learning rate nor a new step recompiles it or waits for the host."""
    adamw_moments(param, grad, exp_avg, exp_avg_sq, lr, factor, beta1, beta2, weight_decay)
    # beta ** step as exp2(step * log2(beta)): inside the kernel this is computed per element,
    # and libdevice's pow cost 10 % of the step on one H200 (benchmarks/fused_step_bench.py)
    step_size = lr / (1 - torch.exp2(step * math.log2(beta1)))
    denom = exp_avg_sq.sqrt() / (1 - torch.exp2(step * math.log2(beta2))).sqrt() + eps
    param.sub_(step_size * exp_avg / denom)
    copy.copy_(param)


def compile_update(update=adamw_update):
    """`update` (adamw_update's signature) compiled as LocalAdamW runs it on CUDA: the whole
    graph or an error, sizes symbolic so that every parameter shape shares one kernel, and one
    launch configuration fixed at compile time. Left to autotune, Inductor benchmarks two block
    sizes at the kernel's first launch and keeps the faster for every later size; on one H200
    two fresh processes kept different ones, and the update took 31.3 ms in one and 40.3 ms in
    the other (Llama-3 shape, 16 layers; docs/benchmarks/h200-llama3/)."""
    return torch.compile(update, dynamic=True, fullgraph=True,
                         options={"triton.autotune_pointwise": False})


class LocalAdamW(torch.optim.AdamW):
    """AdamW over the fp32 masters of a `LocalMixedPrecision` model, fused with clipping and
    with the cast of the next step's compute-dtype weights (module docstring). A subclass of
    PyTorch's AdamW for its parameter groups and state layout (the distributed checkpoint
    matches them key by key), with its own `step`.

    Gradients come from the model's local mixed precision (bf16 as backward produced them, or
    their fp32 sum over micro-batches), or from `.grad` when something else set it (PyTorch's
    distributed checkpoint initialises optimizer state with zero `.grad`s and a step at lr 0).
    """

    def __init__(self, params, local: LocalMixedPrecision, lr: float,
                 betas: tuple[float, float] = BETAS, eps: float = EPS, weight_decay: float = 0.0,
                 compiled: bool = True):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.local = local
        self.compiled = compiled
        self._factor: torch.Tensor | None = None
        self._update = adamw_update
        self._lrs: dict[int, torch.Tensor] = {}  # per group: the lr as a 0-d device tensor

    def _grad(self, p: nn.Parameter) -> torch.Tensor | None:
        grad = self.local.grad_of(p)
        return p.grad if grad is None else grad

    def _take(self, p: nn.Parameter) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient to apply and where the new compute-dtype weight goes: the local mixed
        precision's gradient (taken) and the copy it keeps for the next forward; or `.grad`,
        set from outside, and a copy nobody keeps (the distributed checkpoint's initialising
        step runs before it loads the weights, so a kept copy would be of the old ones)."""
        grad = self.local.take_grad(p)
        if grad is not None:
            return grad, self.local.copy_for(p)
        return p.grad, torch.empty_like(p, dtype=self.local.param_dtype)

    @torch.no_grad()
    def clip_and_step(self, max_grad_norm: float) -> torch.Tensor:
        """The global gradient norm (fp32, before clipping), then the step with the gradients
        scaled by `clip_factor` inside the update kernel."""
        grads = [g for group in self.param_groups for p in group["params"]
                 if (g := self._grad(p)) is not None]
        if not grads:
            raise RuntimeError("LocalAdamW.clip_and_step: no parameter has a gradient")
        norm = torch.linalg.vector_norm(
            torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
        del grads  # the step frees each gradient as it writes the parameter's new copy
        self._factor = clip_factor(norm, max_grad_norm)
        try:
            self.step()
        finally:
            self._factor = None
        return norm

    def _lr(self, index: int, group: dict, device: torch.device) -> torch.Tensor:
        lr = self._lrs.get(index)
        if lr is None or lr.device != device:
            lr = self._lrs[index] = torch.zeros((), dtype=torch.float32, device=device)
        return lr.fill_(group["lr"])  # a kernel argument: no host-to-device copy, no sync

    def _state(self, p: nn.Parameter) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif state["step"].device != p.device:  # loaded from a checkpoint onto the CPU
            state["step"] = state["step"].to(p.device, torch.float32)
        return state

    def _compile(self, device: torch.device) -> None:
        """On CUDA, the update as one compiled kernel per parameter (any size, no recompiles as
        sizes change; one variant per gradient dtype). Eager (a dozen kernels per parameter,
        same arithmetic) when compiling is off, and on CPU."""
        if self.compiled and device.type == "cuda" and self._update is adamw_update:
            self._update = compile_update()

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("LocalAdamW takes no closure")
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if self._grad(p) is not None]
            if not params:
                continue
            device = params[0].device
            self._compile(device)
            states = [self._state(p) for p in params]
            torch._foreach_add_([s["step"] for s in states], 1.0)
            lr = self._lr(index, group, device)
            beta1, beta2 = group["betas"]
            for p, state in zip(params, states):
                # taken, not looked up: each gradient is freed as its parameter's new copy is
                # made, so the step holds both for one parameter at a time
                grad, copy = self._take(p)
                # views: the kernel writes through them (reshape could copy and lose the writes)
                self._update(p.detach().view(-1), grad.reshape(-1), state["exp_avg"].view(-1),
                             state["exp_avg_sq"].view(-1), copy.view(-1), lr, state["step"],
                             self._factor, beta1, beta2, group["eps"], group["weight_decay"])
                del grad, copy
        self.local.drop_grads()  # any not taken: a parameter outside the optimizer's groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.local.drop_grads()


# ----------------------------------------------------------------------------- the schedule
class WarmupCosine:
    """LR factor: linear warm-up to 1 over `warmup` steps, cosine down to `min_ratio` at the
    last step. A callable object, so LambdaLR's state_dict carries its fields."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, done: int) -> float:
        if done < self.warmup:
            return (done + 1) / self.warmup
        progress = min(1.0, (done - self.warmup) / max(1, self.total - self.warmup - 1))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule: `WarmupCosine` ending at step `total`."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(cfg.warmup_steps, total, cfg.min_lr_ratio))


def set_horizon(scheduler: torch.optim.lr_scheduler.LambdaLR, total: int) -> None:
    """End the schedule at step ``total`` (after a resume: a new --max-steps or world size
    moves it) and set the learning rate of the next step accordingly."""
    schedule = scheduler.lr_lambdas[0]
    schedule.total = total
    for group, base_lr in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base_lr * schedule(scheduler.last_epoch)
