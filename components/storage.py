"""Storage every training node shares: FSx for Lustre for the run's checkpoints and exported model.

torch.distributed.checkpoint writes each rank's shards where ``--checkpoint-dir`` points and rank 0
writes the metadata; on node-local NVMe a multi-node checkpoint ends up in pieces on different
machines, and a restarted worker group (or a resumed run) cannot load it. ``SharedStorage`` gives
every worker the same directory:

- an **FSx for Lustre** file system, ``PERSISTENT_2`` (SSD, replicated within its AZ), Lustre 2.15,
  LZ4 compression, in the private subnet of the GPU nodes' AZ (no cross-AZ traffic or charge);
- its **security group**: Lustre's LNET ports (TCP 988 and 1018-1023, FSx for Lustre user guide,
  "File system access control with Amazon VPC") from and to itself (the file servers talk to each
  other) and the EKS cluster security group, which every node carries; the cluster security group
  gets the matching inbound rules from the file system's group;
- the **FSx CSI driver** (pinned Helm release, ``components/versions.py``): its node DaemonSet
  tolerates the GPU taint, its controller runs on the system nodes. No AWS credentials: the
  driver's install guide attaches ``AmazonFSxFullAccess`` for dynamic provisioning, but a static
  volume makes the controller call no FSx API (CreateVolume / DeleteVolume run only for claims of
  a StorageClass; the driver has no attach step), and the node plugin mounts with the node's Lustre
  client. A StorageClass added later needs a Pod Identity role for ``fsx-csi-controller-sa`` with
  the FSx actions it uses. Both get the region from the chart's ``region`` values: with IMDS closed
  to pods their metadata comes from the Kubernetes API, which carries none (node_metadata.py);
- a static **PersistentVolume** (``fsx.csi.aws.com``, ``ReadWriteMany``, reclaim ``Retain``: the
  file system's life is this stack's, not the claim's) reserved by ``claimRef`` for one claim in
  the job's namespace.

The claim itself (``claim_manifest``) is created by the training job, which owns its namespace:
the namespace must exist before the claim and the claim before the job, all in one component.

The file system's root is owned by root and the job runs as uid 1000: the job's init container,
as root, creates and chowns the run's own directory (``/fsx/runs/<run>``). That needs root squash
off, the FSx default. The AL2023 EKS AMI ships no Lustre client: the GPU nodes install
``lustre-client`` (kernel module and ``lctl``) at boot and only then take the label the workers
require (components/gpu_nodes.py, ``lustre_client_script``, ``LUSTRE_READY_LABEL``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components import versions
from components.cluster import SYSTEM_NODE_LABEL
from components.gpu_nodes import GPU_TOLERATION, LUSTRE_READY_LABEL
from components.helm import helm_release
from components.settings import StorageSettings

CSI_DRIVER = "fsx.csi.aws.com"
DEPLOYMENT_TYPE = "PERSISTENT_2"
LUSTRE_PORTS = ((988, 988), (1018, 1023))
"""TCP port ranges of Lustre (LNET) traffic between clients and FSx file servers."""
MOUNT_OPTIONS = ["relatime", "flock"]
"""The FSx for Lustre user guide's mount options: ``flock`` makes locks coherent across nodes."""
CONTROLLER_SERVICE_ACCOUNT = ("kube-system", "fsx-csi-controller-sa")
NODE_SERVICE_ACCOUNT = "fsx-csi-node-sa"
CLAIM_NAME = "shared"
"""The PersistentVolumeClaim every worker mounts, in the job's namespace."""
NOEXECUTE_GRACE = {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
"""The chart's own default node toleration, kept beside ours (values lists replace, not merge)."""


# --------------------------------------------------------------------------- the pure builders


def csi_driver_values(region: str) -> dict[str, Any]:
    """Helm values of the FSx CSI driver: node plugin on the GPU nodes too, controller on the system nodes.

    ``tolerateAllTaints: false`` with explicit tolerations instead of the chart's tolerate-all, so
    the GPU taint is stated (and tested) rather than implied. ``region`` becomes both pods'
    ``AWS_REGION``: their Kubernetes-API metadata fallback has no region (aws-fsx-csi-driver
    ``pkg/cloud/metadata_k8s.go``).
    """
    return {
        "controller": {
            "nodeSelector": dict(SYSTEM_NODE_LABEL),
            "serviceAccount": {"create": True, "name": CONTROLLER_SERVICE_ACCOUNT[1]},
            "region": region,
        },
        "node": {
            "region": region,
            "tolerateAllTaints": False,
            "tolerations": [dict(GPU_TOLERATION), dict(NOEXECUTE_GRACE)],
            "serviceAccount": {"create": True, "name": NODE_SERVICE_ACCOUNT},
        },
    }


def volume_spec(
    *, capacity_gib: int, namespace: str, file_system_id: Any, dns_name: Any, mount_name: Any
) -> dict[str, Any]:
    """Spec of the static PersistentVolume of a file system, reserved for ``CLAIM_NAME``."""
    return {
        "capacity": {"storage": f"{capacity_gib}Gi"},
        "volumeMode": "Filesystem",
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        # "" : no StorageClass, no dynamic provisioner; binds only to the claim named below.
        "storageClassName": "",
        "claimRef": {"namespace": namespace, "name": CLAIM_NAME},
        "mountOptions": list(MOUNT_OPTIONS),
        "csi": {
            "driver": CSI_DRIVER,
            "volumeHandle": file_system_id,
            "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
        },
    }


def claim_manifest(*, namespace: str, volume_name: str, capacity_gib: int) -> dict[str, Any]:
    """The PersistentVolumeClaim bound to the static volume ``volume_name``."""
    return {
        "metadata": {"name": CLAIM_NAME, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": volume_name,
            "resources": {"requests": {"storage": f"{capacity_gib}Gi"}},
        },
    }


# --------------------------------------------------------------------------- what the job mounts


@dataclass(frozen=True, kw_only=True)
class SharedClaim:
    """The ReadWriteMany claim every worker mounts (checkpoints and the exported model live there)."""

    name: str
    """PersistentVolumeClaim name in the job's namespace."""
    manifest: dict[str, Any] | None = None
    """The claim to create with the job (``claim_manifest``); None: it exists already."""
    ready: Sequence[pulumi.Resource] = ()
    """What the claim waits for: the volume it binds to and the driver that mounts it."""
    node_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels a node must carry to mount it (FSx: its Lustre client loaded, ``LUSTRE_READY_LABEL``)."""


# --------------------------------------------------------------------------- the component


@dataclass(frozen=True, kw_only=True)
class SharedStorageArgs:
    """Inputs of ``SharedStorage``."""

    name: str
    """Prefix of physical names (the stack's ``<project>-<stack>``)."""
    region: str
    """The stack's AWS region (the CSI driver's ``AWS_REGION``)."""
    settings: StorageSettings
    namespace: str
    """The job's namespace, where the claim will be."""
    vpc_id: pulumi.Input[str]
    gpu_subnet_ids: pulumi.Input[list[str]]
    """Private subnets of the GPU AZ; the file system goes into the first."""
    cluster_security_group_id: pulumi.Input[str]
    """The EKS cluster security group, on every node."""
    provider: k8s.Provider
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """What in-cluster objects wait for: the Pod Identity agent and the system nodes."""


class SharedStorage(pulumi.ComponentResource):
    """An FSx for Lustre file system, its security group, the FSx CSI driver and a static volume."""

    def __init__(self, name: str, args: SharedStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:storage:SharedStorage", name, None, opts)
        self.security_group = self._security_group(name, args)
        self.node_rules = self._node_rules(name, args)
        self.file_system = self._file_system(name, args)
        self.csi_driver = self._csi_driver(name, args)
        self.volume = self._volume(name, args)
        self.file_system_id = self.file_system.id
        self.claim = SharedClaim(
            name=CLAIM_NAME,
            manifest=claim_manifest(
                namespace=args.namespace, volume_name=self.volume_name(args),
                capacity_gib=args.settings.fsx_storage_capacity_gib,
            ),
            ready=[self.volume, self.csi_driver],
            node_labels=LUSTRE_READY_LABEL,
        )
        self.register_outputs(
            {
                "file_system_id": self.file_system_id,
                "dns_name": self.file_system.dns_name,
                "mount_name": self.file_system.mount_name,
                "security_group_id": self.security_group.id,
                "volume_name": self.volume_name(args),
                "claim_name": self.claim.name,
            }
        )

    @staticmethod
    def volume_name(args: SharedStorageArgs) -> str:
        return f"{args.name}-fsx"

    def _security_group(self, name: str, args: SharedStorageArgs) -> aws.ec2.SecurityGroup:
        lustre = [
            {"protocol": "tcp", "from_port": lo, "to_port": hi, "self": True,
             "security_groups": [args.cluster_security_group_id]}
            for lo, hi in LUSTRE_PORTS
        ]
        return aws.ec2.SecurityGroup(
            f"{name}-fsx",
            vpc_id=args.vpc_id,
            description="FSx for Lustre: LNET with its own servers and the cluster nodes",
            ingress=[aws.ec2.SecurityGroupIngressArgs(**rule, description="Lustre in") for rule in lustre],
            egress=[aws.ec2.SecurityGroupEgressArgs(**rule, description="Lustre out") for rule in lustre],
            tags={"Name": f"{args.name}-fsx"},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _node_rules(self, name: str, args: SharedStorageArgs) -> list[aws.vpc.SecurityGroupIngressRule]:
        """The nodes' side: Lustre from the file servers into the cluster security group."""
        return [
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-nodes-lustre-{lo}-{hi}",
                security_group_id=args.cluster_security_group_id,
                referenced_security_group_id=self.security_group.id,
                ip_protocol="tcp",
                from_port=lo,
                to_port=hi,
                description="Lustre from FSx",
                opts=pulumi.ResourceOptions(parent=self),
            )
            for lo, hi in LUSTRE_PORTS
        ]

    def _file_system(self, name: str, args: SharedStorageArgs) -> aws.fsx.LustreFileSystem:
        s = args.settings
        return aws.fsx.LustreFileSystem(
            f"{name}-fsx",
            deployment_type=DEPLOYMENT_TYPE,
            storage_type="SSD",
            storage_capacity=s.fsx_storage_capacity_gib,
            per_unit_storage_throughput=s.fsx_throughput_per_tib,
            data_compression_type="LZ4",
            file_system_type_version=versions.FSX_LUSTRE_VERSION,
            # One subnet only (an FSx rule): the GPU AZ's, so Lustre traffic stays in the AZ.
            subnet_ids=pulumi.Output.from_input(args.gpu_subnet_ids).apply(lambda ids: ids[0]),
            security_group_ids=[self.security_group.id],
            tags={"Name": f"{args.name}-fsx"},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _csi_driver(self, name: str, args: SharedStorageArgs) -> k8s.helm.v3.Release:
        # No Pod Identity role: a static volume makes the driver call no AWS API (module docstring).
        return helm_release(
            f"{name}-fsx-csi",
            versions.FSX_CSI_DRIVER,
            CONTROLLER_SERVICE_ACCOUNT[0],
            csi_driver_values(args.region),
            pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.ready)),
        )

    def _volume(self, name: str, args: SharedStorageArgs) -> k8s.core.v1.PersistentVolume:
        fs = self.file_system
        return k8s.core.v1.PersistentVolume(
            f"{name}-volume",
            metadata={"name": self.volume_name(args)},
            spec=volume_spec(
                capacity_gib=args.settings.fsx_storage_capacity_gib, namespace=args.namespace,
                file_system_id=fs.id, dns_name=fs.dns_name, mount_name=fs.mount_name,
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[self.csi_driver]),
        )
