"""What the job will cost and how fast it will go, printed at preview (before ``pulumi up``).

Speed: the MFU measured on 2 x H200 for the job's kind of step (docs/performance.md: Llama-2-7B,
compile per block, FULL_SHARD, batch 3: 56.2 % without activation checkpointing, 46.0 % with full
checkpointing; 48.4 % for 13B with selective; eager steps 0.774 of compiled ones, measured at full
AC; float8 linears 1.307 x bf16, measured without AC, times the recipe's speed beside tensorwise
measured on one H200; the dense-mask attention of packed rows, ``packedAttention: sdpa``, 0.842 x,
measured on one H200 with documents of 200-400 tokens: FlexAttention's packed rows run at least at
the plain rate; Llama 3's shape 0.954 x Llama 2's without AC and 0.988 x with full AC, measured on
one H200), times the profile's bf16 peak, over the model's FLOPs per token
(docs/design.md#measuring-speed), is one node's tokens/s per GPU (on another GPU the H200's MFU is
assumed, and the line says so); the scaling model (``scaling_model.py``) then adds what FSDP's
collectives cost across the job's nodes. Money: the nodes' price (``hardware.py``, with its basis:
on demand, or a Capacity Block's rate, dated). Both are estimates for planning, not promises: other
models, batches and sequence lengths than the measured ones move the MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.planning.hardware import HardwareProfile
from components.planning.scaling_model import Cluster, predict
from training import config as training_config
from training.shapes import ModelShape, flops_per_token

MEASURED_MFU = {"none": 0.562, "full": 0.460, "selective": 0.484}
"""Compiled bf16 steps on 2 x H200 by activation checkpointing (docs/performance.md)."""
MFU_MEASURED_ON = "NVIDIA H200"
"""The GPU (training/hardware.py's key) every MFU and factor here was measured on."""
EAGER_FACTOR = 7643 / 9881
"""Eager over compiled tokens/s, full AC, 7B, 2 x H200."""
FLOAT8_FACTOR = 15766 / 12065
"""float8 linears (tensorwise) over bf16 tokens/s, no AC, compile, FULL_SHARD, 7B, 2 x H200."""
FLOAT8_RECIPE_FACTOR = {"tensorwise": 1.0, "rowwise": 29314 / 34001,
                        "rowwise_with_gw_hp": 29789 / 34001}
"""Each float8 recipe over tensorwise tokens/s: 16 layers of the 7B shape, no AC, compile, one
H200, same call (docs/benchmarks/h200-loss/call1)."""
PACKED_SDPA_FACTOR = 21113 / 25087
"""Packed rows (about 13 documents of 200-400 tokens per row of 4,096) on the dense-mask SDPA
path over plain causal rows, 16 layers of the 7B shape, no AC, compile, one H200, same call
(docs/benchmarks/h200-packed/call1). Through FlexAttention the same rows ran 1.067 x the plain
rate, so the default path keeps the plain MFU (a floor); the sdpa path is forecast as if every
row were packed (it errs low for long records)."""

LLAMA3_VOCAB = 128256
LLAMA3_SHAPE_FACTOR = {"none": 57.381 / 60.149, "full": 49.128 / 49.719}
"""MFU of the Llama-3-8B shape (128,256-word vocabulary, 8 KV heads, batch 2) over the Llama-2-7B
shape's (batch 3), per activation checkpointing, compile, one H200, each pair from one call:
16 layers each without AC (docs/benchmarks/h200-llama3/call3), 32 layers each with full AC
(h200-llama3/call5). Applied to shapes with Llama 3's vocabulary; selective AC, not measured,
takes the lower of the two."""


@dataclass(frozen=True, kw_only=True)
class Forecast:
    tokens_per_s_per_gpu: float
    scaling_efficiency: float
    gpus: int
    usd_per_hour: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_s_per_gpu * self.gpus

    @property
    def usd_per_billion_tokens(self) -> float:
        return self.usd_per_hour / (self.tokens_per_s * 3600 / 1e9)


def forecast(shape: ModelShape, job: training_config.JobConfig, profile: HardwareProfile, nodes: int,
             gpus_per_node: int) -> Forecast:
    """Tokens/s per GPU and price per hour of ``job`` on ``nodes`` nodes of ``profile``."""
    mfu = MEASURED_MFU[job.parallel.activation_checkpointing]
    if not job.parallel.compile:
        mfu *= EAGER_FACTOR
    if job.model.precision == "fp8":
        mfu *= FLOAT8_FACTOR * FLOAT8_RECIPE_FACTOR[job.model.float8_recipe]
    if job.model.packed_attention == "sdpa":
        mfu *= PACKED_SDPA_FACTOR
    if shape.vocab == LLAMA3_VOCAB:
        mfu *= LLAMA3_SHAPE_FACTOR.get(job.parallel.activation_checkpointing,
                                       min(LLAMA3_SHAPE_FACTOR.values()))
    seq = job.data.seq_len
    one_node = mfu * profile.gpu.peak_bf16_flops / flops_per_token(
        shape.parameters - shape.vocab * shape.hidden, shape.layers, shape.hidden, seq)
    step_s = job.train.batch_size * job.train.grad_accum * seq / one_node
    sharding = job.parallel.sharding if job.parallel.sharding != "NO_SHARD" else "FULL_SHARD"
    cluster = Cluster(name=profile.instance_type, nodes=nodes, gpus_per_node=gpus_per_node,
                      network_gbps=profile.network_gbps, nvlink_busbw_gbs=profile.gpu.nvlink_busbw_gbs)
    p = predict(params=shape.parameters, measured_step_s=step_s, measured_gpus=gpus_per_node,
                strategy=sharding, cluster=cluster)
    return Forecast(tokens_per_s_per_gpu=one_node * step_s / p.step_s, scaling_efficiency=p.efficiency,
                    gpus=nodes * gpus_per_node, usd_per_hour=nodes * profile.usd_per_hour)


def forecast_line(f: Forecast, profile: HardwareProfile, nodes: int) -> str:
    """The preview line."""
    assumed = "" if profile.gpu_model == MFU_MEASURED_ON else f" (assumed: the MFU measured on {MFU_MEASURED_ON})"
    return (f"job forecast: about {f.tokens_per_s_per_gpu:,.0f} tokens/s per GPU{assumed}, {f.tokens_per_s:,.0f} for "
            f"the job ({f.gpus} GPUs, {f.scaling_efficiency:.0%} of one node's per-GPU rate); GPU nodes "
            f"{nodes} x {profile.instance_type} at ${profile.usd_per_hour:,.2f}/h {profile.price_basis} "
            f"= ${f.usd_per_hour:,.2f}/h, about ${f.usd_per_billion_tokens:,.0f} "
            f"and {1e9 / f.tokens_per_s / 3600:.1f} h per billion tokens")


def idle_tail_line(usd_per_hour: float, nodes: int, scale_down_delay_minutes: int | None,
                   reservation: bool) -> str:
    """What the GPU nodes cost after the job ends: the autoscaler's delay x nodes x price
    (``scale_down_delay_minutes`` None: an existing cluster, whose GPU nodes this stack does not
    size). With a reservation or a capacity block the capacity bills whether nodes run or not,
    so scaling to zero saves nothing of it."""
    total = nodes * usd_per_hour
    if scale_down_delay_minutes is None:
        tail = (f"idle GPU nodes after the job: ${total:,.2f}/h for {nodes} of the existing cluster's, "
                "which this stack does not scale down")
    elif scale_down_delay_minutes == 0:
        tail = (f"idle tail after the job: ${total:,.2f}/h until the nodes are scaled down by hand "
                "(gpuNodes.scaleDownDelayMinutes is 0: no autoscaler)")
    else:
        tail = (f"idle tail after the job: {scale_down_delay_minutes} min x {nodes} nodes = "
                f"${total * scale_down_delay_minutes / 60:,.2f} before they scale to zero")
    if reservation:
        tail += "; the reservation itself bills whether nodes run or not"
    return tail
