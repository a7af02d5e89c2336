"""The README's recipe "add a GPU profile": a row for the GPU in training/hardware.py (when the
table lacks it), a row for the instance type in components/planning/hardware.py and one stack
file are all the program needs. Checked by adding a made-up GPU and a made-up instance type (names
no real profile will take) and running the whole program for a stack file naming them, under
mocks; and a row naming a GPU the table lacks fails where it is written."""

from __future__ import annotations

import pytest
import yaml

from components.planning import hardware
from components.planning.forecast import MFU_MEASURED_ON
from components.stack import preview_line
from offline import stacks
from offline.stacks import DUMMY_SECRETS
from tests.harness import container, job_of, parse, run_program, settings_error
from training import hardware as gpus

GPU = gpus.Gpu(name="ZZ9 Test GPU", memory_gib=64, peak_bf16_flops=500e12, peak_fp8_flops=None,
               nvlink_busbw_gbs=100.0, published_node_busbw_gbs=90.0)
"""A made-up GPU: no float8 units, half an H200's bf16 peak, a slower NVLink."""
PROFILE = "zz9-test"
STACK_FILE = {"config": {
    "aws:region": "us-west-2",
    "fsdp-eks:profile": PROFILE,
    "fsdp-eks:network": {"vpcCidr": "10.9.0.0/16", "availabilityZones": ["us-west-2a", "us-west-2b"]},
    "fsdp-eks:cluster": {"kubernetesVersion": "1.36"},
    # the example AZ that offers a reservation-only type in us-west-2 (offline/mocks.py)
    "fsdp-eks:gpuNodes": {"availabilityZone": "us-west-2b", "minSize": 0, "desiredSize": 2, "maxSize": 2},
    "fsdp-eks:job": {"model": "meta-llama/Llama-2-7b-hf", "nodes": 2, "batchSize": 2, "seqLen": 4096,
                     "sharding": "FULL_SHARD", "activationCheckpointing": "full", "compile": True},
    "fsdp-eks:storage": {"fsx": True, "fsxStorageCapacityGiB": 1200, "fsxThroughputPerTiB": 250},
}}
"""``Pulumi.zz9-test.yaml`` as a user would write it."""


def zz9_row() -> hardware.HardwareProfile:
    """A made-up instance type: 4 of the made-up GPUs, 8 network cards, a small host, sold
    through reservations only."""
    return hardware.HardwareProfile(
        instance_type="zz9.24xlarge", gpus=4, gpu_model=GPU.name, network_cards=8, network_gbps=800,
        vcpus=24, memory_gib=256, usd_per_hour=12.5, price_basis="made up", reservation_only=True)


@pytest.fixture
def zz9(monkeypatch, tmp_path) -> dict:
    """The two rows added and the stack file written: the configuration the offline plan reads."""
    monkeypatch.setitem(gpus.GPUS, GPU.name, GPU)
    monkeypatch.setitem(hardware.PROFILES, PROFILE, zz9_row())
    (tmp_path / f"Pulumi.{PROFILE}.yaml").write_text(yaml.safe_dump(STACK_FILE))
    monkeypatch.setattr(stacks, "ROOT", tmp_path)
    return stacks.stack_config(PROFILE)


def settings_of(config: dict) -> dict:
    """The fsdp-eks keys of a stack's configuration without namespace, the dummy secrets left out."""
    return {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("fsdp-eks:") and k not in DUMMY_SECRETS}


def test_a_gpu_row_an_instance_row_and_a_stack_file_are_all_the_program_needs(zz9: dict):
    recording = run_program(zz9, PROFILE)
    group = recording.one("aws:eks/nodeGroup:NodeGroup", "gpu-gpu").inputs
    assert group["instanceTypes"] == ["zz9.24xlarge"]
    launch = recording.one("aws:ec2/launchTemplate:LaunchTemplate", "gpu-lt").inputs
    assert len(launch["networkInterfaces"]) == 8
    # the offline plan's example reservation, chosen by the row's reservation_only, not its name
    assert launch["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
    requests = container(job_of(recording))["resources"]["requests"]
    # docs/design.md: two thirds of the instance's share per GPU (24 vCPU and 256 GiB over 4 GPUs:
    # 4 vCPU and 42 GiB, under the 8 and 96 caps), times 4 GPUs
    assert requests == {"cpu": "16", "memory": "168Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "8"}


def test_the_forecast_reads_the_new_gpu_and_says_its_mfu_is_assumed(zz9: dict):
    settings = settings_of(zz9)
    line = preview_line(parse(settings))
    assert f"(assumed: the MFU measured on {MFU_MEASURED_ON})" in line
    assert "2 x zz9.24xlarge at $12.50/h made up = $25.00/h" in line
    h200 = preview_line(parse({**settings, "profile": "p5en"}))
    assert "assumed" not in h200

    def per_gpu(text: str) -> float:
        return float(text.split("about ", 1)[1].split(" tokens/s", 1)[0].replace(",", ""))

    # half the H200's peak: about half its tokens per GPU (the NVLink and EFA differ a little)
    assert 0.4 < per_gpu(line) / per_gpu(h200) < 0.55


def test_float8_is_refused_on_the_new_gpu_by_its_row(zz9: dict):
    settings = settings_of(zz9)
    message = str(settings_error({**settings, "job": {**settings["job"], "precision": "fp8"}}))
    assert f"zz9.24xlarge's {GPU.name} has no float8 matrix units" in message


def test_an_instance_row_naming_an_unknown_gpu_fails_where_it_is_written():
    with pytest.raises(ValueError, match=r"zz9.24xlarge: GPU 'ZZ9 Test GPU' has no row .* training/hardware.py"):
        zz9_row()
