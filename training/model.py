"""Llama-family models: built on the meta device, weights read shard by shard.

Memory: no process ever holds the full model. The model is created on the meta device (no
storage), sharded by FSDP2, given storage for its own shards only (`to_empty`), and then each
rank reads from the safetensors files (memory-mapped) exactly the rows of each tensor that its
shard holds. Peak host memory per rank is therefore one shard of the model, plus the page cache
the node's ranks share; nothing is broadcast.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from training import attention
from training.errors import UserError

log = logging.getLogger(__name__)

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")
"""Name parts added by activation-checkpoint and compile wrappers; not part of a weight's name."""
WEIGHT_FILE = "model.safetensors"
"""Hugging Face's name for the weights of a model in one file."""
WEIGHT_INDEX = "model.safetensors.index.json"
"""Hugging Face's map of weight names to the safetensors files of a sharded model."""


def canonical_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def build_meta_model(model_dir: Path) -> nn.Module:
    """The causal LM of `model_dir`'s config, on the meta device, fp32 (the master weights)."""
    from transformers import AutoConfig

    return meta_model_from_config(AutoConfig.from_pretrained(model_dir))


def meta_model_from_config(config) -> nn.Module:
    """The causal LM of a Hugging Face config, on the meta device, fp32 (the benchmark's path).
    Its attention is training/attention.py's: SDPA, or FlexAttention where a block mask is
    passed."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation=attention.register())
    model.config.use_cache = False
    decoder_layers(model)  # fail early on an unsupported layout
    return model


SDPA_PRIORITY = {
    "cudnn": ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
    "flash": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
    "efficient": ("EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"),
}
"""Backend priority per --sdpa-backend; each falls back to the next when it cannot run a call."""
_SDPA_CONTEXT = contextlib.ExitStack()


def set_sdpa_backend(name: str, device: torch.device) -> None:
    """Make `name` the first choice of scaled_dot_product_attention for this process (CUDA only).

    torch keeps the backend flags and their priority process-wide, so the public `sdpa_kernel`
    context is entered once and left open; compiled blocks read it when they are traced. 'auto'
    leaves torch's own order (flash attention first on Hopper in torch 2.11 to 2.13).
    """
    if device.type != "cuda" or name == "auto":
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [getattr(SDPBackend, b) for b in SDPA_PRIORITY[name]]
    _SDPA_CONTEXT.enter_context(sdpa_kernel(order, set_priority=True))


@torch.no_grad()
def init_random_(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Random weights for an allocated (sharded) model, as Llama initialises them: matrices
    N(0, std), norm weights 1. Each rank fills its own shards from one stream of its own, drawn
    on in parameter order (benchmarks)."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    shards = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    if not shards:
        return
    gen = torch.Generator(device=shards[0].device).manual_seed(seed * 100003 + rank)
    for local in shards:
        if local.numel() == 0:
            continue
        if local.ndim >= 2:
            local.normal_(0.0, std, generator=gen)
        else:
            local.fill_(1.0)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks (`model.model.layers`, the layout of Llama, Mistral, Qwen2 ...)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise UserError(f"--model: {type(model).__name__} has no decoder layers at "
                        "model.model.layers; only Llama-style causal LMs are supported")
    return layers


def allocate(model: nn.Module, device: torch.device) -> None:
    """Give the (sharded) meta model real storage on `device` and rebuild computed buffers.

    `to_empty` leaves every tensor uninitialised; parameters are then loaded from the
    checkpoint, but non-persistent buffers (the rotary embedding's inverse frequencies) are not
    in any checkpoint, so they are recomputed by constructing the module again from its config.
    """
    model.to_empty(device=device)
    for module in model.modules():
        if "RotaryEmbedding" in type(module).__name__ and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name, buf in fresh.named_buffers(recurse=False):
                getattr(module, name).copy_(buf)


def _local_slices(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The region of the global tensor that this rank's local shard holds.

    FSDP2 shards with torch.chunk semantics (ceil-sized chunks, trailing ranks may be empty);
    nested Shard placements on one dim compose.
    """
    shape = list(tensor.shape)
    if not isinstance(tensor, DTensor):
        return tuple(slice(0, n) for n in shape)
    offsets = [0] * len(shape)
    coordinate = tensor.device_mesh.get_coordinate()
    assert coordinate is not None, "rank is not part of the parameter's mesh"
    for mesh_dim, placement in enumerate(tensor.placements):
        if placement.is_shard():
            dim, parts = placement.dim, tensor.device_mesh.size(mesh_dim)
            chunk = math.ceil(shape[dim] / parts)
            start = min(coordinate[mesh_dim] * chunk, shape[dim])
            offsets[dim] += start
            shape[dim] = min(chunk, shape[dim] - start)
        else:
            assert placement.is_replicate(), f"unexpected placement {placement}"
    local_shape = tuple(tensor.to_local().shape)
    assert tuple(shape) == local_shape, f"computed shard {shape} != local shard {local_shape}"
    return tuple(slice(o, o + n) for o, n in zip(offsets, shape))


def model_dir_problem(model_dir: Path) -> str | None:
    """What makes a model directory unusable, or None: a JSON file (config, weight index,
    tokenizer files) that does not parse, a config.json or tokenizer transformers cannot
    load (the tokenizer files missing), an index
    without its weight map, or a weight file it names that is missing or whose safetensors
    header does not read (empty, or shorter than the header says: a truncated copy or
    download). Only the headers are read, not the weights. No weights at all is
    `_weight_files`' UserError."""
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoTokenizer

    for path in sorted(model_dir.glob("*.json")):
        try:
            json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            return f"{path.name} is not readable JSON ({e})"
    try:
        AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as e:
        return f"config.json is not a configuration transformers reads ({_one_line(e)})"
    try:
        AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as e:
        return f"its tokenizer does not load ({_one_line(e)})"
    try:
        files = _weight_files(model_dir)
    except (AttributeError, KeyError, TypeError):
        return f"{WEIGHT_INDEX} has no weight_map of weight names to files"
    for path in files:
        if not path.is_file():
            return f"{path.name}, named in {WEIGHT_INDEX}, is missing"
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                f.keys()
        except (SafetensorError, OSError) as e:
            return f"{path.name} is not a readable safetensors file ({e})"
    return None


def _one_line(e: Exception, limit: int = 300) -> str:
    """A library's multi-line message as one line of at most ``limit`` characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / WEIGHT_INDEX
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    single = model_dir / WEIGHT_FILE
    if single.exists():
        return [single]
    raise UserError(f"--model: no {WEIGHT_FILE} or {WEIGHT_INDEX} in "
                    f"{model_dir}")


@torch.no_grad()
def load_weights(model: nn.Module, model_dir: Path) -> int:
    """Copy this rank's shard of every weight from `model_dir`'s safetensors; returns bytes read.

    Each rank reads only its own rows (safetensors slices over a memory map). Tied weights
    (e.g. an lm_head tied to the embedding) may be absent from the files.
    """
    from safetensors import safe_open

    wanted = {canonical_name(k): v for k, v in model.state_dict().items()}
    tied = {canonical_name(k) for k in _tied_keys(model)}
    read = 0
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                target = wanted.pop(key, None)
                if target is None:
                    if key in tied:
                        continue
                    raise UserError(f"--model: weight {key} in {path.name} does not belong to "
                                    f"{type(model).__name__}; is config.json from the same model?")
                stored = f.get_slice(key)
                if tuple(stored.get_shape()) != tuple(target.shape):
                    raise UserError(f"--model: weight {key} has shape {stored.get_shape()}, "
                                    f"the model expects {list(target.shape)}; is config.json "
                                    "from the same model?")
                local = target.to_local() if isinstance(target, DTensor) else target
                if local.numel() == 0:
                    continue
                piece = stored[_local_slices(target)]
                local.copy_(piece)
                read += piece.numel() * piece.element_size()
    missing = sorted(set(wanted) - tied)
    if missing:
        raise UserError(f"--model: {len(missing)} weights missing from {model_dir}, e.g. "
                        f"{missing[:3]}")
    return read


def _tied_keys(model: nn.Module) -> set[str]:
    """Names of parameters that share storage with another parameter (counted once)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        else:
            seen[id(p)] = name
    return tied


def warn_beyond_context(seq_len: int, config) -> None:
    """A --seq-len beyond the positions the model was trained at (config.json's
    max_position_embeddings) without RoPE scaling in its config: it trains, but the positions
    beyond are untrained (preview says the same from training/shapes.py's table)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    trained = getattr(config, "max_position_embeddings", None)
    if trained and seq_len > trained and rope.get("rope_type", "default") == "default":
        log.warning("--seq-len %d: the model was trained at %d positions and its config.json "
                    "sets no RoPE scaling, so positions beyond %d are untrained and quality "
                    "drops; this package has no RoPE-scaling option: use --seq-len %d or less, "
                    "or a model whose config.json sets rope_scaling", seq_len, trained, trained,
                    trained)
