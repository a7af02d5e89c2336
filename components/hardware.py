"""The GPU instance profiles fsdp-eks knows, one row each.

Every number here is a fact of the EC2 instance type: the launch template's network interfaces,
the PyTorchJob's GPU and EFA requests, the memory-fit check, the reservation rule and the
scaling report's network all read this table. Adding an instance type (p5e, p5en, p6) is one row.
Sources: EC2 "EFA for accelerated instance types" guide (network cards, EFA interfaces, Gbit/s:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), the P5 and P4 instance pages
(GPUs, GPU memory, how p4de is sold: https://aws.amazon.com/ec2/instance-types/p5/,
https://aws.amazon.com/ec2/instance-types/p4/). The GPU's bf16 peak is the training package's
table (training/hardware.py), which the fine-tune reads too.
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
    network_cards: int
    """Network cards of the instance: one EFA interface per card."""
    network_gbps: int
    """Aggregate EFA bandwidth of the instance in Gbit/s (the scaling report's network)."""
    reservation_only: bool = False
    """Sold only through capacity reservations (an ODCR or a capacity block), never plain
    On-Demand: the stack refuses it without ``gpuNodes.capacityReservationId``."""

    @property
    def efa_interfaces(self) -> int:
        """EFA devices the node exposes as ``vpc.amazonaws.com/efa``: one per network card."""
        return self.network_cards

    @property
    def gpu_peak_bf16_flops(self) -> float | None:
        """Dense bf16 peak of one GPU, FLOP/s (training/hardware.py): the denominator of MFU."""
        return peak_bf16_flops(self.gpu_model)


PROFILES: dict[str, HardwareProfile] = {
    "p4de": HardwareProfile(
        instance_type="p4de.24xlarge",
        gpus=8,
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_memory_gib=80,
        network_cards=4,
        network_gbps=400,
        reservation_only=True,
    ),
    "p5": HardwareProfile(
        instance_type="p5.48xlarge",
        gpus=8,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_memory_gib=80,
        network_cards=32,
        network_gbps=3200,
    ),
}
