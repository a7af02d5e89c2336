"""The GPU managed node group, built from our own launch template.

pulumi-eks' ``ManagedNodeGroup(enable_efa_support=...)`` cannot target a capacity reservation,
rejects a custom launch template together with EFA and always adds a placement group; so the
launch template, the EFA security group and the placement group are built here, explicitly.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import yaml

from components import versions
from components.cluster_autoscaler import DISCOVERY_TAG, TEMPLATE_PREFIX, node_template_tags
from components.node_metadata import metadata_options
from components.planning.hardware import HardwareProfile
from components.settings import GpuNodeSettings

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
"""Keeps everything but GPU workloads (and the daemons that tolerate it) off the GPU nodes."""
GPU_LABELS = {"nvidia.com/gpu": "true", "vpc.amazonaws.com/efa.present": "true"}
"""Labels of the node group this stack creates. The device plugins and DCGM exporter do not
select on them: they require the instance type (``gpu_node_placement``), which an existing
cluster's GPU nodes carry too."""
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
"""The label by which the Cluster Autoscaler's AWS provider knows a GPU node (``GPULabel`` in
``cloudprovider/aws/aws_cloud_provider.go``): on a joined node whose device plugin has not yet
advertised its GPUs, it waits instead of adding another node for the same pending pods (the
provider's README, "Special note on GPU instances")."""


def accelerator_name(profile: HardwareProfile) -> str:
    """``ACCELERATOR_LABEL``'s value: the GPU model as a label value (``nvidia-h100-80gb-hbm3``)."""
    return re.sub(r"[^a-z0-9]+", "-", profile.gpu_model.lower()).strip("-")


def node_labels(profile: HardwareProfile) -> dict[str, str]:
    """Every label the node group gives its nodes."""
    return {**GPU_LABELS, ACCELERATOR_LABEL: accelerator_name(profile)}

MEMLOCK_LIMIT = 10**18
"""Locked-memory limit of every container on the GPU nodes, bytes: 1 EB, far above any
instance's memory, so nothing a process can lock ever reaches it.

Why not RLIM_INFINITY (2**64 - 1, what ``ulimit -l`` prints as ``unlimited``): nodeadm merges
``baseRuntimeSpec`` over its default by JSON-decoding both into ``map[string]interface{}``
(awslabs/amazon-eks-ami, nodeadm ``internal/util/merge.go``, ``base_runtime_spec.go``), which
turns every number into a float64; 2**64 - 1 comes back out as 18446744073709551616, which does
not fit the runtime spec's uint64, and containerd could not load the spec at all. 10**18 is a
float64 exactly and survives the round trip (a test checks both)."""

NOFILE_SOFT, NOFILE_HARD = 65536, 1048576
"""The AMI's own open-files limits (its ``base-runtime-spec.json``). Not unlimited: the kernel
refuses an RLIMIT_NOFILE above ``fs.nr_open`` (1048576 by default) with EPERM."""


def container_rlimits() -> list[dict[str, object]]:
    """``process.rlimits`` of the GPU nodes' containers.

    Workers run as uid 1000, and a non-root process cannot raise RLIMIT_MEMLOCK; the AL2023 base
    runtime spec sets only RLIMIT_NOFILE, so containers inherit a small locked-memory limit and
    libfabric's EFA provider fails to register memory ("Libfabric error: (-12) Cannot allocate
    memory", awslabs/awsome-distributed-training#647). Lists replace rather than merge in
    nodeadm's merge, so the AMI's NOFILE entry is written here too.
    """
    return [
        {"type": "RLIMIT_NOFILE", "soft": NOFILE_SOFT, "hard": NOFILE_HARD},
        {"type": "RLIMIT_MEMLOCK", "soft": MEMLOCK_LIMIT, "hard": MEMLOCK_LIMIT},
    ]


def node_config() -> str:
    """AL2023 nodeadm config (``node.eks.aws/v1alpha1`` NodeConfig): stripe the instance-store
    NVMe into one RAID0 at /mnt/k8s-disks/0, and the containers' rlimits (``container_rlimits``)
    through containerd's base runtime spec.

    Managed node groups merge this MIME part with the bootstrap part EKS generates, so no
    ``image_id`` (and no full NodeConfig with cluster details) is needed.
    """
    document = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "instance": {"localStorage": {"strategy": "RAID0"}},
            "containerd": {"baseRuntimeSpec": {"process": {"rlimits": container_rlimits()}}},
        },
    }
    return "---\n" + yaml.safe_dump(document, sort_keys=False)

LUSTRE_READY_LABEL = {"fsdp-eks/lustre-client": "ready"}
"""Set by a GPU node whose Lustre client module loaded at boot (``lustre_client_script``); the
training job requires it when it mounts FSx, so a node without a working client gets no worker
(the pod waits, Pending, instead of hanging in its first FSx mount)."""
NODEADM_DROP_IN_DIR = "/etc/eks/nodeadm.d"
"""NodeConfig drop-ins that ``nodeadm-run.service`` merges over the user data; it runs after
cloud-init's scripts (``After=cloud-final.service``), so a script of ours can still add one
(awslabs/amazon-eks-ami ``templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service``,
``nodeadm/doc/examples.md``, drop-ins since v20251023)."""


def lustre_ready_drop_in() -> str:
    """The NodeConfig drop-in that labels the node ``LUSTRE_READY_LABEL``: kubelet flags append
    in nodeadm's merge (``nodeadm/internal/api/merge.go``), so the node group's own labels and
    taints stay."""
    labels = ",".join(f"{k}={v}" for k, v in LUSTRE_READY_LABEL.items())
    document = {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
                "spec": {"kubelet": {"flags": [f"--node-labels={labels}"]}}}
    return yaml.safe_dump(document, sort_keys=False)


def lustre_client_script() -> str:
    """Install the Lustre client, load and check its module, and only then label the node.

    The FSx CSI driver mounts with the host's Lustre client, which the AL2023 AMI does not ship;
    ``lustre-client`` must match the AMI's kernel (6.18 on the 1.36 AMI). Any failure goes to the
    instance console (``aws ec2 get-console-output``) and the node joins without the label. The
    paths are variables so that a test can run the script in a sandbox."""
    return f"""#!/bin/bash
set -uo pipefail
CONSOLE="${{CONSOLE:-/dev/console}}"
DROP_IN_DIR="${{DROP_IN_DIR:-{NODEADM_DROP_IN_DIR}}}"
FILESYSTEMS="${{FILESYSTEMS:-/proc/filesystems}}"
say() {{ echo "fsdp-eks: $*" | tee -a "$CONSOLE"; }}
fail() {{ say "Lustre client NOT ready on kernel $(uname -r): $*; the node joins without the label {next(iter(LUSTRE_READY_LABEL))}, so no training worker lands here"; exit 1; }}
dnf install -y lustre-client || fail "dnf install lustre-client failed"
modprobe lustre || fail "modprobe lustre failed (no lustre module for this kernel)"
grep -qw lustre "$FILESYSTEMS" || fail "lustre is not a registered file system after modprobe"
mkdir -p "$DROP_IN_DIR"
cat > "$DROP_IN_DIR/50-fsdp-eks-lustre.yaml" <<'NODECONFIG'
{lustre_ready_drop_in()}NODECONFIG
say "Lustre client ready on kernel $(uname -r)"
"""


def node_user_data(lustre_client: bool) -> str:
    """MIME multi-part user data (the only form EKS merges): the NodeConfig, and the Lustre
    client install when the job mounts FSx for Lustre."""
    parts = [("application/node.eks.aws", node_config())]
    if lustre_client:
        parts.append(("text/x-shellscript", lustre_client_script()))
    body = "".join(f"--FSDPEKS\nContent-Type: {kind}\n\n{text}\n" for kind, text in parts)
    return f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="FSDPEKS"\n\n{body}--FSDPEKS--\n'


def network_interfaces(
    profile: HardwareProfile, security_group_ids: list[pulumi.Input[str]], secondary_type: str
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """One interface per network card: card 0 ``efa`` at device index 0, every other card at
    device index 1 as ``secondary_type`` (``efa`` or ``efa-only``). Every interface carries the
    security groups, or the node never joins the cluster."""
    return [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            network_card_index=card,
            device_index=0 if card == 0 else 1,
            interface_type="efa" if card == 0 else secondary_type,
            security_groups=security_group_ids,
            delete_on_termination="true",
        )
        for card in range(profile.network_cards)
    ]


@dataclass(frozen=True, kw_only=True)
class GpuNodeGroupArgs:
    """Inputs of ``GpuNodeGroup``."""

    name: str
    """Prefix of physical names (the cluster name)."""
    cluster_name: pulumi.Input[str]
    profile: HardwareProfile
    settings: GpuNodeSettings
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[list[str]]
    """Private subnets of the GPU AZ only."""
    cluster_security_group_id: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    kubernetes_version: str
    """The cluster's Kubernetes minor: picks the pinned AMI release (``versions.EKS_AMI_RELEASES``)."""
    lustre_client: bool = False
    """Install the Lustre client at boot (the job mounts FSx for Lustre)."""
    can_join: Sequence[pulumi.Resource] = ()
    """What the node group waits for: the cluster and the node role's policy attachments
    (``EksCluster.nodes_can_join``); a node booted before them never joins."""


class GpuNodeGroup(pulumi.ComponentResource):
    """GPU nodes with every EFA interface, in one AZ, on reserved or on-demand capacity."""

    def __init__(self, name: str, args: GpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:gpu:GpuNodeGroup", name, None, opts)
        self.efa_security_group = self._efa_security_group(name, args)
        self.placement_group = (
            aws.ec2.PlacementGroup(f"{name}-cluster-pg", strategy="cluster", opts=pulumi.ResourceOptions(parent=self))
            if args.settings.placement_group
            else None
        )
        self.launch_template = self._launch_template(name, args)
        self.node_group = self._node_group(name, args)
        self.node_group_name = self.node_group.node_group_name
        self.autoscaling_tags = self._autoscaling_tags(name, args) if args.settings.autoscaling else []
        self.register_outputs(
            {
                "node_group_name": self.node_group_name,
                "autoscaling_tags": self.autoscaling_tags,
                "launch_template_id": self.launch_template.id,
                "efa_security_group_id": self.efa_security_group.id,
            }
        )

    def _efa_security_group(self, name: str, args: GpuNodeGroupArgs) -> aws.ec2.SecurityGroup:
        # EFA's SRD traffic needs every protocol to and from the group itself, both directions.
        everything_self = {"protocol": "-1", "from_port": 0, "to_port": 0, "self": True}
        return aws.ec2.SecurityGroup(
            f"{name}-efa",
            vpc_id=args.vpc_id,
            description="EFA: all traffic to and from itself",
            ingress=[aws.ec2.SecurityGroupIngressArgs(**everything_self, description="EFA in")],
            egress=[aws.ec2.SecurityGroupEgressArgs(**everything_self, description="EFA out")],
            tags={"Name": f"{args.name}-efa"},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _launch_template(self, name: str, args: GpuNodeGroupArgs) -> aws.ec2.LaunchTemplate:
        s = args.settings
        reservation = None
        if s.capacity_reservation_id is not None:
            reservation = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                    capacity_reservation_id=s.capacity_reservation_id
                )
            )
        return aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"{args.profile.instance_type} with {args.profile.efa_interfaces} EFA interfaces",
            network_interfaces=network_interfaces(
                args.profile,
                [args.cluster_security_group_id, self.efa_security_group.id],
                s.secondary_interface_type,
            ),
            # IMDSv2, one hop: no pod on a GPU node can take the node role (components/node_metadata.py).
            metadata_options=metadata_options(),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name="/dev/xvda",
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=s.root_volume_gib,
                        volume_type="gp3",
                        iops=6000,
                        throughput=500,
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            user_data=base64.b64encode(node_user_data(args.lustre_client).encode()).decode(),
            placement=self._placement(s),
            capacity_reservation_specification=reservation,
            instance_market_options=(
                aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
                if s.capacity_block
                else None
            ),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type="instance", tags={"Name": f"{args.name}-{args.profile.instance_type}"}
                )
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _placement(self, s: GpuNodeSettings) -> aws.ec2.LaunchTemplatePlacementArgs | None:
        """The placement group the nodes launch into: the one named in the settings (a
        reservation's), ours, or none."""
        if s.placement_group_name is not None:
            return aws.ec2.LaunchTemplatePlacementArgs(group_name=s.placement_group_name)
        if self.placement_group is not None:
            return aws.ec2.LaunchTemplatePlacementArgs(group_name=self.placement_group.name)
        return None

    def _node_group(self, name: str, args: GpuNodeGroupArgs) -> aws.eks.NodeGroup:
        s = args.settings
        return aws.eks.NodeGroup(
            f"{name}-gpu",
            cluster_name=args.cluster_name,
            node_role_arn=args.node_role_arn,
            subnet_ids=args.subnet_ids,
            instance_types=[args.profile.instance_type],
            ami_type="AL2023_x86_64_NVIDIA",
            release_version=versions.EKS_AMI_RELEASES[args.kubernetes_version],
            capacity_type="CAPACITY_BLOCK" if s.capacity_block else "ON_DEMAND",
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=s.min_size, desired_size=initial_desired_size(s), max_size=s.max_size
            ),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)
            ),
            labels=node_labels(args.profile),
            taints=[aws.eks.NodeGroupTaintArgs(key=GPU_TAINT["key"], value=GPU_TAINT["value"], effect="NO_SCHEDULE")],
            # Replacing a reserved GPU node costs hours of training: one at a time.
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            node_repair_config=node_repair_config(s.auto_repair),
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=list(args.can_join),
                # The autoscaler sizes the group: a later `pulumi up` must not set it back.
                ignore_changes=[DESIRED_SIZE_PROPERTY] if s.autoscaling else None,
            ),
        )

    def _autoscaling_tags(self, name: str, args: GpuNodeGroupArgs) -> list[aws.autoscaling.Tag]:
        """Tags on the group's Auto Scaling group (not on its instances): ``DISCOVERY_TAG``, and
        what the Cluster Autoscaler must know of a node to scale the group up from zero
        (``autoscaling_group_tags``)."""
        asg_name = self.node_group.resources.apply(lambda r: r[0].autoscaling_groups[0].name)
        return [
            aws.autoscaling.Tag(
                # Named by what the tag says (label/nvidia.com/gpu -> label-nvidia.com-gpu): stable.
                f"{name}-asg-" + key.removeprefix(f"{TEMPLATE_PREFIX}/").replace("/", "-"),
                autoscaling_group_name=asg_name,
                tag=aws.autoscaling.TagTagArgs(key=key, value=value, propagate_at_launch=False),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for key, value in autoscaling_group_tags(args.name, args.profile, args.lustre_client).items()
        ]


DESIRED_SIZE_PROPERTY = "scalingConfig.desiredSize"
"""The node group's desired size, as Pulumi's ``ignore_changes`` names it."""


def initial_desired_size(s: GpuNodeSettings) -> int:
    """The group's desired size when it is created. A capacity block's group starts at 0 with the
    autoscaler on: EKS refuses a desired size above 0 before the block starts (EKS user guide,
    "Create a managed node group with Capacity Blocks for ML"), and the autoscaler adds nodes
    for the job's pending pods once it is active."""
    return 0 if s.capacity_block and s.autoscaling else s.desired_size


def autoscaling_group_tags(cluster_name: str, profile: HardwareProfile, lustre_client: bool) -> dict[str, str]:
    """The GPU Auto Scaling group's tags: ``DISCOVERY_TAG``, and the node template the Cluster
    Autoscaler scales up from zero by: the node group's labels (and the Lustre label the nodes
    add at boot, which the job requires with FSx), the GPU taint, and the GPUs and EFA
    interfaces the device plugins advertise (the provider knows only CPU, memory and GPUs of an
    instance type; the EFA count is ours to give)."""
    labels = {**node_labels(profile), **(LUSTRE_READY_LABEL if lustre_client else {})}
    resources = {"nvidia.com/gpu": profile.gpus, "vpc.amazonaws.com/efa": profile.efa_interfaces}
    return {DISCOVERY_TAG: cluster_name, **node_template_tags(labels, [GPU_TAINT], resources)}


def node_repair_config(enabled: bool) -> aws.eks.NodeGroupNodeRepairConfigArgs:
    """EKS node auto repair of the GPU group, with EKS's own thresholds and delays.

    A node whose ``AcceleratedHardwareReady`` condition (set by the node monitoring agent from
    NVIDIA Xid and NVLink errors in the kernel log) stays false is rebooted or replaced after
    10 minutes; ``NetworkingReady`` (EFA, interfaces), ``KernelReady``, ``StorageReady`` and
    the kubelet's ``Ready`` after 30 minutes (EKS user guide, "Automatically repair nodes in EKS
    clusters", node-repair.html). EKS stops repairing while more than 20 % of a group of more
    than five nodes is unhealthy, so a fleet-wide fault is not "repaired" node by node.
    The API's default is off (API_NodeRepairConfig.html), and so is ours (``GpuNodeSettings.auto_repair``).
    """
    return aws.eks.NodeGroupNodeRepairConfigArgs(enabled=enabled)


GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
"""What pods and daemons that belong on GPU nodes carry."""


def require_node_label(key: str, value: str) -> dict:
    """A required node affinity on one label.

    Used instead of extending a chart's default affinity: Helm merges maps but replaces lists,
    so this replaces the chart's own node selector terms (which often name labels, such as
    Node Feature Discovery's, that EKS nodes do not carry).
    """
    term = {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The label every node carries (set by the kubelet), ours or an existing cluster's."""


def gpu_node_placement(instance_type: str) -> dict:
    """Pod spec (or chart values) keys that put a pod on the GPU nodes only: it tolerates their
    taint and requires their instance type, a label an existing cluster's GPU nodes carry too
    (``GPU_LABELS`` are only on the node group this stack creates)."""
    return {
        "tolerations": [dict(GPU_TOLERATION)],
        "affinity": require_node_label(INSTANCE_TYPE_LABEL, instance_type),
    }
