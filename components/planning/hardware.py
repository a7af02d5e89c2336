"""The GPU instance profiles fsdp-eks knows, one row each.

Every number here is a fact of the EC2 instance type: the launch template's network interfaces,
the PyTorchJob's GPU and EFA requests, the memory-fit check, the reservation rule and the
scaling report's network all read this table. Adding an instance type is one row here and one
stack file (README, "Changing things"). Sources: EC2 "EFA for accelerated instance types" guide
(network cards, EFA interfaces, Gbit/s:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), the P5 and P4
instance pages (GPUs, GPU memory, how p4de is sold: https://aws.amazon.com/ec2/instance-types/p5/,
https://aws.amazon.com/ec2/instance-types/p4/). The GPU's bf16 peak is the training package's
table (training/hardware.py), which the fine-tune reads too.

p5e and p5en (8 x H200 141 GB each): the EFA page above ("P5 and P5e instances support up to 32
network cards and up to 3200 Gbps"), the EC2 Capacity Blocks pricing page (p5e.48xlarge: 8 x H200,
192 vCPUs, 2048 GiB, 1128 GB HBM3, 3200 Gigabit, sold as Capacity Blocks) and, for p5en, torchx's
named resource ``aws_p5en_48xlarge`` (meta-pytorch/torchx#995: 192 vCPUs, 2048 GiB, 16 EFA
devices) with the P5 page's 3200 Gbps of EFAv3 (16 cards of 200 Gbps). vCPUs and memory of
every row: the instance type pages (p4de 96 vCPUs and 1152 GiB, p5/p5e/p5en 192 vCPUs and
2048 GiB). GPU memory: an H100's 80 GB reads 79.6 GiB in
``nvidia-smi``, an H200's 141 GB 143,771 MiB = 140.4 GiB (docs/performance.md); the rows say 80
and 140, and the fit check keeps a margin.

Prices, USD per instance-hour, Linux, each with its basis (``price_basis``, printed with it):
p5.48xlarge 55.04 on demand in us-east-1 after AWS's price cut of June 2025 ("up to 45 %" for
P5; 98.32 before); p4de.24xlarge 27.45, the former 40.97 less the announced 33 % for P4d/P4de
(this session could not re-read the on-demand page: check it before budgeting); p5en.48xlarge
63.296 on demand in us-east-1, us-east-2 and us-west-2 (``dstack offer`` listing of August 2026,
dstackai/dstack#4110); p5e.48xlarge has no on-demand price: 43.26 is its Capacity Block rate in
us-east-2 until 2025-01-01 (EC2 Capacity Blocks pricing page; the rate follows supply and
demand: the block's quote is the price). Other regions and Savings Plans differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from training.hardware import peak_bf16_flops


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """One accelerated EC2 instance type, as fsdp-eks needs to know it."""

    instance_type: str
    """EC2 instance type, e.g. ``p5.48xlarge``."""
    gpus: int
    """GPUs per instance; also ``nprocPerNode`` of the training job."""
    gpu_model: str
    """The GPU as ``torch.cuda.get_device_name`` reports it (the key of its bf16 peak)."""
    gpu_memory_gib: int
    """Memory of one GPU in GiB (80 GB HBM reads as 80 here: the fit check keeps a margin)."""
    network_cards: int
    """Network cards of the instance: one EFA interface per card."""
    network_gbps: int
    """Aggregate EFA bandwidth of the instance in Gbit/s (the scaling report's network)."""
    reservation_only: bool = False
    """Sold only through capacity reservations (an ODCR or a capacity block), never plain
    On-Demand: the stack refuses it without ``gpuNodes.capacityReservationId``."""
    float8: bool
    """The GPU has float8 matrix units (Hopper and later): ``job.precision: fp8`` is allowed."""
    nvlink_busbw_gbs: float
    """NCCL bus bandwidth inside a node, GB/s, for the scaling model (240 measured on 2 x H200,
    docs/performance.md; 230 assumed for the A100's NVLink 3)."""
    vcpus: int
    """vCPUs of the instance: what it takes of the account's EC2 vCPU quota, and the pod's CPU
    request per GPU is derived from it."""
    memory_gib: int
    """Memory of the instance, GiB."""
    usd_per_hour: float
    """Price of one instance, USD per hour, as ``price_basis`` says."""
    price_basis: str
    """Where and when ``usd_per_hour`` holds, as the forecast prints it after the price."""
    published_node_busbw_gbs: float | None = None
    """Published nccl-tests all-reduce bus bandwidth of all the instance's GPUs inside one
    instance at large sizes, GB/s (sources in NODE_CHECK_SOURCES); None: unknown, the node
    check reports the figure without a floor."""
    published_efa_busbw_gbs: float | None = None
    """Published nccl-tests all-reduce bus bandwidth between instances over all their EFA
    interfaces, GB/s (NODE_CHECK_SOURCES); None: unknown, reported without a floor."""

    @property
    def efa_interfaces(self) -> int:
        """EFA devices the node exposes as ``vpc.amazonaws.com/efa``: one per network card."""
        return self.network_cards

    @property
    def min_node_busbw_gbs(self) -> float:
        """The node check's floor inside a node: the published figure x NODE_CHECK_MARGIN."""
        return round((self.published_node_busbw_gbs or 0.0) * NODE_CHECK_MARGIN, 1)

    @property
    def min_efa_busbw_gbs(self) -> float:
        """The node check's floor between nodes over every EFA interface."""
        return round((self.published_efa_busbw_gbs or 0.0) * NODE_CHECK_MARGIN, 1)

    @property
    def gpu_peak_bf16_flops(self) -> float | None:
        """Dense bf16 peak of one GPU, FLOP/s (training/hardware.py): the denominator of MFU."""
        return peak_bf16_flops(self.gpu_model)

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
    "p4de inside a node": "NVIDIA/nccl#527: all_reduce_perf, 8 x A100-SXM4 on one p4dn.24xlarge "
                          "(the same GPUs and NVSwitch as p4de), 1 GiB: busbw 230.8 GB/s",
    "p4de over EFA": "NVIDIA/nccl#527: the same test on 2 x p4dn.24xlarge (4 x 100 Gbit/s EFA, "
                     "as p4de), 1 GiB: busbw 57.2 GB/s",
    "p5 inside a node": "NVIDIA GTC S62129, quoted in NVIDIA/nccl#1374: 8 x H100 SXM (NVLink 4 "
                        "with NVLink SHARP) all-reduce busbw 480 GB/s; 8 x H200 peak 475 GB/s "
                        "in NVIDIA/nccl-tests#272",
    "p5 over EFA": "aws/aws-k8s-tester#503 (the EKS maintainers' NCCL test on 2 x p5.48xlarge, "
                   "32 x 100 Gbit/s EFA): 'Avg bus bandwidth' 124-125 GB/s, an average over all "
                   "the swept sizes, so below the large-size figure",
    "p5e and p5en inside a node": "NVIDIA/nccl-tests#272: 8 x H200 (NVLink 4) all-reduce peak "
                                  "busbw 475 GB/s",
    "p5e and p5en over EFA": "none found for these types: reported without a floor",
}
"""Where the published bus bandwidths of the rows come from."""

ON_DEMAND_US_EAST_1 = "on demand (us-east-1, 2025-06-05)"
"""The basis of the on-demand prices read from https://aws.amazon.com/ec2/pricing/on-demand/."""

PROFILES: dict[str, HardwareProfile] = {
    "p4de": HardwareProfile(
        instance_type="p4de.24xlarge",
        gpus=8,
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_memory_gib=80,
        network_cards=4,
        network_gbps=400,
        float8=False,
        nvlink_busbw_gbs=230.0,
        vcpus=96,
        memory_gib=1152,
        usd_per_hour=27.45,
        price_basis=ON_DEMAND_US_EAST_1,
        reservation_only=True,
        published_node_busbw_gbs=230.8,
        published_efa_busbw_gbs=57.2,
    ),
    "p5": HardwareProfile(
        instance_type="p5.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_memory_gib=80,
        network_cards=32,
        network_gbps=3200,
        float8=True,
        nvlink_busbw_gbs=240.0,
        vcpus=192,
        memory_gib=2048,
        usd_per_hour=55.04,
        price_basis=ON_DEMAND_US_EAST_1,
        published_node_busbw_gbs=480.0,
        published_efa_busbw_gbs=125.0,
    ),
    "p5e": HardwareProfile(
        instance_type="p5e.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H200",
        gpu_memory_gib=140,
        network_cards=32,
        network_gbps=3200,
        float8=True,
        nvlink_busbw_gbs=240.0,
        vcpus=192,
        memory_gib=2048,
        usd_per_hour=43.26,
        price_basis="as a Capacity Block (us-east-2, to 2025-01-01; no on-demand price)",
        reservation_only=True,
        published_node_busbw_gbs=475.0,
    ),
    "p5en": HardwareProfile(
        instance_type="p5en.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H200",
        gpu_memory_gib=140,
        network_cards=16,
        network_gbps=3200,
        float8=True,
        nvlink_busbw_gbs=240.0,
        vcpus=192,
        memory_gib=2048,
        usd_per_hour=63.296,
        price_basis="on demand (us-east-1, 2026-08)",
        published_node_busbw_gbs=475.0,
    ),
}
