"""The GPU instance profiles fsdp-eks knows, one row each.

Every number here is a fact of the EC2 instance type (EC2 "EFA for accelerated instance types"
guide, and the instance type pages): the launch template's network interfaces, the PyTorchJob's
GPU and EFA requests, the memory fit check and the MFU peak are all derived from this table.
Adding an instance type is adding one row.

Prices: on-demand Linux rates in us-east-1 in USD per instance-hour, as of PRICES_AS_OF, from the
EC2 on-demand pricing page after AWS's price cut of June 2025 ("up to 45 %" for P5, "up to 33 %"
for P4d/P4de). p5.48xlarge: 55.04 (98.32 before); p4de.24xlarge: 27.45, the former 40.97 less
the announced 33 % (this session could not re-read the page: check it before budgeting; other
regions, Savings Plans and capacity blocks differ).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """One accelerated EC2 instance type, as fsdp-eks needs to know it."""

    instance_type: str
    """EC2 instance type, e.g. ``p5.48xlarge``."""
    gpus: int
    """GPUs per instance; also ``nprocPerNode`` of the training job."""
    gpu_model: str
    """Marketing name of the GPU, for humans and dashboards."""
    gpu_memory_gib: int
    """Memory of one GPU in GiB (80 GB HBM reads as 80 here: the fit check keeps a margin)."""
    gpu_peak_bf16_tflops: float
    """Dense bf16 peak of one GPU (datasheet), the denominator of MFU."""
    network_cards: int
    """Network cards of the instance: one EFA interface per card."""
    network_gbps: int
    """Aggregate EFA bandwidth of the instance in Gbit/s."""
    local_nvme_drives: int
    """Instance-store NVMe drives, striped into one RAID0 by the AL2023 NodeConfig."""
    float8: bool
    """The GPU has float8 matrix units (Hopper and later): ``job.precision: fp8`` is allowed."""
    nvlink_busbw_gbs: float
    """NCCL bus bandwidth inside a node, GB/s, for the scaling model (240 measured on 2 x H200,
    docs/performance.md; 230 assumed for the A100's NVLink 3)."""
    on_demand_usd_per_hour: float
    """On-demand price of one instance, USD per hour (see PRICES_AS_OF)."""

    @property
    def efa_interfaces(self) -> int:
        """EFA devices the node exposes as ``vpc.amazonaws.com/efa``: one per network card."""
        return self.network_cards


PRICES_AS_OF = "2025-06-05"
PRICE_SOURCE = "https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux)"

PROFILES: dict[str, HardwareProfile] = {
    "p4de": HardwareProfile(
        instance_type="p4de.24xlarge",
        gpus=8,
        gpu_model="A100 80GB",
        gpu_memory_gib=80,
        gpu_peak_bf16_tflops=312.0,
        network_cards=4,
        network_gbps=400,
        local_nvme_drives=8,
        float8=False,
        nvlink_busbw_gbs=230.0,
        on_demand_usd_per_hour=27.45,
    ),
    "p5": HardwareProfile(
        instance_type="p5.48xlarge",
        gpus=8,
        gpu_model="H100 80GB",
        gpu_memory_gib=80,
        gpu_peak_bf16_tflops=989.5,
        network_cards=32,
        network_gbps=3200,
        local_nvme_drives=8,
        float8=True,
        nvlink_busbw_gbs=240.0,
        on_demand_usd_per_hour=55.04,
    ),
}
