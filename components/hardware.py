"""The GPU instance profiles fsdp-eks knows, one row each.

Every number here is a fact of the EC2 instance type: the launch template's network interfaces,
the PyTorchJob's GPU and EFA requests, the memory-fit check, the reservation rule and the
scaling report's network all read this table. Adding an instance type (p5e, p5en, p6) is one row.
Sources: EC2 "EFA for accelerated instance types" guide (network cards, EFA interfaces, Gbit/s:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), the P5 and P4 instance pages
(GPUs, GPU memory, how p4de is sold: https://aws.amazon.com/ec2/instance-types/p5/,
https://aws.amazon.com/ec2/instance-types/p4/). The GPU's bf16 peak is the training package's
table (training/hardware.py), which the fine-tune reads too.

Prices: on-demand Linux rates in us-east-1 in USD per instance-hour, as of PRICES_AS_OF, from the
EC2 on-demand pricing page after AWS's price cut of June 2025 ("up to 45 %" for P5, "up to 33 %"
for P4d/P4de). p5.48xlarge: 55.04 (98.32 before); p4de.24xlarge: 27.45, the former 40.97 less
the announced 33 % (this session could not re-read the page: check it before budgeting; other
regions, Savings Plans and capacity blocks differ).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    vcpus: int
    """vCPUs of the instance: what it takes of the account's EC2 vCPU quota (P5 and P4 instance pages)."""
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
    on_demand_usd_per_hour: float
    """On-demand price of one instance, USD per hour (see PRICES_AS_OF)."""
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
}
"""Where the published bus bandwidths of the rows come from."""

PRICES_AS_OF = "2025-06-05"
PRICE_SOURCE = "https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux)"

PROFILES: dict[str, HardwareProfile] = {
    "p4de": HardwareProfile(
        instance_type="p4de.24xlarge",
        gpus=8,
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_memory_gib=80,
        vcpus=96,
        network_cards=4,
        network_gbps=400,
        float8=False,
        nvlink_busbw_gbs=230.0,
        on_demand_usd_per_hour=27.45,
        reservation_only=True,
        published_node_busbw_gbs=230.8,
        published_efa_busbw_gbs=57.2,
    ),
    "p5": HardwareProfile(
        instance_type="p5.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_memory_gib=80,
        vcpus=192,
        network_cards=32,
        network_gbps=3200,
        float8=True,
        nvlink_busbw_gbs=240.0,
        on_demand_usd_per_hour=55.04,
        published_node_busbw_gbs=480.0,
        published_efa_busbw_gbs=125.0,
    ),
}
