"""Does the job fit in GPU memory? An estimate per GPU, checked at preview before any node exists.

The estimate, per GPU, in bytes (P parameters, L layers, h hidden, i intermediate, h_kv the
key/value width, V vocabulary, s sequence length, b per-GPU batch, S the shard group):

- **States** (fp32 master weights 4 + fp32 gradients 4 + AdamW moments 8 = 16 bytes per
  parameter), divided by the shard group: ``FULL_SHARD`` S = every GPU of the job,
  ``HYBRID_SHARD`` S = the GPUs of one node, ``SHARD_GRAD_OP`` S = every GPU,
  ``NO_SHARD`` S = 1.
- **Working copies** the strategy gathers: ``FULL_SHARD`` / ``HYBRID_SHARD`` hold the bf16
  parameters and gradients of the two largest FSDP units at once (the one computing and the one
  prefetched), 2 x (2 + 2) bytes x the unit's parameters; ``SHARD_GRAD_OP`` keeps every bf16
  parameter gathered from forward to backward (2P) plus one unit's gradients; ``NO_SHARD``
  holds a bf16 copy of every parameter (2P) plus one unit's gradients.
- **Activations** in bf16, from the Llama block (Korthikanti et al. 2022, "Reducing Activation
  Recomputation", adapted to SwiGLU and grouped-query attention; flash/SDPA attention stores no
  s x s scores): one layer stores ``2 x (6h + 2h_kv + 4i)`` bytes per token. ``none`` keeps every
  layer's; ``full`` keeps each layer's input (2h bytes per token) plus, during backward, one
  layer recomputed and its gradients (2 x one layer); ``selective`` (every second layer, as the
  training package does) keeps half the layers whole and the other half as inputs. With
  ``torch.compile`` the fused elementwise kernels store less: the stored layers are scaled by
  ``COMPILED_ACTIVATION_FACTOR``, measured (docs/performance.md: 127 KB instead of 153.6 KB per
  token per layer, Llama-2-7B shape, seq 4096, batch 2-4, torch 2.11, 2 x H200).
- **Attention masks** of packed rows (several documents per row, training/attention.py): with
  ``packedAttention: sdpa`` the masked SDPA kernel keeps a bf16 bias of the dense
  block-diagonal mask for backward, ``2 x b x s^2`` bytes per stored layer (measured: +1.50 GiB
  for 16 layers at b 3, s 4096 on one H200, exactly that; docs/benchmarks/h200-packed/call1);
  counted as if every row were packed (it errs high). FlexAttention's block mask is a few
  int32 tables of (s / 128)^2 entries per row, shared by the layers: nothing at this scale
  (measured: the same peak as plain causal rows).
- **Logits**: with the package's fused loss (training/loss.py), fp32 logits and their gradient,
  ``8 x b x s x V``; the plain loss (the Hugging Face head, then ``F.cross_entropy``) holds about
  twice that, ``16 x b x s x V`` (measured: 2.3 GiB more than fused at b 3, s 4096, V 32000 on
  2 x H200, docs/benchmarks/h200/7b-b3-none-compile-plain-sync-*.json against
  7b-b3-none-compile-*.json).
- **Overhead**: 4 GiB for the CUDA context, NCCL's buffers and allocator fragmentation.

The job is refused above 90 % of the GPU's memory. The estimate is deliberately simple and
errs high; it is a guard against runs that cannot work, not a tuning tool. Tested against every
measured run of docs/benchmarks/h200/ (tests/infra/test_memory_fit.py): at least the measured
peak reserved, at most 15 % above it, with the package's allocator setting.

**Host memory of asynchronous checkpoints** (``job.asyncCheckpoint``, on by default): DCP's
``async_save`` copies each process's shard of the saved state to host memory before writing it
in the background: fp32 parameters and the two AdamW moments, 12 bytes per parameter over the
shard group (gradients are not saved). That copy plus ``HOST_ALLOWANCE_GIB`` for the process
itself must fit in the memory the worker pod requests per GPU
(``HardwareProfile.pod_memory_gib_per_gpu``), or the job is refused with the fix (more nodes, a
sharded strategy, or ``job.asyncCheckpoint: false``).

The settings rules that apply the estimate to a stack's job (the GPU budget, the host copy, what
would fit instead) are in components/settings_rules/fit.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from components.planning.hardware import HardwareProfile
from training.config import JobConfig, Sharding
from training.shapes import ModelShape, shape_of_model

GIB = 1024**3
STATE_BYTES_PER_PARAM = 16
OVERHEAD_GIB = 4.0
BUDGET_FRACTION = 0.9
COMPILED_ACTIVATION_FACTOR = 127.0 / 153.6
"""Measured activations of a compiled Llama block over this module's eager formula."""
FLOAT8_ACTIVATION_FACTOR = 0.68
"""Stored activations of float8 blocks over bf16's. torchao saves float8 copies of the linears'
inputs for backward instead of bf16 ones: 24.9 vs 39.0 GiB (0.64) of activations measured on
2 x H200 (7B, batch 3, no AC, compile, FULL_SHARD; docs/performance.md). That ratio left out
float8's cast transients and under-estimated both measured float8 runs (88.8 < 89.0 GiB
FULL_SHARD, 99.9 < 101.5 GiB SHARD_GRAD_OP, peak reserved); 0.68 is the smallest round factor
that covers both (90.7 and 101.8 GiB), as tests/infra/test_memory_fit.py checks."""
MAX_SUGGESTED_NODES = 64
STAGED_BYTES_PER_PARAM = 12
"""What an async checkpoint copies to host memory per parameter: fp32 weights + AdamW moments."""
HOST_ALLOWANCE_GIB = 24.0
"""Host memory of a training process besides the staged copy: Python, torch and CUDA host
state, the packed dataset, pinned buffers. An allowance that errs high, not a measurement."""


def approximate_shape(parameters: float) -> ModelShape:
    """A Llama-proportioned shape for a model the table does not know.

    Llama blocks hold about 12 h^2 parameters (attention 4 h^2, SwiGLU MLP 8 h^2) and Llama
    models keep h / L close to 128, so ``P = 12 h^3 / 128``. The vocabulary is taken as Llama 3's
    128256, the larger of the common ones, so the logits term errs high.
    """
    hidden = max(128, round((parameters * 128 / 12) ** (1 / 3) / 128) * 128)
    layers = max(1, round(parameters / (12 * hidden**2)))
    return ModelShape(parameters=parameters, layers=layers, hidden=hidden, intermediate=8 * hidden // 3,
                      heads=hidden // 128, kv_heads=hidden // 128, vocab=128256)


def model_shape(model: str, parameters_billion: float | None) -> ModelShape | None:
    """The shape of ``model`` (the table of training/shapes.py); a given parameter count
    overrides the table's. None if unknown."""
    known = shape_of_model(model)
    if parameters_billion is None:
        return known
    if known is not None:
        return replace(known, parameters=parameters_billion * 1e9)
    return approximate_shape(parameters_billion * 1e9)


def shard_group(sharding: Sharding, *, nodes: int, gpus_per_node: int) -> int:
    """GPUs that share one copy of the states: every GPU of the job, one node's, or one."""
    world = nodes * gpus_per_node
    return {"FULL_SHARD": world, "SHARD_GRAD_OP": world, "HYBRID_SHARD": gpus_per_node, "NO_SHARD": 1}[sharding]


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of one configuration, in GiB, term by term."""

    states: float
    working: float
    activations: float
    logits: float
    overhead: float
    shard_group: int

    @property
    def total(self) -> float:
        return self.states + self.working + self.activations + self.logits + self.overhead

    def breakdown(self, shape: ModelShape, activation_checkpointing: str) -> str:
        return (
            f"parameters + gradients + AdamW states {self.states:.1f} GiB "
            f"({STATE_BYTES_PER_PARAM} B x {shape.parameters / 1e9:.2f}B parameters / {self.shard_group} GPUs), "
            f"bf16 gathered working copies {self.working:.1f} GiB, "
            f"activations {self.activations:.1f} GiB (checkpointing {activation_checkpointing}), "
            f"logits {self.logits:.1f} GiB, CUDA/NCCL overhead {self.overhead:.1f} GiB"
        )


def estimate(shape: ModelShape, job: JobConfig, *, nodes: int, gpus_per_node: int) -> MemoryEstimate:
    """Per-GPU memory of ``job`` on ``nodes`` x ``gpus_per_node`` GPUs (the formula of the
    module docstring)."""
    sharding, activation_checkpointing = job.parallel.sharding, job.parallel.activation_checkpointing
    batch_size, seq_len = job.train.batch_size, job.data.seq_len
    p = shape.parameters
    group = shard_group(sharding, nodes=nodes, gpus_per_node=gpus_per_node)
    states = STATE_BYTES_PER_PARAM * p / group
    if sharding in ("FULL_SHARD", "HYBRID_SHARD"):
        working = 2 * (2 + 2) * shape.largest_unit
    else:  # SHARD_GRAD_OP, NO_SHARD: every parameter gathered in bf16, one unit's gradients
        working = 2 * p + 2 * shape.largest_unit
    tokens = batch_size * seq_len
    per_layer = 2 * (6 * shape.hidden + 2 * shape.kv_width + 4 * shape.intermediate) * tokens
    if job.parallel.compile:
        per_layer *= COMPILED_ACTIVATION_FACTOR
    if job.model.precision == "fp8" and job.model.float8_recipe != "rowwise_with_gw_hp":
        # rowwise_with_gw_hp keeps the linears' bf16 inputs for its bf16 weight-gradient matmul:
        # the same stored activations as bf16 (71.8 GiB peak for both, 16 layers of the 7B
        # shape, one H200, docs/benchmarks/h200-loss/call1)
        per_layer *= FLOAT8_ACTIVATION_FACTOR
    layer_input = 2 * shape.hidden * tokens
    if activation_checkpointing == "none":
        activations = shape.layers * per_layer
    elif activation_checkpointing == "full":
        activations = shape.layers * layer_input + 2 * per_layer
    else:  # selective: every second layer checkpointed
        whole = shape.layers // 2
        activations = whole * per_layer + (shape.layers - whole) * layer_input + 2 * per_layer
    if job.model.packed_attention == "sdpa":  # the dense mask's bias, per layer that keeps its inputs
        kept = {"none": shape.layers, "full": 2}.get(activation_checkpointing, shape.layers // 2 + 2)
        activations += kept * 2 * batch_size * seq_len**2
    logits = (8 if job.model.loss == "fused" else 16) * tokens * shape.vocab
    return MemoryEstimate(
        states=states / GIB,
        working=working / GIB,
        activations=activations / GIB,
        logits=logits / GIB,
        overhead=OVERHEAD_GIB,
        shard_group=group,
    )


def budget_gib(profile: HardwareProfile) -> float:
    """What a job may use per GPU: 90 % of its memory (the rest: fragmentation, spikes)."""
    return BUDGET_FRACTION * profile.gpu.memory_gib


def staging_gib(shape: ModelShape, *, sharding: Sharding, nodes: int, gpus_per_node: int) -> float:
    """Host memory of one process's async-checkpoint copy, in GiB."""
    group = shard_group(sharding, nodes=nodes, gpus_per_node=gpus_per_node)
    return STAGED_BYTES_PER_PARAM * shape.parameters / group / GIB
