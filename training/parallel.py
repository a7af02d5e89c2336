"""Parallelism: device mesh, then float8 linears, activation checkpointing, compile and FSDP2,
in that order.

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
"""

from __future__ import annotations

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


def compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    """--dtype auto: bf16 on CUDA, fp32 on CPU (gloo tests run in fp32)."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[setting]


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


def apply_float8(model: nn.Module) -> int:
    """Swap the decoder blocks' nn.Linear for torchao's Float8Linear (tensorwise dynamic
    scaling: each matmul's operands are scaled to float8 by their current absolute maximum).
    The output head stays in bf16, as torchao and torchtitan recommend. On the meta device,
    before AC, compile and fully_shard."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise UserError("--fp8 needs torchao (pip install torchao)") from None
    layers = decoder_layers(model)
    converted = 0
    for layer in layers:
        convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name("tensorwise"))
        converted += sum(type(m).__name__ == "Float8Linear" for m in layer.modules())
    if converted == 0:
        raise UserError("--fp8: torchao converted no nn.Linear of this model's decoder layers")
    return converted


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


def parallelize(model: nn.Module, cfg: ParallelConfig, mesh: DeviceMesh,
                param_dtype: torch.dtype, fp8: bool = False) -> dict[str, int]:
    """Apply float8, AC, compile and FSDP2 to a meta-device model; returns modules wrapped per
    step."""
    wrapped = {}
    if fp8:
        wrapped["float8_linears"] = apply_float8(model)
    layers = decoder_layers(model)
    if cfg.activation_checkpointing != "none":
        wrapped["activation_checkpointing"] = apply_activation_checkpointing(
            layers, cfg.activation_checkpointing)
    if cfg.compile:
        wrapped["compile"] = apply_compile(layers)
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    wrapped["fully_shard"] = apply_fsdp(model, layers, mesh,
                                        reshard_after_forward=cfg.sharding != "SHARD_GRAD_OP",
                                        mp_policy=mp_policy)
    return wrapped
