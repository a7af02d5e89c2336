"""The job's own keys (nodes, elastic range, GPUs and EFA per node) and how its training keys meet the profile."""

from __future__ import annotations

from components.settings import Problem, Settings, gpus_per_node, job_node_bounds
from training.shapes import trained_context


def job_rules(s: Settings) -> list[Problem]:
    """The job's own keys. Its training keys are the package's, checked by the package's rules."""
    j, p = s.job, s.profile
    problems = []
    if j.nodes < 1:
        problems.append(Problem("job.nodes", j.nodes, "must be at least 1"))
    if j.max_restarts < 0:
        problems.append(Problem("job.maxRestarts", j.max_restarts, "must be 0 or more"))
    if j.model_parameters is not None and j.model_parameters <= 0:
        problems.append(Problem("job.modelParameters", j.model_parameters,
                                "give the parameter count in billions, e.g. 8.0"))
    if j.gpus_per_node is not None and not 1 <= j.gpus_per_node <= p.gpus:
        problems.append(Problem("job.gpusPerNode", j.gpus_per_node, f"use 1..{p.gpus} ({p.instance_type})"))
    if j.efa_per_node is not None and not 0 <= j.efa_per_node <= p.efa_interfaces:
        problems.append(Problem("job.efaPerNode", j.efa_per_node,
                                f"use 0..{p.efa_interfaces} ({p.instance_type}); leave unset for all"))
    lo, hi = job_node_bounds(j)
    if not 1 <= lo <= j.nodes <= hi:
        problems.append(Problem("job.minNodes/maxNodes", [lo, hi],
                                f"need 1 <= minNodes <= nodes ({j.nodes}) <= maxNodes"))
    if s.creates_cluster and hi > s.gpu_nodes.max_size:
        problems.append(Problem("job.maxNodes", hi, f"at most gpuNodes.maxSize ({s.gpu_nodes.max_size})"))
    if s.creates_cluster and not s.gpu_nodes.autoscaling and j.nodes > s.gpu_nodes.desired_size:
        # With the autoscaler the job's pending pods bring nodes up to maxSize (checked above).
        problems.append(Problem("job.nodes", j.nodes,
                                f"raise gpuNodes.desiredSize ({s.gpu_nodes.desired_size}) or lower job.nodes: "
                                "the job would wait for nodes that never come"))
    if j.training.model.precision == "fp8" and not p.gpu.float8:
        problems.append(Problem("job.precision", "fp8",
                                f"{p.instance_type}'s {p.gpu_model} has no float8 matrix units: use bf16 "
                                "(or a profile with H100s, e.g. p5)"))
    if j.training.parallel.sharding == "HYBRID_SHARD" and j.nodes < 2:
        problems.append(Problem("job.sharding", "HYBRID_SHARD", "HYBRID_SHARD replicates across nodes: use "
                                "FULL_SHARD on one node, or job.nodes >= 2"))
    return problems + _hsdp_shard_problems(s)


def _hsdp_worlds(s: Settings) -> list[tuple[int, int]]:
    """(nodes, GPUs) of every world the job can run at (each node count of its elastic range)."""
    lo, hi = job_node_bounds(s.job)
    gpus = gpus_per_node(s.job, s.profile)
    return [(n, n * gpus) for n in sorted({s.job.nodes, *range(max(lo, 1), hi + 1)})]


def _hsdp_shard_problems(s: Settings) -> list[Problem]:
    """HYBRID_SHARD's 2-D mesh is (replicas, shard size): the shard size must divide the world
    size, at every node count the job can run at (torch's DeviceMesh refuses otherwise, in the pod)."""
    shard = s.job.training.parallel.hsdp_shard_size
    if s.job.training.parallel.sharding != "HYBRID_SHARD" or shard < 1:
        return []
    bad = [f"{nodes} x {world // nodes} = {world}" for nodes, world in _hsdp_worlds(s) if world % shard]
    if not bad:
        return []
    return [Problem("job.hsdpShardSize", shard,
                    f"must divide the world size, job nodes x GPUs per node ({', '.join(bad)} GPUs): use a "
                    f"divisor, e.g. {gpus_per_node(s.job, s.profile)} (one node's GPUs), or leave it unset")]


def hsdp_straddles_nodes_warning(s: Settings) -> list[Problem]:
    """A shard group that is neither a part nor a multiple of a node mixes NVLink and EFA links in
    its all-gathers and reduce-scatters: it runs, at the slower link's speed."""
    shard, gpus = s.job.training.parallel.hsdp_shard_size, gpus_per_node(s.job, s.profile)
    if s.job.training.parallel.sharding != "HYBRID_SHARD" or shard < 1 or gpus % shard == 0 or shard % gpus == 0:
        return []
    return [Problem("job.hsdpShardSize", shard,
                    f"does not divide the {gpus} GPUs per node nor is a multiple of it: some shard groups span "
                    "two nodes, and their collectives run at the network's speed instead of NVLink's; use a "
                    f"divisor or a multiple of {gpus}")]


def no_efa_across_nodes_warning(s: Settings) -> list[Problem]:
    """Without EFA, NCCL between nodes runs over TCP sockets on the instance's ENA network
    (``via NET/Socket``, docs/design.md#gpu-nodes-and-efa): it works, at a fraction of the
    fabric's speed, and the node check's inter-node floor scales to zero with it."""
    _, hi = job_node_bounds(s.job)
    if s.job.efa_per_node != 0 or hi < 2:
        return []
    return [Problem("job.efaPerNode", 0,
                    f"a job of up to {hi} nodes without EFA: its collectives between nodes run over TCP "
                    f"sockets instead of the {s.profile.efa_interfaces} EFA interfaces of {s.profile.instance_type}, "
                    "many times slower, and the node check expects no fabric bandwidth; leave it unset "
                    "for all of them")]


def context_warning(s: Settings) -> list[Problem]:
    """A sequence longer than the model's trained context: positions beyond it were never trained
    (rotary embeddings extrapolate badly). The job fits it in memory; the quality is the risk."""
    trained = trained_context(s.job.training.model.model)
    seq_len = s.job.training.data.seq_len
    if trained is None or seq_len <= trained:
        return []
    return [Problem("job.seqLen", seq_len,
                    f"{s.job.training.model.model} was trained at {trained:,} positions: beyond that its rotary "
                    "position embeddings are untrained and quality drops. The fine-tune has no RoPE-scaling "
                    f"option: use at most {trained}, or a model whose config.json sets rope_scaling for the "
                    "length you need")]
