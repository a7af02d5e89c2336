"""Dense bf16 peak of the GPUs fsdp-eks may run on, one row each: the denominator of MFU for the
fine-tune and the bench (matched against torch's device name) and for the instance profiles of
components/planning/hardware.py (which name their GPU as torch reports it). Import-light (no torch).

Vendor datasheets, dense (no sparsity) bf16 tensor-core peak: NVIDIA H100 (SXM 989.5 TFLOP/s,
PCIe 756), H200 (the H100 SXM's 989.5), H20 (148), A100 (312), A10G (125), L40S (362), L4 (121).
Power-capped cards reach less: the 2 x H200 of docs/performance.md sustain about 660 TFLOP/s
on a bf16 matmul, bursts near 790.
"""

from __future__ import annotations

PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100", 989.5e12),  # SXM
    ("H200", 989.5e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A10G", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)
"""Dense bf16 peak FLOP/s, by a substring of the device name (first match wins: "H100 PCIe"
before "H100", "H200" before "H20")."""


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``device_name``; None if the table lacks it."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None
