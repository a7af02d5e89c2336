"""One typed job config: nested frozen dataclasses, and the command line built from them.

Each field's attribute docstring is its ``--help`` text, each field name is its flag
(``seq_len`` -> ``--seq-len``), so defaults and documentation live in exactly one place.
A user mistake raises ``ValueError`` naming the flag to change; ``build_parser`` turns that into
an argparse usage error.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TINY_MODEL = "tiny"
SHIPPED_DATASET = str(Path(__file__).resolve().parent / "data" / "instructions.jsonl")

Sharding = Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]
ActivationCheckpointing = Literal["none", "full", "selective"]
ComputeDtype = Literal["auto", "bf16", "fp32"]
ExportDtype = Literal["bf16", "fp32"]
SdpaBackend = Literal["auto", "cudnn", "flash", "efficient"]
LossImpl = Literal["fused", "plain"]


def flag(name: str) -> str:
    """The command-line flag of a config field."""
    return "--" + name.replace("_", "-")


def _check(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise ValueError(f"{flag(name)}: {problem}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Model: which weights to fine-tune and in which precision."""

    model: str = TINY_MODEL
    """Hugging Face model id (e.g. meta-llama/Llama-2-7b-hf), a local directory holding
    config.json and *.safetensors, or 'tiny' (a random 2-layer Llama and a byte tokenizer,
    built offline, for tests and the demo)."""

    cache_dir: str | None = None
    """Download cache for Hugging Face models and datasets, ideally node-local NVMe; one process
    per node downloads while the others wait. Unset: $HF_HOME or ~/.cache/huggingface."""

    dtype: ComputeDtype = "auto"
    """Parameter dtype in forward and backward. auto = bf16 on CUDA, fp32 on CPU (gloo tests).
    Master weights, gradient reductions and optimizer states are always fp32."""

    sdpa_backend: SdpaBackend = "auto"
    """First choice of attention kernel on CUDA (the others stay as fallbacks): auto (torch's
    order: flash attention 2 first), cudnn (cuDNN's fused attention), flash, efficient."""

    fp8: bool = False
    """torchao float8 linears (dynamic tensorwise scaling) in the decoder blocks; the output head
    stays bf16. Master weights, reductions and optimizer states stay fp32. Needs torchao and an
    H100/H200-class GPU."""

    loss: LossImpl = "fused"
    """Output head + cross-entropy: fused (chunked, never materialises the full fp32 logits;
    training/loss.py) or plain (Hugging Face head, full logits, F.cross_entropy)."""

    def __post_init__(self) -> None:
        _check(bool(self.model.strip()), "model", "must name a model")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Data: dataset, prompt template, packing."""

    dataset: str = SHIPPED_DATASET
    """Hugging Face dataset name, or a local .json/.jsonl/.parquet file with either
    instruction/input/output fields (alpaca template) or a text field. Default: the small
    instruction set shipped in training/data/."""

    dataset_split: str = "train"
    """Split to train on when --dataset is a Hugging Face dataset name."""

    seq_len: int = 4096
    """Tokens per packed training sequence."""

    mask_prompt: bool = True
    """Compute the loss on responses only (prompt tokens get no loss); --no-mask-prompt trains
    on every token."""

    def __post_init__(self) -> None:
        _check(bool(self.dataset.strip()), "dataset", "must name a dataset or a file")
        _check(self.seq_len >= 8, "seq_len", f"must be at least 8, got {self.seq_len}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Training: length and batch."""

    epochs: int = 1
    """Passes over the packed dataset."""

    max_steps: int | None = None
    """Stop after this many optimizer steps (caps --epochs). Unset: run all epochs."""

    batch_size: int = 1
    """Packed sequences per GPU (per process) per micro-step."""

    grad_accum: int = 1
    """Micro-steps per optimizer step; global batch = world size x --batch-size x --grad-accum
    sequences."""

    seed: int = 42
    """Seed of weight init (tiny), data order and every random stream; the same on all ranks."""

    log_every: int = 1
    """Log a line with loss and tokens/s every this many steps (rank 0)."""

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        _check(self.max_steps is None or self.max_steps >= 1, "max_steps",
               f"must be >= 1 when set, got {self.max_steps}")
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        _check(self.grad_accum >= 1, "grad_accum", f"must be >= 1, got {self.grad_accum}")
        _check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _check(self.log_every >= 1, "log_every", f"must be >= 1, got {self.log_every}")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimizer: AdamW and the learning-rate schedule (linear warm-up, then cosine)."""

    lr: float = 2e-5
    """Peak learning rate, reached at the end of the warm-up."""

    warmup_steps: int = 10
    """Optimizer steps of linear warm-up from 0 to --lr."""

    min_lr_ratio: float = 0.1
    """The cosine decays to --lr x this ratio at the last step."""

    weight_decay: float = 0.0
    """AdamW decoupled weight decay, applied to matrices only (not norms or biases)."""

    max_grad_norm: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 turns clipping off."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        _check(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio",
               f"must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0, got {self.max_grad_norm}")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Parallelism and memory: FSDP2 strategy, activation checkpointing, compile."""

    sharding: Sharding = "FULL_SHARD"
    """FULL_SHARD: shard params, grads, optimizer state; re-gather params in backward.
    SHARD_GRAD_OP: same, but keep params gathered from forward to backward (more memory, less
    communication). HYBRID_SHARD: shard within a node, replicate across nodes. NO_SHARD:
    replicate everything (plain data parallel)."""

    hsdp_shard_size: int = 0
    """HYBRID_SHARD only: processes per shard group; 0 = processes per node (torchrun's
    LOCAL_WORLD_SIZE). The world size must be a multiple of it."""

    activation_checkpointing: ActivationCheckpointing = "selective"
    """Recompute decoder-layer activations in backward: none, full (every layer) or selective
    (every 2nd layer)."""

    compile: bool = False
    """torch.compile each decoder layer (needs a C++ compiler on CPU; worth it on GPU)."""

    def __post_init__(self) -> None:
        _check(self.hsdp_shard_size >= 0, "hsdp_shard_size",
               f"must be >= 0, got {self.hsdp_shard_size}")
        _check(self.hsdp_shard_size == 0 or self.sharding == "HYBRID_SHARD", "hsdp_shard_size",
               f"only applies with --sharding HYBRID_SHARD (got --sharding {self.sharding})")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Checkpoints: resume, and the final Hugging Face export."""

    checkpoint_dir: str | None = None
    """Directory of resumable checkpoints, shared by all nodes (e.g. FSx). A run resumes
    automatically from the newest complete checkpoint in it. Unset: no checkpoints."""

    checkpoint_every: int = 100
    """Save every this many optimizer steps, and always after the last one; 0 = only at the end."""

    keep_checkpoints: int = 2
    """Keep the newest this many complete checkpoints; older ones are deleted."""

    output_dir: str | None = None
    """Write the fine-tuned model here at the end in Hugging Face safetensors format (with the
    tokenizer), loadable with from_pretrained. Unset: no export."""

    export_dtype: ExportDtype = "bf16"
    """dtype of the exported weights."""

    def __post_init__(self) -> None:
        _check(self.checkpoint_every >= 0, "checkpoint_every",
               f"must be >= 0, got {self.checkpoint_every}")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints",
               f"must be >= 1, got {self.keep_checkpoints}")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Metrics: JSON lines and Prometheus."""

    metrics_port: int = 0
    """Serve Prometheus metrics (fsdp_train_*) on this port from local rank 0 of each node;
    0 = off."""

    metrics_file: str | None = None
    """Append one JSON object per optimizer step (and a summary at the end) to this file
    (rank 0)."""

    def __post_init__(self) -> None:
        _check(0 <= self.metrics_port <= 65535, "metrics_port",
               f"must be a TCP port or 0, got {self.metrics_port}")


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """The whole fine-tuning job."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(JobConfig)[f.name]
                             for f in dataclasses.fields(JobConfig)}
"""JobConfig's sections by attribute name, in command-line order."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right after each field)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _add_field(group: argparse._ArgumentGroup, name: str, hint: object, default: object,
               doc: str) -> None:
    args = [flag(name)]
    kwargs: dict = {"dest": name, "default": default}
    shown = "unset" if default is None else default
    if name == "dataset" and default == SHIPPED_DATASET:
        shown = "training/data/instructions.jsonl"
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(hint) is Literal:
        kwargs.update(choices=list(typing.get_args(hint)), type=str)
    else:
        base = options[0] if options else hint
        assert base in (int, float, str), f"unsupported config type {hint} for {name}"
        kwargs["type"] = base
        kwargs["metavar"] = ("PATH" if name.endswith(("_dir", "_file"))
                             else base.__name__.upper())
    kwargs["help"] = f"{doc} (default: {shown})"
    group.add_argument(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.finetune",
        description="FSDP2 fine-tuning of Llama-family causal LMs. Run under torchrun "
                    "(one process per GPU); the Hugging Face token is read from the HF_TOKEN "
                    "environment variable only.")
    for section in SECTIONS.values():
        group = parser.add_argument_group(section.__doc__.split(":")[0],
                                          section.__doc__.split(":", 1)[-1].strip())
        hints = typing.get_type_hints(section)
        docs = field_docs(section)
        for f in dataclasses.fields(section):
            assert f.name in docs, f"{section.__name__}.{f.name} has no docstring"
            _add_field(group, f.name, hints[f.name], f.default, docs[f.name])
    return parser


def config_from_namespace(ns: argparse.Namespace) -> JobConfig:
    """Build the job config; raises ValueError naming the flag on a bad value."""
    values = vars(ns)
    sections = {}
    for name, section in SECTIONS.items():
        sections[name] = section(
            **{f.name: values[f.name] for f in dataclasses.fields(section)})
    return JobConfig(**sections)


def parse_args(argv: list[str] | None = None) -> JobConfig:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return config_from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits
