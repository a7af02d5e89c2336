"""Fit in memory: the GPU-memory and host-memory checks of components/planning/memory_fit.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from components.planning import memory_fit
from components.planning.hardware import HardwareProfile
from components.settings import JobSettings, Problem, Settings, gpus_per_node, job_node_bounds
from training import config as training_config
from training.shapes import ModelShape


def _min_nodes(job: JobSettings) -> int:
    """Elastic jobs may run at their lower bound: the fewest GPUs, the largest shards."""
    return job_node_bounds(job)[0]


def _job_estimate(shape: ModelShape, job: JobSettings, profile: HardwareProfile,
                  training: training_config.JobConfig | None = None, nodes: int | None = None) -> memory_fit.MemoryEstimate:
    """The estimate of the job (or of ``training`` in its place) at its lower bound of nodes (or ``nodes``)."""
    return memory_fit.estimate(shape, training or job.training, nodes=nodes or _min_nodes(job),
                               gpus_per_node=gpus_per_node(job, profile))


def _full_shard(t: training_config.JobConfig) -> training_config.JobConfig:
    return replace(t, parallel=replace(t.parallel, sharding="FULL_SHARD", hsdp_shard_size=0))


def _full_checkpointing(t: training_config.JobConfig) -> training_config.JobConfig:
    return replace(t, parallel=replace(t.parallel, activation_checkpointing="full"))


def _batch_of_one(t: training_config.JobConfig) -> training_config.JobConfig:
    return replace(t, train=replace(t.train, batch_size=1))


ALTERNATIVES: tuple[tuple[str, Callable[[training_config.JobConfig], training_config.JobConfig]], ...] = (
    ("job.sharding FULL_SHARD", _full_shard),
    ("job.activationCheckpointing full", _full_checkpointing),
    ("job.sharding FULL_SHARD and job.activationCheckpointing full", lambda t: _full_checkpointing(_full_shard(t))),
    ("job.batchSize 1", _batch_of_one),
)
"""The changes of one or two keys the fit check suggests, each as the stack key(s) it names."""


def _what_would_fit(shape: ModelShape, job: JobSettings, profile: HardwareProfile) -> list[str]:
    """Changes of one or two keys that bring the estimate under the budget, each with its total."""
    budget = memory_fit.budget_gib(profile)
    t = job.training
    options = []
    for n in range(_min_nodes(job) + 1, memory_fit.MAX_SUGGESTED_NODES + 1):
        e = _job_estimate(shape, job, profile, _full_shard(t), nodes=n)
        if e.total <= budget:
            also = "" if t.parallel.sharding == "FULL_SHARD" else " with job.sharding FULL_SHARD"
            options.append(f"job.nodes {n}{also} (and gpuNodes.desiredSize/maxSize >= {n}): {e.total:.1f} GiB")
            break
    seen = [t]
    for key, change in ALTERNATIVES:
        changed = change(t)
        if changed in seen:
            continue  # already so, or the same as a single change above
        seen.append(changed)
        e = _job_estimate(shape, job, profile, changed)
        if e.total <= budget:
            options.append(f"{key}: {e.total:.1f} GiB")
    return options


def host_memory_rules(s: Settings) -> list[Problem]:
    """The host-memory check of components/planning/memory_fit.py: refuse an async-checkpointing
    job whose host copy would not fit in the memory the pod requests."""
    j = s.job
    t = j.training
    if (not t.checkpoint.async_checkpoint or t.model.model == training_config.TINY_MODEL or _min_nodes(j) < 1
            or (j.model_parameters is not None and j.model_parameters <= 0)):
        return []  # nothing staged, or the other rules report what is wrong
    shape = memory_fit.model_shape(t.model.model, j.model_parameters)
    if shape is None:
        return []  # gpu_memory_rules asks for the parameter count
    staged = memory_fit.staging_gib(shape, sharding=t.parallel.sharding, nodes=_min_nodes(j),
                         gpus_per_node=gpus_per_node(j, s.profile))
    requested = s.profile.pod_memory_gib_per_gpu
    if staged + memory_fit.HOST_ALLOWANCE_GIB <= requested:
        return []
    return [Problem("job.asyncCheckpoint", True,
                    f"an async checkpoint copies {staged:.1f} GiB per GPU process to host memory "
                    f"({memory_fit.STAGED_BYTES_PER_PARAM} B x {shape.parameters / 1e9:.2f}B parameters over the "
                    f"{t.parallel.sharding} shard group), which with {memory_fit.HOST_ALLOWANCE_GIB:.0f} GiB for the process "
                    f"exceeds the {requested} GiB the worker requests per GPU: run on more nodes, "
                    "use job.sharding FULL_SHARD, or set job.asyncCheckpoint false (checkpoints then "
                    "pause training while they are written)")]


def gpu_memory_rules(s: Settings) -> list[Problem]:
    """The GPU-memory check of components/planning/memory_fit.py: refuse a job whose per-GPU
    estimate exceeds the budget, with what would fit instead."""
    j, p = s.job, s.profile
    t = j.training
    if t.model.model == training_config.TINY_MODEL:
        return []
    if j.model_parameters is not None and j.model_parameters <= 0:
        return []  # the job rules report it; nothing sensible to estimate
    shape = memory_fit.model_shape(t.model.model, j.model_parameters)
    if shape is None:
        return [Problem("job.modelParameters", None,
                        f"{t.model.model} is not in the GPU-memory fit check's table (components/planning/memory_fit.py): "
                        "give its parameter count in billions, e.g. modelParameters: 8.0")]
    if min(j.nodes, _min_nodes(j)) < 1:
        return []  # the job rules report these; nothing sensible to estimate
    e = _job_estimate(shape, j, p)
    budget = memory_fit.budget_gib(p)
    if e.total <= budget:
        return []
    gpus = gpus_per_node(j, p)
    nodes = _min_nodes(j)
    value = (f"{t.model.model} on {nodes} x {p.instance_type} ({nodes * gpus} GPUs), {t.parallel.sharding}, "
             f"batchSize {t.train.batch_size}, seqLen {t.data.seq_len}, "
             f"activationCheckpointing {t.parallel.activation_checkpointing}")
    options = _what_would_fit(shape, j, p)
    would = ("would fit: " + "; ".join(options)) if options else (
        f"nothing up to {memory_fit.MAX_SUGGESTED_NODES} nodes fits: use a smaller model or a GPU with more memory")
    return [Problem("job", value,
                    f"does not fit in GPU memory: estimated {e.total:.1f} GiB per GPU > {budget:.1f} GiB "
                    f"({memory_fit.BUDGET_FRACTION:.0%} of {p.gpu.memory_gib} GiB, {p.gpu_model}): "
                    f"{e.breakdown(shape, t.parallel.activation_checkpointing)}. It {would}")]
