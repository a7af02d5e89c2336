"""Final export: the sharded model as a Hugging Face safetensors directory.

Weights are gathered one tensor at a time (`DTensor.full_tensor`, a collective every rank joins)
and only rank 0 keeps them, on the CPU, in the export dtype, writing a file whenever
MAX_SHARD_BYTES accumulate: peak extra memory is one full tensor per GPU and one file's worth
on rank 0's host, never the whole model. The result (config.json, model-0000i-of-0000n.safetensors + index, the
tokenizer) loads with `AutoModelForCausalLM.from_pretrained`. Rank 0 writes into a temporary
directory and renames it into place, so a crash never leaves a half-written export at
--output-dir. The previous content of --output-dir is deleted then, so the run refuses at its
start a directory that is not a previous export (`replace_problem`) or that holds its
checkpoints or metrics file (preflight.check_paths).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from training.dist import DistEnv
from training.model import WEIGHT_FILE, WEIGHT_INDEX, canonical_name

log = logging.getLogger(__name__)

MAX_SHARD_BYTES = 5 * 2**30


class Shards:
    """Writes tensors into safetensors files of at most `max_bytes`, each file as soon as it is
    full, so only one file's worth is ever held; `finish` gives the files Hugging Face's names
    (model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json).

    safetensors directly rather than save_pretrained: transformers' save_pretrained writes
    nothing on ranks other than 0 once torch.distributed is initialised."""

    def __init__(self, directory: Path, max_bytes: int = MAX_SHARD_BYTES):
        self.directory, self.max_bytes = directory, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[list[str]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + nbytes > self.max_bytes:
            self._flush()
        self.pending[name] = tensor
        self.pending_bytes += nbytes
        self.total_bytes += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        save_file(self.pending, str(self.directory / f"part-{len(self.files)}.safetensors"),
                  metadata={"format": "pt"})
        self.files.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        if self.pending or not self.files:
            self._flush()
        n = len(self.files)
        names = ([WEIGHT_FILE] if n == 1
                 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        weight_map = {}
        for i, (fname, keys) in enumerate(zip(names, self.files)):
            os.rename(self.directory / f"part-{i}.safetensors", self.directory / fname)
            weight_map.update({k: fname for k in keys})
        if n > 1:
            index = {"metadata": {"total_size": self.total_bytes},
                     "weight_map": dict(sorted(weight_map.items()))}
            (self.directory / WEIGHT_INDEX).write_text(
                json.dumps(index, indent=2))


def replace_problem(out: Path) -> str | None:
    """Why the export may not replace an existing directory ``out`` (it renames it aside and
    deletes it), or None: anything but a previous export, whose files (config.json and the
    weights among them, no subdirectory) it writes again."""
    if not out.is_dir():
        return None
    entries = sorted(p.name for p in out.iterdir())
    names = set(entries)
    if not entries or ("config.json" in names and names & {WEIGHT_FILE, WEIGHT_INDEX}
                       and all((out / e).is_file() for e in entries)):
        return None
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    return f"exists and is not a model export (it holds {shown})"


def export_hf(model: nn.Module, tokenizer, output_dir: str, dtype: torch.dtype,
              env: DistEnv) -> Path:
    out = Path(output_dir)
    tmp = out.with_name(out.name + ".tmp")
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    shards = Shards(tmp) if env.is_main else None
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # a tied weight: stored once, like save_pretrained does
            continue
        seen.add(id(tensor))
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if env.is_main:
            shards.add(canonical_name(name),
                       full.detach().to(device="cpu", dtype=dtype).contiguous())
        del full
    if env.is_main:
        shards.finish()
        config = copy.deepcopy(model.config)
        config.dtype = dtype
        config.use_cache = True
        config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        old = out.with_name(out.name + ".old")
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        log.info("exported the model (%s, %.1f MB) to %s", str(dtype).removeprefix("torch."),
                 shards.total_bytes / 2**20, out)
    dist.barrier()
    return out
