"""Final export: the sharded model as a Hugging Face safetensors directory.

Weights are gathered one tensor at a time (`DTensor.full_tensor`, a collective every rank joins)
and only rank 0 keeps them, on the CPU, in the export dtype, writing a file whenever MAX_SHARD_BYTES
accumulate: peak extra memory is one full tensor per GPU and one file's worth on rank 0's host,
never the whole model. The result (config.json, model-0000i-of-0000n.safetensors + index, the
tokenizer) loads with `AutoModelForCausalLM.from_pretrained`. Rank 0 writes into a temporary
directory and renames it into place, so a crash never leaves a half-written export at
--output-dir.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from training.dist import DistEnv
from training.model import canonical_name

log = logging.getLogger(__name__)

MAX_SHARD_BYTES = 5 * 2**30


def export_hf(model: nn.Module, tokenizer, output_dir: str, dtype: torch.dtype,
              env: DistEnv) -> Path:
    out = Path(output_dir)
    tmp = out.with_name(out.name + ".tmp")
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # a tied weight: stored once, like save_pretrained does
            continue
        seen.add(id(tensor))
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if env.is_main:
            value = full.detach().to(device="cpu", dtype=dtype).contiguous()
            nbytes = value.numel() * value.element_size()
            if sizes[-1] and sizes[-1] + nbytes > MAX_SHARD_BYTES:
                shards.append({})
                sizes.append(0)
            shards[-1][canonical_name(name)] = value
            sizes[-1] += nbytes
        del full
    if env.is_main:
        _write(model, tokenizer, shards, sizes, dtype, tmp)
        old = out.with_name(out.name + ".old")
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        log.info("exported the model (%s, %.1f MB) to %s", str(dtype).removeprefix("torch."),
                 sum(sizes) / 2**20, out)
    dist.barrier()
    return out


def _write(model, tokenizer, shards, sizes, dtype, directory: Path) -> None:
    from safetensors.torch import save_file

    n = len(shards)
    names = (["model.safetensors"] if n == 1
             else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
    weight_map = {}
    for fname, shard in zip(names, shards):
        save_file(shard, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    if n > 1:
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": dict(sorted(
            weight_map.items()))}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = model.config
    config.dtype = dtype
    config.use_cache = True
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
