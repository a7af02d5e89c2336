"""Field facts the stack relies on, each checked on what the program creates for every stack
file, each test naming where the fact comes from (docs/design.md has them with their sources).

The expected values are written here as the sources state them, not read from the component's
own constants: a changed constant must fail a test.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from components.planning.hardware import PROFILES
from tests.harness import (Recording, container, job_of, plain, run_program, stack_config,
                           variant_config, worker)
from training.hardware import peak_bf16_flops

DATASHEET_BF16_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.5, "NVIDIA H100 PCIe": 756, "NVIDIA H200": 989.5, "NVIDIA H20": 148,
    "NVIDIA A100-SXM4-80GB": 312, "NVIDIA A10G": 125, "NVIDIA L40S": 362, "NVIDIA L4": 121,
}
"""NVIDIA's datasheets: dense bf16 tensor TFLOP/s, by the name torch.cuda.get_device_name reports."""
NODE_ROLE_NEEDS = {
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",  # the kubelet joins and reads the cluster
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",  # the VPC CNI gives pods their IPs
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",  # the nodes pull from ECR
}
"""EKS user guide, "Amazon EKS node IAM role": the managed policies every node role needs."""

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(text: str) -> int:
    """A Kubernetes binary quantity (``64Gi``) in bytes."""
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", text).groups()
    return int(number) * _UNITS.get(unit, 1)


def by_id(recording: Recording, type_: str) -> dict:
    """Resources of a type by the id the mocks give them (``<name>-id``)."""
    return {f"{r.name}-id": r for r in recording.of_type(type_)}


def test_the_node_role_has_the_policies_nodes_need(recording: Recording):
    """Checked against the EKS user guide's node IAM role: without the CNI policy pods get no IP,
    without ECR read-only the training image is never pulled."""
    attachments = recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    ng = recording.one("aws:eks/nodeGroup:NodeGroup", "gpu-gpu").inputs
    role = ng["nodeRoleArn"].rsplit(":", 1)[1]
    attached = {a.inputs["policyArn"] for a in attachments if a.inputs["role"] == role}
    assert NODE_ROLE_NEEDS <= attached, f"{role} lacks {NODE_ROLE_NEEDS - attached}"


def test_public_subnets_route_to_the_internet_and_private_ones_to_a_nat_in_their_az(recording: Recording):
    """Checked against the EKS user guide's VPC requirements: nodes in private subnets reach
    ECR, the EKS API and the hub through a NAT gateway; one per AZ, in that AZ's public subnet,
    so an AZ outage does not cut the others off."""
    subnets = by_id(recording, "aws:ec2/subnet:Subnet")
    tables = by_id(recording, "aws:ec2/routeTable:RouteTable")
    nats = by_id(recording, "aws:ec2/natGateway:NatGateway")
    igws = by_id(recording, "aws:ec2/internetGateway:InternetGateway")
    assoc = {a.inputs["subnetId"]: a.inputs["routeTableId"]
             for a in recording.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")}
    assert subnets
    for sid, subnet in subnets.items():
        tags, az = subnet.inputs["tags"], subnet.inputs["availabilityZone"]
        (default,) = [r for r in tables[assoc[sid]].inputs["routes"] if r["cidrBlock"] == "0.0.0.0/0"]
        if tags.get("kubernetes.io/role/elb") == "1":
            assert default.get("gatewayId") in igws, f"{subnet.name}: default route {default}"
        else:
            nat = nats[default["natGatewayId"]]
            assert subnets[nat.inputs["subnetId"]].inputs["availabilityZone"] == az, subnet.name
            assert subnets[nat.inputs["subnetId"]].inputs["tags"].get("kubernetes.io/role/elb") == "1"


def test_the_api_endpoint_is_private_and_public(recording: Recording):
    """Checked against the EKS user guide's "Cluster API server endpoint": the private endpoint
    lets nodes reach the API inside the VPC; the public one, limited to publicAccessCidrs, is how
    a user's kubectl gets there."""
    cluster = recording.one("eks:index:Cluster").inputs
    assert cluster["endpointPrivateAccess"] is True and cluster["endpointPublicAccess"] is True


def test_gpu_nodes_roll_one_at_a_time(recording: Recording):
    """Checked against docs/design.md#gpu-nodes-and-efa: a reservation has no spare node to surge
    into and each replaced node costs training time, so updates take one node at a time."""
    ng = plain(recording.one("aws:eks/nodeGroup:NodeGroup", "gpu-gpu").inputs)
    assert ng["updateConfig"] == {"maxUnavailable": 1}


def test_the_pod_requests_fit_the_node(recording: Recording, stack: str):
    """Checked against the instance types' vCPUs and memory (EC2 instance type pages, the row's
    ``vcpus`` and ``memory_gib``): one pod per node, its CPU and memory requests within 90 % of
    the instance (the rest: kubelet reservation, DaemonSets), else it never schedules."""
    profile = PROFILES[stack_config(stack)["fsdp-eks:profile"]]
    vcpus, memory_gib = profile.vcpus, profile.memory_gib
    requests = container(job_of(recording))["resources"]["requests"]
    # at least one core per rank (one process per GPU), within the instance
    assert int(requests["nvidia.com/gpu"]) <= float(requests["cpu"]) <= 0.9 * vcpus, requests
    assert 0 < quantity_bytes(requests["memory"]) <= 0.9 * memory_gib * 2**30, requests


def test_dev_shm_is_large_and_within_the_pods_memory(recording: Recording):
    """Checked against NCCL's troubleshooting guide (the container runtime's 64 MB /dev/shm is
    too small for NCCL's shared-memory transport and DataLoader workers) and Kubernetes' emptyDir
    docs (a memory-backed volume counts against the pod's memory): at least 1 GiB, at most the
    pod's memory request."""
    job = job_of(recording)
    shm_mounts = [m["name"] for m in container(job)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in worker(job)["template"]["spec"]["volumes"] if v["name"] in shm_mounts]
    size = quantity_bytes(volume["emptyDir"]["sizeLimit"])
    assert volume["emptyDir"]["medium"] == "Memory"
    assert 2**30 <= size <= quantity_bytes(container(job)["resources"]["requests"]["memory"])


def test_finished_jobs_free_their_gpus_and_keep_their_logs(recording: Recording):
    """Checked against the Training Operator's CleanPodPolicy: ``Running`` deletes the pods still
    running when the job ends (their GPUs go back) and keeps finished pods for their logs;
    ``All`` would lose the logs, ``None`` would hold GPUs."""
    assert job_of(recording)["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


def test_etcd_never_runs_two_members(recording: Recording):
    """Checked against the Deployment docs' ``Recreate`` strategy (every old pod is killed before
    a new one is created): the single-member etcd never has a second member with its own state,
    which would split the rendezvous."""
    (etcd,) = [r for r in recording.of_type("kubernetes:apps/v1:Deployment") if "etcd" in r.name]
    spec = plain(etcd.inputs)["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(("device", "tflops"), DATASHEET_BF16_TFLOPS.items())
def test_the_bf16_peak_of_each_gpu_as_torch_names_it(device: str, tflops: float):
    """Checked against NVIDIA's datasheets (dense bf16 tensor TFLOP/s), looked up by the names
    torch.cuda.get_device_name reports: the H200 is not the H20, the H100 PCIe not the SXM."""
    assert peak_bf16_flops(device) == pytest.approx(tflops * 1e12)


def test_each_profile_names_a_gpu_with_a_known_peak():
    """Checked against the instance pages (p5: H100 SXM, p4de: A100, p5e and p5en: H200) and the
    datasheets: every row names its GPU as torch does, so its MFU has the datasheet's peak."""
    for name, p in PROFILES.items():
        assert p.gpu_model in DATASHEET_BF16_TFLOPS, f"{name}: {p.gpu_model} is not a name torch reports"
        assert p.gpu.peak_bf16_flops == pytest.approx(DATASHEET_BF16_TFLOPS[p.gpu_model] * 1e12), name
    assert peak_bf16_flops("cpu") is None


def design_bullet(instance_type: str) -> str:
    """docs/design.md's bullet of an instance row, its lines joined."""
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = design.split("## GPU nodes and EFA", 1)[1].split("\n## ", 1)[0]
    (bullet,) = [b for b in section.split("\n- ") if b.startswith(f"{instance_type}: ")]
    return " ".join(bullet.split())


@pytest.mark.parametrize("name", PROFILES)
def test_design_md_states_each_row_with_its_sources(name: str):
    """docs/design.md is the one home of the rows' sources: its bullet for each row gives the
    row's numbers, so a changed row without its source (or a source without its row) fails."""
    p = PROFILES[name]
    bullet = design_bullet(p.instance_type)
    for fact in (f"{p.gpus} x ", f"{p.network_cards} network cards", f"{p.efa_interfaces} EFA",
                 f"{p.network_gbps} Gbit/s", f"{p.vcpus} vCPU", f"{p.memory_gib} GiB", f"{p.usd_per_hour:g} USD an hour"):
        assert fact in bullet, f"{name}: docs/design.md's bullet lacks {fact!r}"
    assert ("reservation" in bullet or "Capacity Block" in bullet) == p.reservation_only, name


def test_the_node_role_is_assumable_by_ec2(recording: Recording):
    """Checked against the EKS user guide's node IAM role trust policy: the instances assume the
    role through the EC2 service principal, else no node gets credentials and none joins."""
    ng = recording.one("aws:eks/nodeGroup:NodeGroup", "gpu-gpu").inputs
    (role,) = [r for r in recording.of_type("aws:iam/role:Role") if ng["nodeRoleArn"].endswith(f":{r.name}")]
    policy = json.loads(role.inputs["assumeRolePolicy"])
    assert policy["Version"] == "2012-10-17"
    assert {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"} in (
        policy["Statement"])


def test_the_control_plane_spans_the_networks_subnets_and_nodes_get_no_public_ip(recording: Recording):
    """Checked against the EKS user guide's VPC requirements: the control plane's interfaces go
    in the private subnets (load balancers in the public ones), every AZ of the network; nodes
    stay private (no public IP), reaching out through the NAT gateways."""
    cluster = recording.one("eks:index:Cluster").inputs
    subnets = {f"{s.name}-id": s.inputs for s in recording.of_type("aws:ec2/subnet:Subnet")}
    private = {i for i, s in subnets.items() if s["tags"].get("kubernetes.io/role/internal-elb") == "1"}
    public = {i for i, s in subnets.items() if s["tags"].get("kubernetes.io/role/elb") == "1"}
    assert set(cluster["privateSubnetIds"]) == private and set(cluster["publicSubnetIds"]) == public
    assert cluster["vpcId"] == "network-vpc-id"
    assert cluster["nodeAssociatePublicIpAddress"] is False


S3_GATEWAY_SERVICE = "com.amazonaws.{region}.s3"
"""The S3 service name of a VPC endpoint in the stack's region (AWS PrivateLink guide, "Gateway
endpoints for Amazon S3"; pulumi_aws ``ec2.VpcEndpoint.service_name``: ``com.amazonaws.<region>.
<service>``). A gateway endpoint adds S3's prefix-list route to the route tables it lists
(pulumi_aws ``route_table_ids``: "Applicable for endpoints of type Gateway";
``vpc_endpoint_type`` "Defaults to Gateway"), so traffic to S3 from their subnets skips the NAT
gateway and its per-GB processing charge; gateway endpoints themselves cost nothing (AWS
Prescriptive Guidance, startup security baseline WKLD.12)."""


def test_nodes_and_fsx_reach_s3_through_a_gateway_endpoint_not_the_nat(recording: Recording,
                                                                        stack: str):
    """Checked against AWS's gateway endpoints for S3 (S3_GATEWAY_SERVICE): every subnet that
    holds nodes (image layers from ECR are served from S3) or the FSx file system (its data
    repository traffic) routes through a route table that an S3 gateway endpoint of the stack's
    region lists, in the same VPC (without it, that traffic is billed per GB at the NAT)."""
    region = stack_config(stack)["aws:region"]
    routes = {a.inputs["subnetId"]: a.inputs["routeTableId"]
              for a in recording.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")}
    vpc = {s.inputs["vpcId"] for s in recording.of_type("aws:ec2/subnet:Subnet")}
    served = {table for e in recording.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
              if e.inputs.get("serviceName") == S3_GATEWAY_SERVICE.format(region=region)
              and e.inputs.get("vpcEndpointType", "Gateway") == "Gateway"
              and e.inputs.get("vpcId") in vpc
              for table in e.inputs.get("routeTableIds") or []}
    holders = [*recording.of_type("aws:eks/nodeGroup:NodeGroup"),
               *recording.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")]
    subnets = {(h.name, subnet) for h in holders for subnet in
               ([h.inputs["subnetIds"]] if isinstance(h.inputs["subnetIds"], str)
                else h.inputs["subnetIds"])}
    assert {"gpu-gpu", "storage-fsx"} <= {name for name, _ in subnets}, subnets
    missing = sorted((name, subnet) for name, subnet in subnets if routes.get(subnet) not in served)
    assert not missing, f"these subnets reach S3 only through the NAT gateway: {missing}"


EKS_DEFAULT_PUBLIC_CIDRS = ["0.0.0.0/0"]
"""Who may reach a public API endpoint when publicAccessCidrs is not given or empty: the EKS
API's VpcConfigRequest.publicAccessCidrs, "The default value is 0.0.0.0/0"; pulumi_aws
``eks.ClusterVpcConfigArgs.public_access_cidrs``, "EKS defaults this to a list with 0.0.0.0/0"."""


def public_endpoint_open_to(cluster: dict) -> list[str]:
    """The CIDRs that reach the Kubernetes API from outside the VPC for these ``eks.Cluster``
    inputs, by the providers' documented defaults: pulumi_eks ``Cluster.endpoint_public_access``
    "Default is `true`", and EKS_DEFAULT_PUBLIC_CIDRS."""
    if cluster.get("endpointPublicAccess", True) is False:
        return []
    return list(cluster.get("publicAccessCidrs") or EKS_DEFAULT_PUBLIC_CIDRS)


@pytest.mark.parametrize("cluster, open_to", [
    ({}, None),
    ({"publicAccessCidrs": ["203.0.113.0/24", "198.51.100.7/32"]},
     ["203.0.113.0/24", "198.51.100.7/32"]),
    ({"endpointPublicAccess": False}, []),
], ids=["stack-file", "own-cidrs", "private-only"])
def test_the_api_endpoint_is_open_to_what_the_stack_says_and_preview_warns_when_it_is_all(
        cluster: dict, open_to: list[str] | None, caplog):
    """Checked against the providers' defaults (public_endpoint_open_to): the cluster's public
    endpoint is open to exactly the CIDRs cluster.publicAccessCidrs lists, or to none with
    cluster.endpointPublicAccess false; and the preview warns naming cluster.publicAccessCidrs
    exactly when what the cluster gets is open to the whole internet (0.0.0.0/0), whatever the
    stack file says."""
    caplog.set_level(logging.WARNING)
    recording = run_program(variant_config("p5", cluster=cluster), "p5-endpoint")
    reached = public_endpoint_open_to(recording.one("eks:index:Cluster").inputs)
    if open_to is not None:
        assert reached == open_to
    warned = any("cluster.publicAccessCidrs" in r.getMessage() for r in caplog.records)
    assert warned == ("0.0.0.0/0" in reached), (reached, [r.getMessage() for r in caplog.records])
