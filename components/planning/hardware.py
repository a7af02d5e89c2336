"""The GPU instance profiles fsdp-eks knows, one row each.

Every number here is a fact of the EC2 instance type: the launch template's network interfaces,
the PyTorchJob's GPU and EFA requests, the memory-fit check, the reservation rule and the
scaling report's network all read this table. Adding an instance type is one row here and one
stack file (README, "Changing things"). The GPU's own facts (memory, bf16 and float8 peaks,
NVLink) are its row in the training package's GPU table (training/hardware.py), which the
fine-tune reads too: a row names its GPU, and an instance type with a new GPU is a row there and
a row here.

Where each row's numbers and price come from: docs/design.md, "GPU nodes and EFA", one bullet a
row (a test keeps the bullets equal to the rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from training.hardware import GPUS, Gpu


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """One accelerated EC2 instance type, as fsdp-eks needs to know it."""

    instance_type: str
    """EC2 instance type, e.g. ``p5.48xlarge``."""
    gpus: int
    """GPUs per instance; also ``nprocPerNode`` of the training job."""
    gpu_model: str
    """The GPU as ``torch.cuda.get_device_name`` reports it: the key of its row in
    training/hardware.py's GPUS."""
    network_cards: int
    """Network cards of the instance: one EFA interface per card."""
    network_gbps: int
    """Aggregate EFA bandwidth of the instance in Gbit/s (the scaling report's network)."""
    reservation_only: bool = False
    """Sold only through capacity reservations (an ODCR or a capacity block), never plain
    On-Demand: the stack refuses it without ``gpuNodes.capacityReservationId``."""
    vcpus: int
    """vCPUs of the instance: what it takes of the account's EC2 vCPU quota, and the pod's CPU
    request per GPU is derived from it."""
    memory_gib: int
    """Memory of the instance, GiB."""
    usd_per_hour: float
    """Price of one instance, USD per hour, as ``price_basis`` says."""
    price_basis: str
    """Where and when ``usd_per_hour`` holds, as the forecast prints it after the price."""
    published_efa_busbw_gbs: float | None = None
    """Published nccl-tests all-reduce bus bandwidth between instances over all their EFA
    interfaces, GB/s (NODE_CHECK_SOURCES); None: unknown, reported without a floor."""

    def __post_init__(self) -> None:
        gpu = GPUS.get(self.gpu_model)
        if gpu is None or gpu.nvlink_busbw_gbs is None:
            raise ValueError(
                f"{self.instance_type}: GPU {self.gpu_model!r} has no row with NVLink figures in "
                f"training/hardware.py's GPUS: add its row there (name as torch.cuda.get_device_name "
                f"reports it, memory, peaks, NVLink), or name a GPU of that table")

    @property
    def gpu(self) -> Gpu:
        """The row of its GPU (memory, peaks, NVLink)."""
        return GPUS[self.gpu_model]

    @property
    def efa_interfaces(self) -> int:
        """EFA devices the node exposes as ``vpc.amazonaws.com/efa``: one per network card."""
        return self.network_cards

    @property
    def min_node_busbw_gbs(self) -> float:
        """The node check's floor inside a node: the published figure x NODE_CHECK_MARGIN."""
        return round((self.gpu.published_node_busbw_gbs or 0.0) * NODE_CHECK_MARGIN, 1)

    @property
    def min_efa_busbw_gbs(self) -> float:
        """The node check's floor between nodes over every EFA interface."""
        return round((self.published_efa_busbw_gbs or 0.0) * NODE_CHECK_MARGIN, 1)

    @property
    def pod_cpu_per_gpu(self) -> int:
        """CPU the worker pod requests per GPU: ``POD_SHARE`` of the instance's vCPUs per GPU,
        at most ``POD_CPU_PER_GPU``."""
        return min(POD_CPU_PER_GPU, int(POD_SHARE * self.vcpus / self.gpus))

    @property
    def pod_memory_gib_per_gpu(self) -> int:
        """Memory (GiB) the worker pod requests per GPU: ``POD_SHARE`` of the instance's memory
        per GPU, at most ``POD_MEMORY_GIB_PER_GPU``; also the host memory an async checkpoint's
        copy must fit in (the fit check)."""
        return min(POD_MEMORY_GIB_PER_GPU, int(POD_SHARE * self.memory_gib / self.gpus))


POD_SHARE = Fraction(2, 3)
"""Of an instance's vCPUs and memory, the part the training pod requests at most: the rest is
the kubelet's and system reservation, the DaemonSets (device plugins, DCGM, node exporter) and
the page cache. Requests only: a pod may use the memory above them."""
POD_CPU_PER_GPU = 8
POD_MEMORY_GIB_PER_GPU = 96
"""What one training process asks for: a core per DataLoader worker and the process, host memory
for the process and an async checkpoint's staged copy (``components/planning/memory_fit.py``)."""


NODE_CHECK_MARGIN = 0.5
"""The node check fails a node or fabric below half the published bus bandwidth. Why half:
the check measures at the sizes FSDP moves for the job's model (one layer, the root unit: about
0.1 to 8 GB), mostly below the 1 GiB and larger sizes where nccl-tests peaks; torch adds its
own launch overhead; published runs differ in NCCL, aws-ofi-nccl and EFA versions. The faults
it is for land far below half: NCCL on TCP sockets instead of EFA (a few GB/s), a missing EFA
interface or NVLink, a GPU fallen back to PCIe."""

NODE_CHECK_SOURCES = {
    "p4de over EFA": "NVIDIA/nccl#527: the same test on 2 x p4dn.24xlarge (4 x 100 Gbit/s EFA, "
                     "as p4de), 1 GiB: busbw 57.2 GB/s",
    "p5 over EFA": "aws/aws-k8s-tester#503 (the EKS maintainers' NCCL test on 2 x p5.48xlarge, "
                   "32 x 100 Gbit/s EFA): 'Avg bus bandwidth' 124-125 GB/s, an average over all "
                   "the swept sizes, so below the large-size figure",
    "p5e and p5en over EFA": "none found for these types: reported without a floor",
}
"""Where the published bus bandwidths between instances come from (inside an instance: its
GPU's row, training/hardware.py NODE_BUSBW_SOURCES)."""

ON_DEMAND_US_EAST_1 = "on demand (us-east-1, 2025-06-05)"
"""The basis of the on-demand prices read from https://aws.amazon.com/ec2/pricing/on-demand/."""

PROFILES: dict[str, HardwareProfile] = {
    "p4de": HardwareProfile(
        instance_type="p4de.24xlarge",
        gpus=8,
        gpu_model="NVIDIA A100-SXM4-80GB",
        network_cards=4,
        network_gbps=400,
        vcpus=96,
        memory_gib=1152,
        usd_per_hour=27.45,
        price_basis=ON_DEMAND_US_EAST_1,
        reservation_only=True,
        published_efa_busbw_gbs=57.2,
    ),
    "p5": HardwareProfile(
        instance_type="p5.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H100 80GB HBM3",
        network_cards=32,
        network_gbps=3200,
        vcpus=192,
        memory_gib=2048,
        usd_per_hour=55.04,
        price_basis=ON_DEMAND_US_EAST_1,
        published_efa_busbw_gbs=125.0,
    ),
    "p5e": HardwareProfile(
        instance_type="p5e.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H200",
        network_cards=32,
        network_gbps=3200,
        vcpus=192,
        memory_gib=2048,
        usd_per_hour=43.26,
        price_basis="as a Capacity Block (us-east-2, to 2025-01-01; no on-demand price)",
        reservation_only=True,
    ),
    "p5en": HardwareProfile(
        instance_type="p5en.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H200",
        network_cards=16,
        network_gbps=3200,
        vcpus=192,
        memory_gib=2048,
        usd_per_hour=63.296,
        price_basis="on demand (us-east-1, 2026-08)",
    ),
}
