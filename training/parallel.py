"""Parallelism: device mesh, then float8 linears, activation checkpointing, compile and FSDP2,
in that order; at world size 1, local mixed precision instead of FSDP2.

The four strategies of PyTorch FSDP, mapped onto FSDP2 (`fully_shard`):

- FULL_SHARD: 1-D mesh over all ranks; parameters re-sharded after forward
  (`reshard_after_forward=True`) and all-gathered again in backward.
- SHARD_GRAD_OP: same mesh; parameters stay gathered from forward to backward
  (`reshard_after_forward=False`): one all-gather per step instead of two, more memory.
- HYBRID_SHARD: 2-D mesh (replicate = nodes, shard = ranks of a node); parameters are sharded
  within a node and replicated across nodes, so the all-gathers stay on NVLink and only the
  gradient all-reduce crosses the network.
- NO_SHARD: the same HSDP machinery on a (world, 1) mesh: a shard group of one means every rank
  holds the whole model and gradients are all-reduced: plain data parallelism. We use this
  rather than `replicate`, which lives in the private `torch.distributed._composable`
  namespace; `fully_shard` on a 2-D mesh is public API in every torch version we support
  (2.11 to 2.13), and keeps one code path (and one checkpoint format) for all four strategies.

At world size 1 there is nothing to shard or reduce, but `fully_shard` still pays for it: per
layer and step a cast into the all-gather buffer, a one-rank all-gather, a copy out into the
unsharded parameters (twice with FULL_SHARD), and a copy of every gradient through the
reduce-scatter buffer. `LocalMixedPrecision` keeps the same training semantics (fp32 master
weights as the module's parameters, every parameter cast to the compute dtype for forward and
backward, gradients accumulated and handed to the optimizer in fp32) with one cast of each
parameter per step and one of each gradient. On one H200 it is what brought the 1-GPU step
level with or ahead of torchtitan's (docs/performance.md, "Beside torchtitan").
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config import ParallelConfig
from training.dist import DistEnv
from training.errors import UserError
from training.model import decoder_layers

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The parameters' dtype in forward and backward: --precision auto is bf16 on CUDA and fp32
    on CPU (gloo tests run in fp32); fp8 computes in bf16 outside its float8 matmuls."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES.get(precision, torch.bfloat16)


FLOAT8_CAPABILITY = (8, 9)
"""The first CUDA compute capability with float8 matmuls (Ada: L4/L40S; Hopper: H100/H200 is
9.0); the A100 of p4de is 8.0. torch._scaled_mm refuses anything older."""


def check_precision(precision: str, device: torch.device) -> None:
    """--precision fp8 on a GPU without float8 matmuls: refused before data, model download or
    weights (torch would fail only at the first forward, with a traceback)."""
    if precision != "fp8" or device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_CAPABILITY:
        raise UserError(
            f"--precision fp8 needs float8 matmuls (compute capability 8.9 or newer: H100, H200, "
            f"L4, L40S); this GPU is {torch.cuda.get_device_name(device)} (compute capability "
            f"{capability[0]}.{capability[1]}). Use --precision bf16 (stack key job.precision).")


def build_mesh(cfg: ParallelConfig, env: DistEnv) -> DeviceMesh:
    """The data-parallel mesh of the strategy: 1-D (shard) or 2-D (replicate, shard)."""
    world, kind = env.world_size, env.device.type
    if cfg.sharding in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return init_device_mesh(kind, (world,), mesh_dim_names=("shard",))
    if cfg.sharding == "NO_SHARD":
        return init_device_mesh(kind, (world, 1), mesh_dim_names=("replicate", "shard"))
    shard = cfg.hsdp_shard_size or env.local_world_size
    if world % shard != 0:
        raise UserError(
            f"--sharding HYBRID_SHARD cannot split {world} processes into shard groups of "
            f"{shard}: the world size must be a multiple of the shard group size. Set "
            "--hsdp-shard-size to a divisor of the world size (0 = processes per node) or run "
            "the same number of processes on every node.")
    return init_device_mesh(kind, (world // shard, shard), mesh_dim_names=("replicate", "shard"))


def apply_float8(model: nn.Module, recipe: str = "tensorwise",
                 fsdp_all_gather: bool = False) -> int:
    """Swap the decoder blocks' nn.Linear for torchao's Float8Linear with `recipe`'s dynamic
    scaling (each matmul's operands are scaled to float8 by their current absolute maximum: per
    tensor, or per row). The output head (and the embedding) stay in bf16, as torchao and
    torchtitan recommend: the head's 32k-wide output is where float8's range is least safe and
    it is 2 % of the matmul work. On the meta device, before AC, compile and fully_shard.

    `fsdp_all_gather` (world size > 1, tensorwise only: torchao has no float8 all-gather for
    row scales): FSDP all-gathers the float8 weights instead of bf16 (half the bytes) with
    scales computed for all weights at once after each optimizer step (`float8_post_step`), as
    torchtitan does for tensorwise scaling."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise UserError("--precision fp8 needs torchao (pip install torchao)") from None
    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather and recipe == "tensorwise":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    layers = decoder_layers(model)
    converted = 0
    for layer in layers:
        convert_to_float8_training(layer, config=config)
        converted += sum(type(m).__name__ == "Float8Linear" for m in layer.modules())
    if converted == 0:
        raise UserError("--precision fp8: torchao converted no nn.Linear of this model's decoder layers")
    return converted


def float8_post_step(model: nn.Module):
    """The optimizer post-step hook float8 all-gathers need (one all-reduce of every weight's
    absolute maximum for the next step's scales), or None when the model has none."""
    if not any(getattr(getattr(m, "config", None), "enable_fsdp_float8_all_gather", False)
               for m in model.modules() if type(m).__name__ == "Float8Linear"):
        return None
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return lambda *_: precompute_float8_dynamic_scale_for_fsdp(model)


def apply_activation_checkpointing(layers: nn.ModuleList, mode: str) -> int:
    """Wrap decoder layers to recompute activations in backward: all (full) or every 2nd."""
    every = {"full": 1, "selective": 2}[mode]
    if mode == "selective" and len(layers) == 1:  # it would wrap nothing
        raise UserError("--activation-checkpointing selective checkpoints every 2nd decoder "
                        "layer; this model has 1 layer: use full or none")
    wrapped = 0
    for i, layer in enumerate(layers):
        if (i + 1) % every == 0:
            layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
            wrapped += 1
    return wrapped


def apply_compile(layers: nn.ModuleList) -> int:
    """torch.compile each decoder layer in place (names of weights are unchanged)."""
    for layer in layers:
        layer.compile(fullgraph=False)
    return len(layers)


def apply_fsdp(model: nn.Module, layers: nn.ModuleList, mesh: DeviceMesh,
               reshard_after_forward: bool, mp_policy: MixedPrecisionPolicy) -> int:
    """fully_shard each decoder layer, then the root (embeddings, final norm, lm_head).

    The root is not re-sharded after forward: backward starts with it anyway.
    """
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy)
    return len(layers) + 1


class LocalMixedPrecision:
    """FSDP2's MixedPrecisionPolicy(param_dtype, reduce_dtype=float32) for a model that is not
    sharded (world size 1), without FSDP's buffers and collectives; paired with
    `optim.LocalAdamW`, which consumes its gradients and refreshes its copies.

    Between steps the module's parameters are the fp32 master weights (what the optimizer,
    checkpoints, the evaluation's callers and the export see). A forward pre-hook on the root
    swaps each parameter's data for its `param_dtype` copy: the one the optimizer wrote when it
    last updated the master, or a cast of the master the first time. Gradient-accumulation
    micro-batches reuse the copies. As each parameter's gradient is accumulated in backward,
    a hook keeps it for the optimizer (as computed when one micro-batch makes the step, else
    summed in fp32 over micro-batches, as FSDP's `reduce_dtype`) and, on the micro-batch that
    syncs (`set_requires_gradient_sync(True)`, as with FSDP), swaps the fp32 master back in.
    A forward without autograd (evaluation) swaps the masters back at its end. `.grad` stays
    None: a bf16 gradient cannot be the `.grad` of an fp32 parameter, and casting it would be
    one more pass over memory that the optimizer's kernel does for free.

    Invariant: a kept copy equals the master cast to `param_dtype`; only the optimizer writes
    the masters after the first forward, and it writes both. The arithmetic is FSDP's at world
    size 1: the same bf16 values in every matmul, the same gradients in fp32 (tested against
    the FSDP path in tests/training/test_units.py). Float8 linears cast the bf16 copies to
    float8, as they do under FSDP without float8 all-gathers; with them, FSDP casts the fp32
    shards directly. Which of the two a float8 linear starts from moved the final loss of the
    float8 convergence run by 0.3 %, a third of the bf16 run-to-run spread, while the copy the
    optimizer writes anyway saves a pass over every float8 weight and gradient per step
    (docs/performance.md, "float8 convergence on real text": one H200, 2026-12-01, JSONs in
    docs/benchmarks/h200-peer/call8/ and call9/).

    Memory: no fp32 gradient is allocated when one micro-batch makes the step, and a parameter
    holds its compute-dtype copy or its gradient, never both for long. The copy is dropped
    when the gradient is ready on the micro-batch that syncs (nothing reads it again before
    the optimizer writes the next one), and the optimizer takes each gradient as it writes that
    parameter's new copy (`take_grad`, `copy_for`). So a step's end holds 2 B per parameter of
    copies and gradients together, not 4 as when the copies were kept through backward, as
    FSDP frees a unit's unsharded weights after its backward.
    """

    def __init__(self, model: nn.Module, param_dtype: torch.dtype):
        self.model = weakref.ref(model)
        self.param_dtype = param_dtype
        self.params: list[nn.Parameter] = []  # taken at the first forward: `to_empty` replaces
        self.masters: dict[nn.Parameter, torch.Tensor] = {}  # swapped out: param -> fp32 data
        self.copies: dict[nn.Parameter, torch.Tensor] = {}  # swapped out: param -> its copy
        self.grads: dict[nn.Parameter, torch.Tensor] = {}  # for the optimizer, or summing
        self.sync = True
        model.register_forward_pre_hook(self._swap_in)
        model.register_forward_hook(self._after_forward)

    @torch.no_grad()
    def _swap_in(self, *_):
        if not self.params:  # the meta model's parameters, replaced when it was allocated
            self.params = [p for p in self.model().parameters() if p.requires_grad]
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)
        if self.masters:  # a later micro-batch of the same step: the copies are in place
            return
        for p in self.params:
            copy = self.copies.pop(p, None)
            self.masters[p] = p.data
            p.data = p.data.to(self.param_dtype) if copy is None else copy

    def _after_forward(self, *_):  # not under no_grad: it asks whether autograd is on
        if torch.is_grad_enabled():  # backward will swap each master back as its grad is ready
            return
        for p in self.params:
            if p in self.masters:
                self.copies[p] = p.data
                p.data = self.masters.pop(p)

    @torch.no_grad()
    def _grad_ready(self, p: nn.Parameter) -> None:
        grad, p.grad = p.grad, None
        total = self.grads.pop(p, None)
        if total is not None:
            grad = total.float().add_(grad)
        elif not self.sync:  # the first of several micro-batches: sum them in fp32
            grad = grad.float()
        self.grads[p] = grad
        if self.sync:  # the copy goes (class docstring: memory); the optimizer writes the next
            p.data = self.masters.pop(p)

    def grad_of(self, p: nn.Parameter) -> torch.Tensor | None:
        """The step's gradient of `p` (bf16 or fp32), once its last micro-batch is done."""
        return None if p in self.masters else self.grads.get(p)

    def take_grad(self, p: nn.Parameter) -> torch.Tensor | None:
        """`grad_of(p)`, no longer held here: the optimizer's reference is the last one."""
        return None if p in self.masters else self.grads.pop(p, None)

    def copy_for(self, p: nn.Parameter) -> torch.Tensor:
        """The compute-dtype tensor the optimizer writes `p`'s next copy into: the one kept
        (after an evaluation's forward) or a new one, kept for the next forward."""
        copy = self.copies.get(p)
        if copy is None:
            copy = self.copies[p] = torch.empty_like(p, dtype=self.param_dtype)
        return copy

    def drop_grads(self) -> None:
        self.grads.clear()

    def set_requires_gradient_sync(self, sync: bool) -> None:
        self.sync = sync


@dataclass(frozen=True)
class Parallelism:
    """What `parallelize` did to a model: the modules it wrapped, and which of the three paths
    the step takes (fully_shard; local mixed precision at world size 1; a plain fp32 model).
    Passed explicitly to whatever must know: the optimizer's builder, the step, the reports."""

    wrapped: dict[str, int]
    local: LocalMixedPrecision | None = None
    """The model's local mixed precision (world size 1 in bf16 or fp8)."""
    sharded: bool = False
    """The model is under fully_shard."""

    def strategy(self, sharding: str) -> str:
        """What the run's parameters are under, for reports: the --sharding strategy when FSDP
        wraps the model, else why there is none (one process)."""
        if self.sharded:
            return sharding
        if self.local is not None:
            return "none: local mixed precision (world size 1)"
        return "none: one process in fp32"

    def set_requires_gradient_sync(self, model: nn.Module, sync: bool) -> None:
        """Reduce (FSDP) or hand over (local mixed precision) gradients after this backward, or
        keep accumulating them: the same call for all paths."""
        if self.local is not None:
            self.local.set_requires_gradient_sync(sync)
        elif self.sharded:
            model.set_requires_gradient_sync(sync)
        # else: one process in fp32, nothing wrapped: autograd accumulates .grad in fp32 itself


def parallelize(model: nn.Module, cfg: ParallelConfig, mesh: DeviceMesh,
                param_dtype: torch.dtype, float8_recipe: str | None = None,
                fsdp_at_world_1: bool = False) -> Parallelism:
    """Apply float8 (when a `float8_recipe` is given), AC, compile and FSDP2 (or, on a mesh of
    one process, local mixed precision) to a meta-device model; returns what it did (modules
    wrapped per kind, the path). `fsdp_at_world_1` keeps fully_shard on one process (benchmarks
    compare the two)."""
    wrapped = {}
    if float8_recipe is not None:
        wrapped["float8_linears"] = apply_float8(model, float8_recipe,
                                                 fsdp_all_gather=mesh.size() > 1)
    layers = decoder_layers(model)
    if cfg.activation_checkpointing != "none":
        wrapped["activation_checkpointing"] = apply_activation_checkpointing(
            layers, cfg.activation_checkpointing)
    if cfg.compile:
        wrapped["compile"] = apply_compile(layers)
    if mesh.size() == 1 and not fsdp_at_world_1:
        if param_dtype == torch.float32:
            return Parallelism(wrapped)
        wrapped["local_mixed_precision"] = 1
        return Parallelism(wrapped, local=LocalMixedPrecision(model, param_dtype))
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    wrapped["fully_shard"] = apply_fsdp(model, layers, mesh,
                                        reshard_after_forward=cfg.sharding != "SHARD_GRAD_OP",
                                        mp_policy=mp_policy)
    return Parallelism(wrapped, sharded=True)
