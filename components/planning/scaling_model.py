"""Step time and scaling efficiency of FSDP on many nodes, on paper, from a measured step.

Pure arithmetic (no torch): `predict` takes the step time measured on one node and adds what
FSDP's collectives cost once they cross the network.

Traffic per optimizer step (P parameters; bf16 all-gathers, fp32 reductions, as the package's
mixed-precision policy does):

- FULL_SHARD over N GPUs: all-gather the bf16 parameters in forward and again in backward
  (2 x 2P bytes) and reduce-scatter the fp32 gradients once (4P): 8P x (N-1)/N per GPU.
- SHARD_GRAD_OP: one all-gather (2P) and the reduce-scatter (4P): 6P x (N-1)/N.
- HYBRID_SHARD (shard inside a node of g GPUs, replicate over M nodes): both all-gathers and the
  reduce-scatter stay on NVLink (8P x (g-1)/g); the fp32 gradient shards are then all-reduced
  across nodes: 2 x 4P x (M-1)/M per node, in backward only.

Time of a collective = its bytes per GPU / bus bandwidth, as nccl-tests defines it. A ring that
leaves the node runs at the node's network bandwidth (NIC line rate x `net_efficiency`: each of a
node's g rings crosses the network once, through its own NIC); inside a node at the measured
NVLink bus bandwidth. Overlap: FSDP issues the forward all-gathers during forward compute
(1/3 of the step's compute) and the backward all-gathers and reductions during backward (2/3);
a phase hides communication up to `overlap` x its compute time and exposes the rest. Running
beside the matmuls, NCCL's kernels take SMs: `contention` is the compute time lost per second of
hidden communication (calibrated on 2 x H200: see docs/performance.md).

Efficiency = step time on one node / step time on M nodes, at the same per-GPU batch: the
per-GPU throughput kept when scaling out (the blog's 87 % from 1 to 16 p5 nodes is this
number). The measured step (2 GPUs here) is first stripped of its own NVLink costs, then both
one node and M nodes are predicted from that compute time. Assumptions, not measurements: the
network fraction, the overlap, the contention and its basis (see `predict`), and that an H100's
compute time equals the H200's (an A100's: scaled by the peak ratio, same MFU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9
CONTENTION = 0.6
"""Step time lost per second of hidden collective time (at the bus bandwidth measured alone),
FSDP's copy-in/copy-out kernels included. Calibrated on 2 x H200, Llama-2-7B, full AC + compile,
batch 3: 2 GPUs 1.244 s/step; 1 GPU 1.216 s, of which 39 ms is the second half of the optimizer
step that 2 GPUs split (profile), so communicating cost 67 ms for 112 ms of NVLink collectives
(32 layers x (2 all-gathers of 0.9 ms + 1 reduce-scatter of 1.6 ms), plus the root's)."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes of one instance type."""

    name: str
    nodes: int
    gpus_per_node: int
    network_gbps: float
    """Line rate of all of a node's EFA interfaces together, Gbit/s."""
    nvlink_busbw_gbs: float
    """Achieved NCCL bus bandwidth inside a node, GB/s."""
    net_efficiency: float = 0.8
    """Fraction of the line rate NCCL achieves across nodes (assumption)."""

    @property
    def net_busbw_gbs(self) -> float:
        return self.network_gbps / 8 * self.net_efficiency


@dataclass(frozen=True, kw_only=True)
class Prediction:
    strategy: str
    step_s: float
    one_node_step_s: float
    """Predicted for one node of the cluster (its GPUs on NVLink)."""
    comm_s: float
    """Collective time per step if nothing overlapped."""
    exposed_s: float
    contention_s: float

    @property
    def efficiency(self) -> float:
        """Per-GPU throughput on the cluster relative to one node of it."""
        return self.one_node_step_s / self.step_s


def collectives(params: float, strategy: str, cluster: Cluster) -> list[tuple[str, float, float]]:
    """FSDP's collectives per step on `cluster`: (phase, seconds, bus bandwidth in B/s)."""
    n = cluster.nodes * cluster.gpus_per_node
    g, m = cluster.gpus_per_node, cluster.nodes
    nvl = cluster.nvlink_busbw_gbs * GB
    # a ring through every GPU is as fast as its slowest hop: the NICs once it leaves the node
    ring = min(cluster.net_busbw_gbs * GB, nvl) if m > 1 else nvl
    ag, rs = 2 * params, 4 * params  # bytes of one bf16 all-gather, one fp32 reduce-scatter
    if strategy == "FULL_SHARD":
        t = ag * (n - 1) / n / ring
        return [("fwd", t, ring), ("bwd", t, ring), ("bwd", rs * (n - 1) / n / ring, ring)]
    if strategy == "SHARD_GRAD_OP":
        return [("fwd", ag * (n - 1) / n / ring, ring), ("bwd", rs * (n - 1) / n / ring, ring)]
    if strategy == "HYBRID_SHARD":
        t = ag * (g - 1) / g / nvl
        out = [("fwd", t, nvl), ("bwd", t, nvl), ("bwd", rs * (g - 1) / g / nvl, nvl)]
        if m > 1:
            net = cluster.net_busbw_gbs * GB
            out.append(("bwd", 2 * rs * (m - 1) / m / net, net))
        return out
    raise ValueError(f"unknown strategy {strategy}")


def collective_seconds(params: float, strategy: str, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) collective time per step on `cluster`, seconds, nothing hidden."""
    pieces = collectives(params, strategy, cluster)
    return (sum(t for ph, t, _ in pieces if ph == "fwd"),
            sum(t for ph, t, _ in pieces if ph == "bwd"))


def _costs(params: float, strategy: str, cluster: Cluster, compute_s: float, overlap: float,
           contention: float, per: str) -> tuple[float, float, float]:
    """(collective seconds, exposed seconds, contention seconds) of one step."""
    pieces = collectives(params, strategy, cluster)
    nvl = cluster.nvlink_busbw_gbs * GB
    total = exposed = lost = 0.0
    for phase, share in (("fwd", 1 / 3), ("bwd", 2 / 3)):
        mine = [(t, bw) for ph, t, bw in pieces if ph == phase]
        comm = sum(t for t, _ in mine)
        if comm == 0:
            continue
        hidden = min(comm, overlap * share * compute_s)
        exposed += comm - hidden
        total += comm
        for t, bw in mine:  # hidden time spread over the phase's collectives by duration
            h = hidden * t / comm
            lost += contention * (h if per == "seconds" else h * min(1.0, bw / nvl))
    return total, exposed, lost


def predict(*, params: float, measured_step_s: float, measured_gpus: int, strategy: str,
            cluster: Cluster, overlap: float = 0.9, contention: float = CONTENTION,
            contention_per: str = "seconds") -> Prediction:
    """Step time on one node and on `cluster`, from a step measured on `measured_gpus` GPUs
    of one node (same per-GPU batch and strategy).

    contention_per: "seconds" charges `contention` per second of hidden collective time (NCCL's
    blocks hold SMs for as long as a collective lasts: pessimistic for slow networks); "bytes"
    per NVLink-equivalent second (the GPU-side copy work per byte is what costs: optimistic).
    """
    assert contention_per in ("seconds", "bytes")

    args = (overlap, contention, contention_per)
    measured = replace(cluster, nodes=1, gpus_per_node=measured_gpus)
    _, exposed_m, lost_m = _costs(params, strategy, measured, measured_step_s, *args)
    compute = measured_step_s - exposed_m - lost_m
    _, exposed_1, lost_1 = _costs(params, strategy, replace(cluster, nodes=1), compute, *args)
    comm, exposed, lost = _costs(params, strategy, cluster, compute, *args)
    return Prediction(strategy=strategy, step_s=compute + exposed + lost,
                      one_node_step_s=compute + exposed_1 + lost_1, comm_s=comm,
                      exposed_s=exposed, contention_s=lost)
