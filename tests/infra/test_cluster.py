"""Both stacks, run whole under mocks: the field facts of GPU nodes, EFA and the cluster.

Checked against docs/design.md#gpu-nodes-and-efa (EC2's EFA guide, terraform-aws-eks' EFA launch template,
the AL2023 nodeadm API, eksctl #7949 on placement groups with reservations). Per-stack facts
come from the stack file and the hardware table, so the same tests hold for any new stack.
"""

from __future__ import annotations

import base64
import email
import json
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema

import pytest
import yaml

from components import stack as program
from components import versions
from components.cluster import KubernetesCluster
from components.gpu_nodes import GPU_TOLERATION
from components.planning.hardware import PROFILES
from components.stack import Export
from tests.harness import (
    GPU_TAINT,
    HELM,
    Recording,
    Registration,
    installs_pin,
    parse_flags,
    plain,
    release,
    run_program,
    stack_config,
    tolerates,
    variant,
    variant_config,
)

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def profile_of(stack: str):
    return PROFILES[stack_config(stack)["fsdp-eks:profile"]]


def gpu_settings(stack: str) -> dict:
    return stack_config(stack)["fsdp-eks:gpuNodes"]


def test_one_interface_per_network_card(recording: Recording, stack: str):
    interfaces = recording.one(LT, "gpu-lt").inputs["networkInterfaces"]
    cards = profile_of(stack).network_cards
    assert [int(i["networkCardIndex"]) for i in interfaces] == list(range(cards)), "one interface per card"
    assert int(interfaces[0]["deviceIndex"]) == 0 and interfaces[0]["interfaceType"] == "efa"
    # Every other card as gpuNodes.secondaryInterfaceType says, default efa-only (EFA without an
    # IP: the cards do not use up the subnet's addresses; docs/design.md#gpu-nodes-and-efa).
    secondary = gpu_settings(stack).get("secondaryInterfaceType", "efa-only")
    for i in interfaces[1:]:
        assert int(i["deviceIndex"]) == 1, f"card {i['networkCardIndex']} must sit at device index 1"
        assert i["interfaceType"] == secondary, f"card {i['networkCardIndex']}: {i['interfaceType']}"


def test_every_interface_carries_cluster_and_efa_security_groups(recording: Recording):
    efa_sg = recording.one("aws:ec2/securityGroup:SecurityGroup", "gpu-efa")
    efa_sg_id = f"{efa_sg.name}-id"
    for i in recording.one(LT, "gpu-lt").inputs["networkInterfaces"]:
        groups = set(i["securityGroups"])
        assert {"sg-eks-cluster", efa_sg_id} <= groups, f"card {i['networkCardIndex']} lacks {groups}"


def test_efa_security_group_allows_all_traffic_to_and_from_itself(recording: Recording):
    sg = recording.one("aws:ec2/securityGroup:SecurityGroup", "gpu-efa").inputs
    for direction in ("ingress", "egress"):
        rules = sg[direction]
        # The provider's SecurityGroup docs: with protocol "-1" (all), from_port and to_port
        # must both be 0.
        assert any(r["protocol"] == "-1" and r.get("self") and int(r["fromPort"]) == int(r["toPort"]) == 0
                   for r in rules), f"{direction}: no all-traffic self rule"


def test_no_pod_can_reach_a_nodes_instance_metadata(recording: Recording):
    """Checked against EC2's IMDS hop semantics: with IMDSv2 required and a PUT response hop limit
    of 1, the token never reaches a pod's network namespace, so no pod takes a node role's
    credentials (a hop limit of 2, the AMI's default, would let them). Every node group of the stack
    launches from a template of ours that says so."""
    templates = {f"{r.name}-id": r for r in recording.of_type(LT)}
    for group in recording.of_type(NODE_GROUP):
        assert "launchTemplate" in group.inputs, f"{group.name}: EKS' default template allows 2 hops"
        template = templates[group.inputs["launchTemplate"]["id"]]
        meta = template.inputs["metadataOptions"]
        assert meta["httpTokens"] == "required", f"{template.name}: IMDSv1 allowed"
        assert int(meta["httpPutResponseHopLimit"]) == 1, f"{template.name}: pods reach IMDS"
    assert {g.name for g in recording.of_type(NODE_GROUP)} == {"gpu-gpu", "cluster-system"}


def test_launch_template_has_no_subnet_and_no_image(recording: Recording):
    """The node group supplies the subnet; setting an AMI would need a full NodeConfig."""
    lt = recording.one(LT, "gpu-lt").inputs
    assert "imageId" not in lt
    assert all("subnetId" not in i for i in lt["networkInterfaces"])


def test_nodeconfig_stripes_local_nvme_raid0(recording: Recording):
    message = email.message_from_bytes(base64.b64decode(recording.one(LT, "gpu-lt").inputs["userData"]))
    assert message.is_multipart(), "managed node groups merge MIME multi-part user data only"
    parts = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    assert len(parts) == 1
    node_config = yaml.safe_load(parts[0].get_payload())
    assert node_config["apiVersion"] == "node.eks.aws/v1alpha1" and node_config["kind"] == "NodeConfig"
    assert node_config["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"


def test_gpu_nodes_can_mount_fsx_when_the_job_uses_it(recording: Recording, stack: str):
    """The FSx CSI driver mounts with the host's Lustre client, which the AL2023 AMI lacks."""
    message = email.message_from_bytes(base64.b64decode(recording.one(LT, "gpu-lt").inputs["userData"]))
    scripts = [p.get_payload() for p in message.walk() if p.get_content_type() == "text/x-shellscript"]
    uses_fsx = stack_config(stack).get("fsdp-eks:storage", {}).get("fsx", False)
    assert any("dnf install -y lustre-client" in s for s in scripts) == uses_fsx


def lustre_script(recording: Recording) -> str:
    message = email.message_from_bytes(base64.b64decode(recording.one(LT, "gpu-lt").inputs["userData"]))
    [script] = [p.get_payload() for p in message.walk() if p.get_content_type() == "text/x-shellscript"]
    return script


def run_boot_script(script: str, tmp_path: Path, *, dnf: int, modprobe: int, filesystems: str) -> tuple[int, str]:
    """The user data's script in a sandbox: stub ``dnf`` and ``modprobe`` exiting with the codes
    given, a fake /proc/filesystems, the console and nodeadm's drop-in folder under ``tmp_path``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, code in (("dnf", dnf), ("modprobe", modprobe)):
        (bin_dir / tool).write_text(f"#!/bin/sh\nexit {code}\n")
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "filesystems").write_text(filesystems)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CONSOLE": str(tmp_path / "console"),
           "DROP_IN_DIR": str(tmp_path / "nodeadm.d"), "FILESYSTEMS": str(tmp_path / "filesystems")}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    console = (tmp_path / "console").read_text() if (tmp_path / "console").exists() else ""
    return result.returncode, console


def drop_ins(tmp_path: Path) -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "nodeadm.d").glob("*.yaml"))]


def test_a_node_whose_lustre_module_loads_is_labelled_for_the_job(tmp_path: Path):
    """nodeadm merges /etc/eks/nodeadm.d/ over the user data after cloud-init's scripts and
    appends kubelet flags (awslabs/amazon-eks-ami nodeadm merge.go): the label adds to the node
    group's own. The job's workers require it."""
    rec = variant("p5")
    code, console = run_boot_script(lustre_script(rec), tmp_path, dnf=0, modprobe=0,
                                    filesystems="nodev\tproc\n\tlustre\n")
    assert code == 0 and "Lustre client ready" in console
    [drop_in] = drop_ins(tmp_path)
    assert drop_in["kind"] == "NodeConfig"
    assert drop_in["spec"]["kubelet"]["flags"] == ["--node-labels=fsdp-eks/lustre-client=ready"]
    selector = plain(rec.one("kubernetes:kubeflow.org/v1:PyTorchJob").inputs)[
        "spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"]
    assert selector["fsdp-eks/lustre-client"] == "ready"


@pytest.mark.parametrize(("dnf", "modprobe", "filesystems", "reason"), [
    (1, 0, "\tlustre\n", "dnf install lustre-client failed"),
    (0, 1, "\tlustre\n", "modprobe lustre failed"),
    (0, 0, "nodev\tproc\n", "lustre is not a registered file system"),
])
def test_a_node_without_a_working_lustre_client_says_why_and_gets_no_label(tmp_path, dnf, modprobe, filesystems,
                                                                           reason):
    code, console = run_boot_script(lustre_script(variant("p5")), tmp_path, dnf=dnf, modprobe=modprobe,
                                    filesystems=filesystems)
    assert code != 0 and "Lustre client NOT ready" in console and reason in console
    assert not list((tmp_path / "nodeadm.d").glob("*.yaml")), "no label for a node that cannot mount FSx"


def test_root_volume_is_large_and_encrypted(recording: Recording):
    """Checked against the AL2023 AMI's root device (/dev/xvda: a mapping on another name adds a
    second, unused disk and leaves the root at the AMI's 20 GiB) and EBS gp3: encrypted, deleted
    with the node."""
    (mapping,) = recording.one(LT, "gpu-lt").inputs["blockDeviceMappings"]
    ebs = mapping["ebs"]
    assert mapping["deviceName"] == "/dev/xvda"
    assert int(ebs["volumeSize"]) >= 200 and ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3"
    assert ebs["deleteOnTermination"] == "true"


def test_placement_group_only_without_reservation(recording: Recording, stack: str):
    reserved = gpu_settings(stack).get("capacityReservationId") is not None
    groups = recording.of_type("aws:ec2/placementGroup:PlacementGroup")
    placement = recording.one(LT, "gpu-lt").inputs.get("placement")
    if reserved:
        assert groups == [] and placement is None, "placement group with a reservation: eksctl #7949"
    else:
        assert len(groups) == 1 and groups[0].inputs["strategy"] == "cluster"
        assert placement["groupName"] == groups[0].name


@pytest.mark.parametrize("stack_name", ["p4de", "p5"])
def test_a_named_placement_group_is_launched_into_and_none_of_ours_made(stack_name: str):
    """EC2: a capacity reservation made in a cluster placement group serves only launches into
    that group; so the name goes to the launch template, and no group of ours competes with it."""
    rec = variant(stack_name, gpuNodes={"placementGroupName": "team-cpg"})
    assert rec.one(LT, "gpu-lt").inputs["placement"] == {"groupName": "team-cpg"}
    assert rec.of_type("aws:ec2/placementGroup:PlacementGroup") == []


def test_reservation_is_targeted(recording: Recording, stack: str):
    reservation = gpu_settings(stack).get("capacityReservationId")
    spec = recording.one(LT, "gpu-lt").inputs.get("capacityReservationSpecification")
    if reservation is None:
        assert spec is None
    else:
        assert spec["capacityReservationTarget"]["capacityReservationId"] == reservation


def test_gpu_nodes_sit_in_the_reservation_az_only(recording: Recording, stack: str):
    az = gpu_settings(stack)["availabilityZone"]
    subnets = {f"{r.name}-id": r.inputs for r in recording.of_type("aws:ec2/subnet:Subnet")}
    gpu_group = recording.one(NODE_GROUP, "gpu-gpu").inputs
    assert gpu_group["subnetIds"], "GPU node group without subnets"
    for subnet_id in gpu_group["subnetIds"]:
        assert subnets[subnet_id]["availabilityZone"] == az, f"{subnet_id} is outside {az}"
        assert not subnets[subnet_id].get("mapPublicIpOnLaunch"), "GPU nodes in a public subnet"


def test_gpu_node_group_shape(recording: Recording, stack: str):
    group = recording.one(NODE_GROUP, "gpu-gpu").inputs
    settings = gpu_settings(stack)
    assert group["amiType"] == "AL2023_x86_64_NVIDIA"
    assert group["instanceTypes"] == [profile_of(stack).instance_type]
    # EKS user guide, "Create a managed node group with Capacity Blocks for ML": CAPACITY_BLOCK
    assert group["capacityType"] == ("CAPACITY_BLOCK" if settings.get("capacityBlock") else "ON_DEMAND")
    assert group["labels"]["nvidia.com/gpu"] == "true"
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"} in group["taints"]
    scaling = {k: int(v) for k, v in group["scalingConfig"].items()}
    # A capacity block's group starts at 0 (EKS refuses more before the block starts); the
    # Cluster Autoscaler (on by default) adds nodes once the block is active.
    desired = 0 if settings.get("capacityBlock") else settings["desiredSize"]
    assert scaling == {"minSize": settings["minSize"], "desiredSize": desired, "maxSize": settings["maxSize"]}
    assert group["launchTemplate"]["id"] == "gpu-lt-id"


def test_device_plugins_pinned_and_tolerating_the_gpu_taint(recording: Recording):
    for pin in (versions.NVIDIA_DEVICE_PLUGIN, versions.EFA_DEVICE_PLUGIN):
        plugin = release(recording, pin)
        assert installs_pin(plugin, pin), f"{plugin.name}: {plugin.inputs['chart']} {plugin.inputs['version']}"
        assert tolerates(plugin.inputs["values"]["tolerations"], GPU_TAINT), f"{pin.chart} cannot land on GPU nodes"


def test_efa_plugin_kept_to_the_gpu_instance_type(recording: Recording):
    """On a node without EFA devices the plugin crash-loops; an existing cluster's GPU nodes
    carry the instance type (set by the kubelet) but none of our node group's labels."""
    efa = release(recording, versions.EFA_DEVICE_PLUGIN)
    group = recording.one(NODE_GROUP, "gpu-gpu").inputs
    system = recording.one(NODE_GROUP, "cluster-system").inputs
    selector = efa.inputs["values"]["nodeSelector"]
    assert selector == {"node.kubernetes.io/instance-type": group["instanceTypes"][0]}, selector
    assert selector["node.kubernetes.io/instance-type"] not in system["instanceTypes"], "EFA plugin on CPU nodes"


def test_efa_plugin_image_is_current_and_from_the_stack_region(recording: Recording, stack: str):
    """The chart's default (plugin v0.5.10 from us-west-2) is replaced by the pinned plugin from
    the registry of the stack's region (account table of the EKS user guide)."""
    image = release(recording, versions.EFA_DEVICE_PLUGIN).inputs["values"]["image"]
    region = stack_config(stack)["aws:region"]
    assert image["repository"] == f"602401143452.dkr.ecr.{region}.amazonaws.com/eks/aws-efa-k8s-device-plugin"
    assert image["tag"] == versions.EFA_DEVICE_PLUGIN_IMAGE_TAG != "v0.5.10"


def test_eks_image_registry_of_a_region_with_its_own_account():
    assert versions.eks_image_registry("af-south-1") == "877085696533.dkr.ecr.af-south-1.amazonaws.com"
    with pytest.raises(ValueError, match="EKS_IMAGE_REGISTRY_ACCOUNTS"):
        versions.eks_image_registry("xx-nowhere-1")


def test_cluster_is_pinned_api_authenticated_without_default_nodes(recording: Recording, stack: str):
    cluster = recording.one("eks:index:Cluster").inputs
    version = stack_config(stack)["fsdp-eks:cluster"]["kubernetesVersion"]
    addons = versions.EKS_ADDONS[version]
    assert cluster["version"] == version
    assert cluster["authenticationMode"] == "API"
    assert cluster["skipDefaultNodeGroup"] is True
    assert cluster["vpcCniOptions"]["addonVersion"] == addons["vpc-cni"]
    assert cluster["corednsAddonOptions"]["enabled"] is False, "pulumi-eks would create CoreDNS before any node"
    assert cluster["kubeProxyAddonOptions"]["version"] == addons["kube-proxy"]
    pod_identity = recording.one("aws:eks/addon:Addon", "cluster-pod-identity-agent").inputs
    assert pod_identity["addonVersion"] == addons["eks-pod-identity-agent"]
    assert recording.one("aws:eks/addon:Addon", "cluster-coredns").inputs["addonVersion"] == addons["coredns"]


def test_vpc_cni_new_enough_for_efa_only_interfaces():
    for version, addons in versions.EKS_ADDONS.items():
        major_minor_patch = tuple(int(x) for x in addons["vpc-cni"].lstrip("v").split("-")[0].split("."))
        assert major_minor_patch >= (1, 18, 4), f"Kubernetes {version}: vpc-cni {addons['vpc-cni']}"


def test_system_node_group_is_small_and_untainted(recording: Recording):
    system = recording.one(NODE_GROUP, "cluster-system").inputs
    assert system["amiType"] == "AL2023_x86_64_STANDARD"
    assert not system.get("taints")


def test_every_in_cluster_object_uses_the_cluster_provider(recording: Recording):
    in_cluster = [r for r in recording.resources if r.type.startswith("kubernetes:") and r.type != "pulumi:providers:kubernetes"]
    assert in_cluster
    for r in in_cluster:
        assert r.provider and "pulumi:providers:kubernetes::cluster-k8s" in r.provider, f"{r.type} {r.name}"


def test_outputs(recording: Recording, stack: str):
    exports = recording.exports
    assert exports[Export.CLUSTER_NAME] == f"fsdp-eks-{stack}"
    assert Export.KUBECONFIG in recording.secret_exports
    assert exports[Export.GPU_NODE_GROUP]
    command = exports[Export.GPU_NODES_COMMAND]
    assert profile_of(stack).instance_type in command
    assert "nvidia\\.com/gpu" in command and "vpc\\.amazonaws\\.com/efa" in command


def test_node_groups_boot_the_pinned_ami_release(recording: Recording, stack: str):
    """awslabs/amazon-eks-ami release notes: an AL2023 release version is
    ``<kubelet version>-<build date>``, one for the standard and the NVIDIA AMI; without it a
    node group takes the newest AMI (driver, kernel, EFA module) at every launch."""
    version = stack_config(stack)["fsdp-eks:cluster"]["kubernetesVersion"]
    for name in ("gpu-gpu", "cluster-system"):
        release_version = recording.named(name).inputs.get("releaseVersion")
        assert release_version == versions.EKS_AMI_RELEASES[version], name
    assert set(versions.EKS_AMI_RELEASES) == set(versions.SUPPORTED_KUBERNETES_VERSIONS)
    for k8s, release_version in versions.EKS_AMI_RELEASES.items():
        assert re.fullmatch(rf"{re.escape(k8s)}\.\d+-20\d{{6}}", release_version), (k8s, release_version)


def test_scale_to_zero_command_names_the_gpu_node_group_of_this_stack(recording: Recording, stack: str):
    """The command (AWS CLI ``eks update-nodegroup-config``) must hit this stack's GPU group, in
    its cluster and region, and leave it at zero nodes."""
    argv = shlex.split(recording.exports[Export.GPU_SCALE_TO_ZERO_COMMAND])
    assert argv[:3] == ["aws", "eks", "update-nodegroup-config"]
    flags = parse_flags(argv)
    group = recording.named("gpu-gpu")
    assert flags["--cluster-name"] == group.inputs["clusterName"] == recording.exports[Export.CLUSTER_NAME]
    assert flags["--nodegroup-name"] == recording.exports[Export.GPU_NODE_GROUP]
    assert flags["--region"] == stack_config(stack)["aws:region"]
    sizes = dict(part.split("=") for part in flags["--scaling-config"].split(","))
    assert sizes["desiredSize"] == sizes["minSize"] == "0"
    assert int(sizes["maxSize"]) == int(group.inputs["scalingConfig"]["maxSize"])


def test_network_spans_two_azs_with_tagged_subnets(recording: Recording, stack: str):
    azs = stack_config(stack)["fsdp-eks:network"]["availabilityZones"]
    subnets = recording.of_type("aws:ec2/subnet:Subnet")
    cluster_tag = f"kubernetes.io/cluster/fsdp-eks-{stack}"
    public = [s.inputs for s in subnets if s.inputs["tags"].get("kubernetes.io/role/elb") == "1"]
    private = [s.inputs for s in subnets if s.inputs["tags"].get("kubernetes.io/role/internal-elb") == "1"]
    assert {s["availabilityZone"] for s in public} == set(azs) == {s["availabilityZone"] for s in private}
    assert all(cluster_tag in s["tags"] for s in public + private)
    assert len(recording.of_type("aws:ec2/natGateway:NatGateway")) == len(azs)


# --- variants of a stack: config in, facts out --------------------------------------------


def test_capacity_block():
    rec = variant("p5", gpuNodes={"capacityReservationId": "cr-0abc1234def567890", "capacityBlock": True})
    lt = rec.one(LT, "gpu-lt").inputs
    assert lt["instanceMarketOptions"]["marketType"] == "capacity-block"
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] == (
        "cr-0abc1234def567890")
    assert rec.one(NODE_GROUP, "gpu-gpu").inputs["capacityType"] == "CAPACITY_BLOCK"
    assert rec.of_type("aws:ec2/placementGroup:PlacementGroup") == []


def test_secondary_interfaces_plain_efa_when_asked():
    rec = variant("p5", gpuNodes={"secondaryInterfaceType": "efa"})
    assert {i["interfaceType"] for i in rec.one(LT, "gpu-lt").inputs["networkInterfaces"]} == {"efa"}


def test_existing_vpc_creates_no_network():
    vpc, a, b, c = "vpc-0123456789abcdef0", "subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb", "subnet-0ccccccc"
    rec = variant("p5", network={"existingVpcId": vpc, "existingPrivateSubnetIds": [a, b],
                                 "existingPublicSubnetIds": [c], "existingGpuSubnetIds": [b]})
    assert rec.of_type("aws:ec2/vpc:Vpc") == [] and rec.of_type("aws:ec2/subnet:Subnet") == []
    assert rec.one("eks:index:Cluster").inputs["vpcId"] == vpc
    assert rec.one(NODE_GROUP, "gpu-gpu").inputs["subnetIds"] == [b]


def test_existing_cluster_deploys_only_in_cluster_layers():
    # Its nodes share checkpoints through a claim the user brings (storage.fsx needs a cluster of ours).
    rec = variant("p5", cluster={"existingClusterName": "research"},
                  storage={"fsx": False, "existingClaimName": "checkpoints"})
    for absent in ("eks:index:Cluster", NODE_GROUP, "aws:ec2/vpc:Vpc", LT):
        assert rec.of_type(absent) == [], f"{absent} created for an existing cluster"
    assert len(rec.of_type(HELM)) >= 2
    for r in rec.resources:
        if r.type.startswith("kubernetes:"):
            assert "pulumi:providers:kubernetes::cluster-k8s" in r.provider
    assert rec.exports[Export.CLUSTER_NAME] == "research" and Export.KUBECONFIG in rec.secret_exports


def test_a_new_and_an_existing_cluster_are_one_protocol(monkeypatch):
    """The in-cluster layers get a ``KubernetesCluster`` either way: the cluster the stack
    creates and the one it attaches to both carry every attribute of the protocol."""
    given = []
    deploy = program._training
    monkeypatch.setattr(program, "_training", lambda settings, cluster, **kw: (given.append(cluster),
                                                                               deploy(settings, cluster, **kw))[1])
    run_program(variant_config("p5"), "p5-new")
    run_program(variant_config("p5", cluster={"existingClusterName": "research"},
                               storage={"fsx": False, "existingClaimName": "checkpoints"}), "p5-existing")
    assert [type(c).__name__ for c in given] == ["EksCluster", "ExistingCluster"]
    assert all(isinstance(c, KubernetesCluster) for c in given)


def test_existing_cluster_kubeconfig_authenticates_with_aws_eks_get_token():
    """Checked against kubectl's kubeconfig format and client-go's exec credential plugin
    (``client.authentication.k8s.io/v1beta1``, the apiVersion `aws eks update-kubeconfig`
    writes): the kubeconfig the stack exports and gives its Kubernetes provider reaches the
    looked-up cluster's endpoint with its CA, and gets a token from `aws eks get-token` for that
    cluster in the stack's region (no token is stored in the state)."""
    rec = variant("p5", cluster={"existingClusterName": "research"},
                  storage={"fsx": False, "existingClaimName": "checkpoints"})
    exported = rec.exports[Export.KUBECONFIG]
    config = json.loads(exported)
    assert Export.KUBECONFIG in rec.secret_exports
    assert config["apiVersion"] == "v1" and config["kind"] == "Config"
    (context,) = config["contexts"]
    assert config["current-context"] == context["name"]
    (cluster,) = [c["cluster"] for c in config["clusters"] if c["name"] == context["context"]["cluster"]]
    # The mocks' getCluster answer for "research" (offline/mocks.py).
    assert cluster == {"server": "https://EXAMPLE.gr7.eks.amazonaws.com", "certificate-authority-data": "Q0VSVA=="}
    (user,) = [u["user"] for u in config["users"] if u["name"] == context["context"]["user"]]
    exec_ = user["exec"]
    assert exec_["apiVersion"] == "client.authentication.k8s.io/v1beta1" and exec_["command"] == "aws"
    region = stack_config("p5")["aws:region"]
    assert parse_flags(exec_["args"]) == {"--cluster-name": "research", "--region": region, "--output": "json"}
    assert exec_["args"][:2] == ["eks", "get-token"]
    provider = rec.one("pulumi:providers:kubernetes", "cluster-k8s").inputs
    assert json.loads(plain(provider["kubeconfig"])) == config


ADDON = "aws:eks/addon:Addon"


def test_gpu_nodes_are_not_auto_repaired_unless_asked(recording: Recording):
    """Checked against the agent's sticky DCGM condition (aws/eks-node-monitoring-agent #266, fix
    #275 unreleased): a repair would terminate healthy GPU nodes, so it is opt-in; the system
    node group is left as EKS has it."""
    gpu, system = (recording.named(n) for n in ("gpu-gpu", "cluster-system"))
    assert gpu.inputs["nodeRepairConfig"] == {"enabled": False}, gpu.inputs.get("nodeRepairConfig")
    assert "nodeRepairConfig" not in system.inputs


def test_auto_repair_can_be_turned_on():
    rec = variant("p5", gpuNodes={"autoRepair": True})
    assert rec.named("gpu-gpu").inputs["nodeRepairConfig"] == {"enabled": True}


SCHEMAS = Path(__file__).resolve().parents[1] / "fixtures" / "eks_addons"


def recorded_schema(pin: str) -> Path:
    """The recorded configuration schema for an agent pin: the newest release of the same minor
    at or below it (schemas only gain keys within a minor; tests/fixtures/eks_addons/README.md)."""
    release = tuple(int(n) for n in re.findall(r"\d+", pin.split("-eksbuild")[0]))
    candidates = []
    for path in SCHEMAS.glob("eks-node-monitoring-agent-v*.configuration.schema.json"):
        version = tuple(int(n) for n in re.findall(r"\d+", path.name.split("-agent-")[1].split(".configuration")[0]))
        if version[:2] == release[:2] and version <= release:
            candidates.append((version, path))
    assert candidates, f"no recorded configuration schema for the pinned {pin}"
    return max(candidates)[1]


def agent(recording: Recording) -> Registration:
    return next(a for a in recording.of_type(ADDON) if a.inputs["addonName"] == "eks-node-monitoring-agent")


def test_node_monitoring_agent_runs_its_dcgm_host_engine_on_the_gpu_nodes(recording: Recording, stack: str):
    """Checked against the agent's chart at v1.6.2 (``dcgmAgent.tolerations: []`` by default, so
    its dcgm-server never lands on a tainted GPU node and the agent reports
    AcceleratedHardwareReady=False: aws/containers-roadmap #2555, #2567) and against the add-on's
    configuration schema of the pinned version (tests/fixtures/eks_addons): what EKS accepts."""
    registration = agent(recording)
    configuration = json.loads(registration.inputs["configurationValues"])
    jsonschema.validate(configuration, json.loads(recorded_schema(registration.inputs["addonVersion"]).read_text()))
    assert tolerates(configuration["dcgmAgent"]["tolerations"], GPU_TAINT)


def test_every_agent_pin_with_a_recorded_schema_accepts_the_configuration():
    """Every supported Kubernetes version's pin, not only the stacks': the v1.4 builds of 1.33
    and 1.34 predate the published schema and are the only ones unchecked (versions.py says so)."""
    configuration = versions.node_monitoring_agent_configuration([dict(GPU_TOLERATION)])
    unchecked = []
    for k8s, pins in versions.EKS_ADDONS.items():
        pin = pins["eks-node-monitoring-agent"]
        try:
            schema = recorded_schema(pin)
        except AssertionError:
            unchecked.append(k8s)
            continue
        jsonschema.validate(configuration, json.loads(schema.read_text()))
    assert unchecked == ["1.33", "1.34"]


def test_the_recorded_schema_refuses_what_the_pinned_agent_does_not_know():
    """The schema check above can fail: v1.6.2's dcgmAgent has no nodeSelector (v1.7.0 added it)."""
    schema = json.loads((SCHEMAS / "eks-node-monitoring-agent-v1.6.2.configuration.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError, match="nodeSelector"):
        jsonschema.validate({"dcgmAgent": {"nodeSelector": {"a": "b"}}}, schema)


def test_node_monitoring_agent_is_pinned_and_runs_after_the_node_groups_exist(recording: Recording, stack: str):
    """Checked against the EKS add-on rule (an add-on that runs pods turns ACTIVE only once
    nodes can run them) and the versions table: the node monitoring agent, which feeds auto
    repair, is pinned for the stack's Kubernetes version and waits for the system node group.
    The GPU nodes need not wait for it: its DaemonSet lands on each node as it joins."""
    version = stack_config(stack).get("fsdp-eks:cluster", {}).get("kubernetesVersion",
                                                                   versions.DEFAULT_KUBERNETES_VERSION)
    assert agent(recording).inputs["addonVersion"] == versions.EKS_ADDONS[version]["eks-node-monitoring-agent"]
    assert "cluster-system" in agent(recording).dependencies


def test_every_supported_kubernetes_version_pins_the_node_monitoring_agent():
    """A version added to the table without the agent would fail at `pulumi up`, not preview."""
    missing = [v for v, pins in versions.EKS_ADDONS.items() if "eks-node-monitoring-agent" not in pins]
    assert not missing, f"EKS_ADDONS lacks eks-node-monitoring-agent for {missing}"
