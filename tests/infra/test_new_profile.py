"""The README's recipe "add a GPU profile": one row in components/planning/hardware.py and one stack file
are all the program needs. Checked by adding a made-up row (an instance type no table knows)
and running the whole program for it under mocks, as a stack file naming it would."""

from __future__ import annotations

import dataclasses

from offline.stacks import with_examples
from components.planning import hardware
from tests.harness import container, job_of, run_program, variant_config

NEW = dataclasses.replace(hardware.PROFILES["p5en"], instance_type="p9.48xlarge", gpus=4, network_cards=8,
                          vcpus=24, memory_gib=256, reservation_only=True)
"""A made-up row: 4 GPUs, 8 network cards, a small host, sold through reservations only."""


def test_a_new_row_is_all_the_program_needs(monkeypatch):
    monkeypatch.setitem(hardware.PROFILES, "p9", NEW)
    # the example AZ that offers a reservation-only type in us-west-2 (offline/mocks.py)
    config = variant_config("p5", profile="p9", gpuNodes={"availabilityZone": "us-west-2b"})
    recording = run_program(with_examples(config), "p9")
    group = recording.one("aws:eks/nodeGroup:NodeGroup", "gpu-gpu").inputs
    assert group["instanceTypes"] == ["p9.48xlarge"]
    launch = recording.one("aws:ec2/launchTemplate:LaunchTemplate", "gpu-lt").inputs
    assert len(launch["networkInterfaces"]) == 8
    # the offline plan's example reservation, chosen by the row's reservation_only, not its name
    assert launch["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
    requests = container(job_of(recording))["resources"]["requests"]
    # docs/design.md: two thirds of the instance's share per GPU (24 vCPU and 256 GiB over 4 GPUs:
    # 4 vCPU and 42 GiB, under the 8 and 96 caps), times 4 GPUs
    assert requests == {"cpu": "16", "memory": "168Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "8"}
