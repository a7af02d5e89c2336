"""The GPUs fsdp-eks may run on, one row each: the denominator of MFU for the fine-tune and the
bench (looked up by torch's device name), and the GPU facts of the instance profiles of
components/planning/hardware.py, which name their GPU by the same key. Plain data (no torch, no
Pulumi): the training image is built from training/ alone, and the planning layer reads it too.

Adding a GPU is one row here (its name exactly as ``torch.cuda.get_device_name`` reports it);
an instance type with that GPU is then one row in components/planning/hardware.py.

Sources. Dense (no sparsity) tensor-core peaks, NVIDIA's datasheets: H100 (SXM bf16 989.5 and
fp8 1,979 TFLOP/s; PCIe 756 and 1,513), H200 (the H100 SXM's 989.5 and 1,979), H20 (148 and 296),
A100 (bf16 312; no float8 units), A10G (bf16 125; no float8 units), L40S (362 and 733), L4 (121
and 242.5); the datasheets print fp8 with sparsity, twice these. Memory: the datasheets' GB (an
H100's 80 GB reads 79.6 GiB in ``nvidia-smi``, an H200's 141 GB 143,771 MiB = 140.4 GiB,
docs/performance.md); the rows say 80 and 140, and the fit check keeps a margin. Power-capped
cards reach less than the peak: the 2 x H200 of docs/performance.md sustain about 660 TFLOP/s on
a bf16 matmul, bursts near 790. NVLink and node bus bandwidths: NODE_BUSBW_SOURCES.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One GPU model, as fsdp-eks needs to know it."""

    name: str
    """The GPU as ``torch.cuda.get_device_name`` reports it, e.g. ``NVIDIA H200``."""
    memory_gib: int
    """Memory of one GPU in GiB (80 GB HBM reads as 80 here: the fit check keeps a margin)."""
    peak_bf16_flops: float
    """Dense bf16 tensor-core peak, FLOP/s: the denominator of MFU."""
    peak_fp8_flops: float | None
    """Dense float8 tensor-core peak, FLOP/s; None: no float8 matrix units (``job.precision:
    fp8`` is refused on it)."""
    nvlink_busbw_gbs: float | None = None
    """NCCL bus bandwidth between GPUs of one node, GB/s, for the scaling model (240 measured on
    2 x H200, docs/performance.md; the H100's NVLink 4 assumed the same; 230 assumed for the
    A100's NVLink 3); None: no NVLink (PCIe cards), not a GPU of an instance profile."""
    published_node_busbw_gbs: float | None = None
    """Published nccl-tests all-reduce bus bandwidth of eight of these GPUs on their NVSwitch
    board (as in a p4de or p5 instance) at large sizes, GB/s (NODE_BUSBW_SOURCES); None: unknown,
    the node check reports the figure without a floor."""

    @property
    def float8(self) -> bool:
        """The GPU has float8 matrix units (Hopper and later)."""
        return self.peak_fp8_flops is not None


GPUS: dict[str, Gpu] = {g.name: g for g in (
    Gpu(name="NVIDIA A100-SXM4-80GB", memory_gib=80, peak_bf16_flops=312e12, peak_fp8_flops=None,
        nvlink_busbw_gbs=230.0, published_node_busbw_gbs=230.8),
    Gpu(name="NVIDIA H100 80GB HBM3", memory_gib=80, peak_bf16_flops=989.5e12, peak_fp8_flops=1979e12,
        nvlink_busbw_gbs=240.0, published_node_busbw_gbs=480.0),
    Gpu(name="NVIDIA H200", memory_gib=140, peak_bf16_flops=989.5e12, peak_fp8_flops=1979e12,
        nvlink_busbw_gbs=240.0, published_node_busbw_gbs=475.0),
    Gpu(name="NVIDIA H100 PCIe", memory_gib=80, peak_bf16_flops=756e12, peak_fp8_flops=1513e12),
    Gpu(name="NVIDIA H20", memory_gib=96, peak_bf16_flops=148e12, peak_fp8_flops=296e12),
    Gpu(name="NVIDIA A10G", memory_gib=24, peak_bf16_flops=125e12, peak_fp8_flops=None),
    Gpu(name="NVIDIA L40S", memory_gib=48, peak_bf16_flops=362e12, peak_fp8_flops=733e12),
    Gpu(name="NVIDIA L4", memory_gib=24, peak_bf16_flops=121e12, peak_fp8_flops=242.5e12),
)}
"""Every GPU fsdp-eks knows, by the name torch reports (exact: the H200 is not the H20, the H100
PCIe not the SXM)."""

NODE_BUSBW_SOURCES = {
    "NVIDIA A100-SXM4-80GB": "NVIDIA/nccl#527: all_reduce_perf, 8 x A100-SXM4 on one p4dn.24xlarge "
                             "(the same GPUs and NVSwitch as p4de), 1 GiB: busbw 230.8 GB/s",
    "NVIDIA H100 80GB HBM3": "NVIDIA GTC S62129, quoted in NVIDIA/nccl#1374: 8 x H100 SXM (NVLink 4 "
                             "with NVLink SHARP) all-reduce busbw 480 GB/s; 8 x H200 peak 475 GB/s "
                             "in NVIDIA/nccl-tests#272",
    "NVIDIA H200": "NVIDIA/nccl-tests#272: 8 x H200 (NVLink 4) all-reduce peak busbw 475 GB/s",
}
"""Where the published bus bandwidths inside a node come from."""


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``device_name``; None if the table lacks it (the
    fine-tune then reports no MFU)."""
    gpu = GPUS.get(device_name)
    return gpu.peak_bf16_flops if gpu else None
