"""One typed job config: nested frozen dataclasses, and the command line built from them.

Each field's attribute docstring is its ``--help`` text, each field name is its flag
(``seq_len`` -> ``--seq-len``), so defaults and documentation live in exactly one place.

A config is checked once, where it is made from the user's input, not at construction (no
section validates in ``__post_init__``): ``from_fields`` builds it and raises ``ConfigError`` (a
``ValueError``) listing every mistake at once, each naming the flag to change. ``parse_args``
(the pod's command line) goes through it and turns the error into an argparse usage error; the
stack's preview calls it on the stack file's values. Build a ``JobConfig`` from input only
through these two; ``dataclasses.replace`` of a checked config is not checked again.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import string
import textwrap
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TINY_MODEL = "tiny"
SHIPPED_DATASET = str(Path(__file__).resolve().parent / "data" / "instructions.jsonl")

Sharding = Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]
ActivationCheckpointing = Literal["none", "full", "selective"]
Precision = Literal["auto", "fp32", "bf16", "fp8"]
ExportDtype = Literal["bf16", "fp32"]
SdpaBackend = Literal["auto", "cudnn", "flash", "efficient"]
LossImpl = Literal["fused", "plain"]
PackedAttention = Literal["flex", "sdpa"]
Float8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]
DataFormat = Literal["auto", "alpaca", "text", "prompt-completion", "chat", "fields"]


def flag(name: str) -> str:
    """The command-line flag of a config field."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Problem:
    """A user mistake: the config field to change and what is wrong and what to use.

    The stack's own problems (components.settings.Problem) are built from these, located by
    the stack key and the value found there.
    """

    key: str
    fix: str


def _failing(*checks: tuple[bool, str, str]) -> list[Problem]:
    """The problem of every check whose condition is false."""
    return [Problem(name, fix) for ok, name, fix in checks if not ok]


class ConfigError(ValueError):
    """Every problem of a job config, each naming the flag to change."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(f"{flag(p.key)}: {p.fix}" for p in problems))


class _Section:
    """A config section: ``problems()`` lists its user mistakes; ``JobConfig.problems`` gathers them."""

    def problems(self) -> list[Problem]:
        return []


@dataclass(frozen=True, kw_only=True)
class ModelConfig(_Section):
    """Model: which weights to fine-tune and in which precision."""

    model: str = TINY_MODEL
    """Hugging Face model id (e.g. meta-llama/Llama-2-7b-hf), a local directory holding
    config.json and *.safetensors, or 'tiny' (a random 2-layer Llama and a byte tokenizer,
    built offline, for tests and the demo)."""

    cache_dir: str | None = None
    """Download cache for Hugging Face models and datasets, ideally node-local NVMe; one process
    per node downloads while the others wait. Unset: $HF_HOME or ~/.cache/huggingface."""

    precision: Precision = "auto"
    """Compute precision: auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, or fp8 (bf16 plus
    torchao float8 matmuls in the decoder blocks' linears, scaled as --float8-recipe says; the
    output head stays bf16; about a third more tokens/s on H100/H200; needs torchao and a GPU
    with float8 units: not the A100). Master weights, gradient reductions and optimizer states
    are always fp32."""

    float8_recipe: Float8Recipe = "tensorwise"
    """With --precision fp8, torchao's scaling recipe: tensorwise (one scale per tensor; the
    fastest, and the only one whose weights FSDP all-gathers in float8), rowwise (one scale per
    row of each operand, powers of two) or rowwise_with_gw_hp (rowwise, with the weight
    gradients' matmul kept in bf16). Speed and convergence of each: docs/performance.md."""

    sdpa_backend: SdpaBackend = "auto"
    """First choice of attention kernel on CUDA (the others stay as fallbacks): auto (torch's
    order: flash attention 2 first), cudnn (cuDNN's fused attention), flash, efficient."""

    packed_attention: PackedAttention = "flex"
    """Attention of packed rows (several documents per row): flex (block-causal FlexAttention
    on CUDA: tiles between two documents are skipped; training/attention.py) or sdpa (a dense
    block-diagonal mask and a masked kernel over the whole row). On the CPU always sdpa
    (FlexAttention has no CPU backward)."""

    loss: LossImpl = "fused"
    """Output head + cross-entropy: fused (chunked, never materialises the full fp32 logits;
    training/loss.py) or plain (Hugging Face head, full logits, F.cross_entropy)."""

    def problems(self) -> list[Problem]:
        return _failing(
            (bool(self.model.strip()), "model", "must name a model"),
            (self.float8_recipe == "tensorwise" or self.precision == "fp8", "float8_recipe",
             f"only applies with --precision fp8 (got --precision {self.precision}): set "
             "--precision fp8, or leave the recipe at tensorwise"),
        )


@dataclass(frozen=True, kw_only=True)
class DataConfig(_Section):
    """Data: dataset, record format, validation split, packing."""

    dataset: str = SHIPPED_DATASET
    """Hugging Face dataset name, a local dataset directory laid out like one (e.g.
    train-*.parquet, validation-*.parquet), or a local .json/.jsonl/.parquet file. Default: the
    small instruction set shipped in training/data/."""

    dataset_split: str = "train"
    """Split to train on when --dataset is a Hugging Face dataset or a dataset directory."""

    data_format: DataFormat = "auto"
    """How a record becomes a prompt and a response: auto (detected from the first record:
    messages -> chat, instruction/output -> alpaca, prompt/completion -> prompt-completion,
    text -> text), alpaca, text (trained on whole), prompt-completion, chat (messages: a list of
    {role, content}, rendered with the tokenizer's chat template, loss on assistant turns only)
    or fields (--prompt-field, --response-field, --prompt-template). Giving --prompt-field or
    --response-field with auto means fields."""

    prompt_field: str | None = None
    """fields format: the record field holding the prompt (e.g. dialogue)."""

    response_field: str | None = None
    """fields format: the record field holding the response trained on (e.g. summary)."""

    prompt_template: str | None = None
    """fields format: a Python format string over the record's fields that must name
    {<prompt-field>}, e.g. 'Summarize this dialog:\\n{dialogue}\\n---\\nSummary:\\n'. Unset: the
    prompt field's text alone."""

    val_fraction: float = 0.05
    """Fraction of the records held out for validation when the dataset has no validation or
    test split, chosen by a hash of each record's content (the same records at every world
    size and --seed); 0 turns evaluation off."""

    seq_len: int = 4096
    """Tokens per packed training sequence; longer examples are cut to it."""

    mask_prompt: bool = True
    """Compute the loss on responses only (prompt tokens, and every non-assistant turn of a
    chat, get no loss); --no-mask-prompt trains on every token."""

    def __post_init__(self) -> None:
        # Fills in what the fields imply; the checks are problems(), run by from_fields.
        if self.data_format == "auto" and (self.prompt_field or self.response_field):
            object.__setattr__(self, "data_format", "fields")  # the fields imply the format

    def problems(self) -> list[Problem]:
        named = [(n, getattr(self, n)) for n in ("prompt_field", "response_field",
                                                 "prompt_template")]
        given = [n for n, v in named if v is not None]
        fields = self.data_format == "fields"
        return _failing(
            (bool(self.dataset.strip()), "dataset", "must name a dataset or a file"),
            (not REMOTE_URL.match(self.dataset), "dataset", REMOTE_DATA_RECIPE),
            (self.seq_len >= 8, "seq_len", f"must be at least 8, got {self.seq_len}"),
            (0 <= self.val_fraction < 0.5, "val_fraction",
             f"must be in [0, 0.5) (0 turns evaluation off), got {self.val_fraction}"),
            (fields or not given, given[0] if given else "",
             f"only applies with --data-format fields (got --data-format {self.data_format})"),
            (not fields or (self.prompt_field is not None and self.response_field is not None),
             "response_field" if self.prompt_field is not None else "prompt_field",
             "--data-format fields needs both --prompt-field and --response-field"),
            *((value is None or bool(value.strip()), name, "must name a record field")
              for name, value in named[:2]),
            (self.prompt_field is None or self.prompt_field != self.response_field,
             "response_field", f"must differ from --prompt-field ({self.prompt_field})"),
            *self._template_checks(),
        )

    def _template_checks(self) -> list[tuple[bool, str, str]]:
        if self.prompt_template is None or not self.prompt_field:
            return []
        try:
            names = template_fields(self.prompt_template)
        except ValueError as e:
            return [(False, "prompt_template", f"is not a Python format string: {e}")]
        # A record field is text: {a.upper} would render a method's repr, {a[0]} one character.
        accessed = [e for e in template_expressions(self.prompt_template) if "." in e or "[" in e]
        return [
            (all(names), "prompt_template",
             "name record fields in braces, e.g. {dialogue}; '{}' and '{0}' name none"),
            (not accessed, "prompt_template",
             f"names {', '.join('{' + e + '}' for e in accessed)}: a field's attribute or index "
             f"is not its text; name the field alone, e.g. {{{self.prompt_field}}}"),
            (self.prompt_field in names, "prompt_template",
             f"must name the prompt field as {{{self.prompt_field}}}; it names "
             f"{', '.join('{' + n + '}' for n in names if n) or 'no field'}"),
        ]


REMOTE_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""An object-store or web URL (s3://, gs://, https://, ...)."""
REMOTE_DATA_RECIPE = (
    "is a URL, and the job reads a local path or a Hugging Face dataset name only (each of its "
    "processes would download the objects, with credentials it does not have). Copy the data "
    "to the shared volume (from a pod that mounts it: aws s3 cp s3://bucket/train.jsonl "
    "/fsx/data/train.jsonl) and give that path, or link the bucket to the FSx file system with "
    "a data repository association (aws fsx create-data-repository-association "
    "--file-system-id fs-... --file-system-path /data --data-repository-path s3://bucket/prefix/"
    ") and give /fsx/data/<file>")
"""Why data on S3 (or any URL) is refused, and the recipes that work."""


def template_expressions(template: str) -> list[str]:
    """The replacement fields of a format string as written (``a``, ``a.b``, ``a[0]``, ``0``,
    ''), nested format specs included, in order. Raises ValueError if it is not a valid format
    string (e.g. a single '{')."""
    found = []
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is not None:
            found.append(name)
            if spec and "{" in spec:
                found += template_expressions(spec)
    return found


def template_fields(template: str) -> list[str]:
    """The record fields a --prompt-template names, in order ('' for a positional field such as
    '{}' or '{0}'); ``{a.b}`` and ``{a[0]}`` name ``a``. Raises ValueError as
    `template_expressions`."""
    bases = (name.split(".", 1)[0].split("[", 1)[0] for name in template_expressions(template))
    return ["" if base.isdigit() else base for base in bases]


@dataclass(frozen=True, kw_only=True)
class TrainConfig(_Section):
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

    eval_every: int = 0
    """Evaluate on the validation set every this many optimizer steps; 0 = at the end of every
    epoch. Always also after the last step. Mean token loss over the whole validation set (all
    ranks, no dropout) and its perplexity."""

    def problems(self) -> list[Problem]:
        return _failing(
            (self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}"),
            (self.max_steps is None or self.max_steps >= 1, "max_steps",
             f"must be >= 1 when set, got {self.max_steps}"),
            (self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}"),
            (self.grad_accum >= 1, "grad_accum", f"must be >= 1, got {self.grad_accum}"),
            (self.seed >= 0, "seed", f"must be >= 0, got {self.seed}"),
            (self.log_every >= 1, "log_every", f"must be >= 1, got {self.log_every}"),
            (self.eval_every >= 0, "eval_every",
             f"must be >= 0 (0 = every epoch), got {self.eval_every}"),
        )


@dataclass(frozen=True, kw_only=True)
class OptimConfig(_Section):
    """Optimizer: AdamW and the learning-rate schedule (linear warm-up, then cosine)."""

    learning_rate: float = 2e-5
    """Peak learning rate, reached at the end of the warm-up."""

    warmup_steps: int = 10
    """Optimizer steps of linear warm-up from 0 to --learning-rate."""

    min_lr_ratio: float = 0.1
    """The cosine decays to --learning-rate x this ratio at the last step."""

    weight_decay: float = 0.0
    """AdamW decoupled weight decay, applied to matrices only (not norms or biases)."""

    max_grad_norm: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 turns clipping off."""

    def problems(self) -> list[Problem]:
        return _failing(
            (0 < self.learning_rate < 1, "learning_rate",
             f"must be in (0, 1) (AdamW fine-tuning takes 1e-6..1e-3), got {self.learning_rate}"),
            (self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}"),
            (0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio",
             f"must be in [0, 1], got {self.min_lr_ratio}"),
            # An infinite decay turns every weight into inf/nan at the first step.
            (0 <= self.weight_decay < float("inf"), "weight_decay",
             f"must be >= 0 and finite, got {self.weight_decay}"),
            (self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0, got {self.max_grad_norm}"),
        )


@dataclass(frozen=True, kw_only=True)
class ParallelConfig(_Section):
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

    collective_timeout_s: int = 600
    """Seconds a collective may wait for the other ranks before this process fails (so a hung
    or stopped rank becomes a restart, not a hang); on GPU also the NCCL heartbeat timeout the
    stack sets. Long waits that are expected (downloads) use their own 3-hour group."""

    def problems(self) -> list[Problem]:
        return _failing(
            (self.collective_timeout_s >= 1, "collective_timeout_s",
             f"must be >= 1 second, got {self.collective_timeout_s}"),
            (self.hsdp_shard_size >= 0, "hsdp_shard_size",
             f"must be >= 0, got {self.hsdp_shard_size}"),
            (self.hsdp_shard_size == 0 or self.sharding == "HYBRID_SHARD", "hsdp_shard_size",
             f"only applies with --sharding HYBRID_SHARD (got --sharding {self.sharding})"),
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig(_Section):
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

    keep_best: bool = False
    """Export the checkpoint with the lowest validation loss instead of the last one: every
    evaluation then also saves a checkpoint, and pruning keeps the best. Needs --checkpoint-dir
    (the stack always sets one) and a validation set."""

    async_checkpoint: bool = True
    """Write checkpoints in the background (DCP async_save): the step waits only while the
    state is copied to host memory (a copy of this rank's parameters and AdamW states); the
    checkpoint becomes COMPLETE once every rank's files are written and checksummed.
    --no-async-checkpoint writes them while training waits."""

    def problems(self) -> list[Problem]:
        return _failing(
            (self.checkpoint_every >= 0, "checkpoint_every",
             f"must be >= 0, got {self.checkpoint_every}"),
            (self.keep_checkpoints >= 1, "keep_checkpoints",
             f"must be >= 1, got {self.keep_checkpoints}"),
        )


@dataclass(frozen=True, kw_only=True)
class MetricsConfig(_Section):
    """Metrics: JSON lines and Prometheus."""

    metrics_port: int = 0
    """Serve Prometheus metrics (fsdp_train_*) on this port from local rank 0 of each node;
    0 = off."""

    metrics_file: str | None = None
    """Append one JSON object per optimizer step (and a summary at the end) to this file
    (rank 0)."""

    def problems(self) -> list[Problem]:
        return _failing(
            (0 <= self.metrics_port <= 65535, "metrics_port",
             f"must be a TCP port or 0, got {self.metrics_port}"),
        )


@dataclass(frozen=True, kw_only=True)
class NodeCheckConfig(_Section):
    """Node check: the nodes and the fabric, checked with numbers before training
    (training/node_check.py)."""

    node_check: bool = True
    """Check every node (GPUs present and healthy, EFA devices, ulimit -l, /dev/shm, the
    Lustre module, checkpoint directory throughput) and the fabric (all-reduce and all-gather
    bus bandwidth at the model's FSDP sizes, NCCL's transport) before anything else; a failed
    check stops the job naming the node, the check and the figures. --no-node-check skips it."""

    node_check_timeout_s: int = 300
    """Seconds the node checks of each node may take, and each collective of the bandwidth
    test, before the check fails the job."""

    node_check_gpus: int = 0
    """GPUs each node must have; 0: as many as processes on the node on CUDA, none on CPU."""

    node_check_efa: int = 0
    """EFA devices (/dev/infiniband/uverbs*) each node must have; 0: none required."""

    node_check_min_shm_gib: float = 1.0
    """Smallest /dev/shm accepted, GiB (NCCL's shared-memory transport and data workers)."""

    node_check_min_busbw_gbs: float = 0.0
    """Lowest all-reduce bus bandwidth accepted over all ranks at the largest size, GB/s;
    0: reported, not checked."""

    node_check_min_node_busbw_gbs: float = 0.0
    """Lowest all-reduce bus bandwidth accepted inside each node (multi-node jobs), GB/s;
    0: reported, not checked."""

    def problems(self) -> list[Problem]:
        return _failing(
            (self.node_check_timeout_s >= 1, "node_check_timeout_s",
             f"must be >= 1 second, got {self.node_check_timeout_s}"),
            *((getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
              for name in ("node_check_gpus", "node_check_efa", "node_check_min_shm_gib",
                           "node_check_min_busbw_gbs", "node_check_min_node_busbw_gbs")),
        )


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """The whole fine-tuning job. Its constructor checks nothing: made from input, it comes from
    ``from_fields`` or ``parse_args``, which run ``problems()``."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    node_check: NodeCheckConfig = dataclasses.field(default_factory=NodeCheckConfig)

    def problems(self) -> list[Problem]:
        """Every user mistake of the job: each section's, then those across sections.

        Not run at construction: ``from_fields`` runs it once per process (the pod's command
        line, the stack's settings), and the typed copies made from a checked config
        (``dataclasses.replace``) are not checked again."""
        return [p for name in SECTIONS for p in getattr(self, name).problems()] + _failing(
            (not self.checkpoint.keep_best or self.data.val_fraction > 0, "keep_best",
             "needs a validation set: --val-fraction > 0 (0 turns evaluation off)"),
        )

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


@functools.cache
def fields() -> dict[str, dataclasses.Field]:
    """Every config field by name, across the sections (names are unique: each is a flag)."""
    return {f.name: f for section in SECTIONS.values() for f in dataclasses.fields(section)}


@functools.cache
def field_types() -> dict[str, object]:
    """Every config field's type hint by name."""
    return {name: hint for section in SECTIONS.values()
            for name, hint in typing.get_type_hints(section).items()}


def from_fields(values: Mapping[str, object]) -> JobConfig:
    """The job config from field values by name (the rest take their defaults).

    Raises ``ConfigError`` listing every problem, each naming its field: the one validation,
    used by the command line and by the stack at preview.
    """
    unknown = sorted(set(values) - set(fields()))
    assert not unknown, f"not config fields: {unknown}"
    cfg = JobConfig(**{
        name: section(**{f.name: values[f.name] for f in dataclasses.fields(section)
                         if f.name in values})
        for name, section in SECTIONS.items()})
    if problems := cfg.problems():
        raise ConfigError(problems)
    return cfg


def flat(cfg: JobConfig) -> dict[str, object]:
    """Every field of ``cfg`` by name: the inverse of ``from_fields``."""
    return {f.name: getattr(getattr(cfg, name), f.name)
            for name, section in SECTIONS.items() for f in dataclasses.fields(section)}


def to_argv(cfg: JobConfig) -> list[str]:
    """The flags that make ``parse_args`` return ``cfg``: every field that differs from its default.

    Defaults are left to the package: the stack renders this command and the image holds the
    package of the same commit, so both read the same defaults.
    """
    argv: list[str] = []
    for name, value in flat(cfg).items():
        if value == fields()[name].default:
            continue
        if isinstance(value, bool):
            argv.append(flag(name) if value else "--no-" + flag(name)[2:])
        elif value is not None:
            argv += [flag(name), repr(value) if isinstance(value, float) else str(value)]
    return argv


def config_from_namespace(ns: argparse.Namespace) -> JobConfig:
    """Build the job config; raises ConfigError naming each flag with a bad value."""
    values = vars(ns)
    return from_fields({name: values[name] for name in fields()})


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """The checked job config of a command line (``from_fields``); a mistake exits as argparse's
    usage error (status 2) naming each flag."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return config_from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits
