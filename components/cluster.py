"""The EKS cluster: control plane, core add-ons, system node group, Kubernetes provider.

``EksCluster`` creates one; ``ExistingCluster`` attaches to one the user already runs. Both are
a ``KubernetesCluster``, the one protocol the in-cluster layers deploy onto.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from components import versions
from components.gpu_nodes import GPU_TOLERATION
from components.node_metadata import metadata_options
from components.settings import ClusterSettings

SYSTEM_NODE_LABEL = {"fsdp-eks/node-role": "system"}
"""Label of the CPU nodes; etcd, the operator and monitoring select it."""

NODE_ROLE_POLICIES = {
    "worker": "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "cni": "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "ecr": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    # Session Manager instead of SSH keys for debugging a node.
    "ssm": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
}

ADDON_CONFLICT_RESOLUTION = "OVERWRITE"
"""``resolve_conflicts_on_create`` and ``_on_update`` of every EKS add-on the stack creates. EKS
bootstraps CoreDNS (and kube-proxy, the VPC CNI) as self-managed objects; without OVERWRITE,
CreateAddon over them "might fail" (EKS API reference, CreateAddon ``resolveConflicts``; eksctl
#5880, nebari #2537). A later pin bump is an UpdateAddon, which without a resolution "might
fail" the same way where a field differs from EKS's default (UpdateAddon ``resolveConflicts``);
the configuration we set is the one to keep. pulumi-eks uses OVERWRITE for both on the add-ons
it creates (kube-proxy, the VPC CNI: ``KubeProxyAddonOptionsArgs`` defaults)."""

ACCESS_POLICIES = {
    "admin": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy",
    "viewer": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy",
}
"""EKS access policies of ``cluster.adminRoleArns`` and ``cluster.viewerRoleArns`` (EKS user guide,
"Associate access policies with access entries"), cluster-wide."""


@runtime_checkable
class KubernetesCluster(Protocol):
    """What every in-cluster layer needs of a cluster, created here or already running."""

    cluster_name: pulumi.Input[str]
    kubeconfig: pulumi.Output[str]
    """Secret: how a client reaches and authenticates to the API server."""
    provider: k8s.Provider
    """The Kubernetes provider every in-cluster object uses explicitly."""
    system_node_selector: dict[str, str]
    """Where system workloads (etcd, the operator, monitoring) run; {} on a cluster not ours."""
    ready: Sequence[pulumi.Resource]
    """What in-cluster objects wait for: nodes and add-ons their pods need ([] when they exist)."""
    dcgm_host_engine: pulumi.Resource | None
    """What runs the GPU nodes' DCGM host engine (the node monitoring agent add-on), which
    dcgm-exporter reads; None where the stack installs none: the exporter embeds its own."""


def kubernetes_provider(name: str, kubeconfig: pulumi.Output[str], parent: pulumi.Resource) -> k8s.Provider:
    """The cluster's one Kubernetes provider, child of ``parent``: server-side apply, because the
    Training Operator's CRD is larger than client-side apply's annotation limit (docs/design.md)."""
    return k8s.Provider(
        f"{name}-k8s",
        kubeconfig=kubeconfig,
        enable_server_side_apply=True,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def access_grants(settings: ClusterSettings) -> dict[str, tuple[str, str]]:
    """Stable key (``admin-<role name>``) -> (role ARN, access policy ARN) of every access entry."""
    grants = {}
    for kind, arns in (("admin", settings.admin_role_arns), ("viewer", settings.viewer_role_arns)):
        for arn in arns:
            # The role's name (last path element) is unique within an account; the account id and
            # the kind keep it unique across the two lists and accounts.
            account, role = arn.split(":")[4], arn.rsplit("/", 1)[-1]
            grants[f"{kind}-{account}-{role}"] = (arn, ACCESS_POLICIES[kind])
    return grants


def endpoint_access(settings: ClusterSettings) -> dict:
    """``eks.Cluster`` endpoint inputs: private always; public only when asked, only for the CIDRs."""
    if not settings.endpoint_public_access:
        return {"endpoint_private_access": True, "endpoint_public_access": False}
    return {"endpoint_private_access": True, "endpoint_public_access": True,
            "public_access_cidrs": list(settings.public_access_cidrs)}


def control_plane_log_types(settings: ClusterSettings) -> list[str]:
    """The control-plane logs sent to CloudWatch: the API server's and the authenticator's; the
    audit log (every request: the largest, billed per GB) only when ``cluster.auditLog`` asks."""
    return ["api", "authenticator", *(["audit"] if settings.audit_log else [])]


def vpc_cni_options(addon_version: str) -> eks.VpcCniOptionsArgs:
    """The VPC CNI add-on with NetworkPolicy enforcement on (its network policy agent, VPC CNI >=
    1.14), so the etcd NetworkPolicy (components/rendezvous.py) is enforced, not just stored.
    Kubelet probes from the node's own IP stay allowed (aws-network-policy-agent#56, fixed in 1.15.1)."""
    return eks.VpcCniOptionsArgs(addon_version=addon_version, configuration_values={"enableNetworkPolicy": "true"})


@dataclass(frozen=True, kw_only=True)
class EksClusterArgs:
    """Inputs of ``EksCluster``."""

    name: str
    """The EKS cluster name."""
    settings: ClusterSettings
    vpc_id: pulumi.Input[str]
    private_subnet_ids: pulumi.Input[list[str]]
    public_subnet_ids: pulumi.Input[list[str]]


class EksCluster(pulumi.ComponentResource):
    """A new EKS cluster (API authentication, pinned version and add-ons) and its system nodes."""

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:cluster:EksCluster", name, None, opts)
        self.cluster_name = args.name
        self.node_role, self.node_role_policies = self._node_role(name)
        self.log_group = self._log_group(name, args)
        self.eks = self._control_plane(name, args)
        self.nodes_can_join: list[pulumi.Resource] = [self.eks, *self.node_role_policies]
        """What a node group waits for: the cluster, and its node role with every policy attached
        (a node that boots before the CNI and worker policies are attached never joins)."""
        after_cluster = pulumi.ResourceOptions(parent=self, depends_on=[self.eks])
        self.access_entries = self._access_entries(name, args, after_cluster)
        self.pod_identity_agent = self._addon(f"{name}-pod-identity-agent", args, "eks-pod-identity-agent", after_cluster)
        self.system_launch_template = self._system_launch_template(name)
        self.system_nodes = self._system_nodes(
            name, args, pulumi.ResourceOptions(parent=self, depends_on=self.nodes_can_join)
        )
        self.coredns = self._addon(
            f"{name}-coredns", args, "coredns", pulumi.ResourceOptions(parent=self, depends_on=[self.eks, self.system_nodes])
        )
        # Its DaemonSet needs nodes to run on, or the add-on never turns ACTIVE: after the
        # system nodes; GPU nodes, which start alongside, get its DaemonSet as they join.
        # Its dcgm-server tolerates the GPU taint (versions.node_monitoring_agent_configuration).
        self.node_monitoring_agent = self._addon(
            f"{name}-node-monitoring-agent", args, "eks-node-monitoring-agent",
            pulumi.ResourceOptions(parent=self, depends_on=[self.eks, self.system_nodes]),
            configuration_values=json.dumps(versions.node_monitoring_agent_configuration([dict(GPU_TOLERATION)])),
        )
        self.dcgm_host_engine = self.node_monitoring_agent
        self.ready: list[pulumi.Resource] = [self.pod_identity_agent, self.system_nodes, self.coredns]
        """What in-cluster workloads wait for: nodes to run on, cluster DNS and Pod Identity credentials."""
        self.system_node_selector = SYSTEM_NODE_LABEL
        """Node selector of etcd, the operator and monitoring: our system nodes carry it."""
        self.cluster_security_group_id = self.eks.cluster_security_group_id
        self.kubeconfig = pulumi.Output.secret(self.eks.kubeconfig_json)
        self.provider = kubernetes_provider(name, self.kubeconfig, self)
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "kubeconfig": self.kubeconfig,
                "cluster_security_group_id": self.cluster_security_group_id,
                "node_role_arn": self.node_role.arn,
                "log_group": self.log_group.name,
            }
        )

    @staticmethod
    def _addon(resource_name: str, args: EksClusterArgs, addon: str, opts: pulumi.ResourceOptions,
               configuration_values: str | None = None) -> aws.eks.Addon:
        """A core EKS add-on at the pinned version of the cluster's Kubernetes version."""
        return aws.eks.Addon(
            resource_name,
            cluster_name=args.name,
            addon_name=addon,
            addon_version=versions.EKS_ADDONS[args.settings.kubernetes_version][addon],
            resolve_conflicts_on_create=ADDON_CONFLICT_RESOLUTION,
            resolve_conflicts_on_update=ADDON_CONFLICT_RESOLUTION,
            configuration_values=configuration_values,
            opts=opts,
        )

    def _log_group(self, name: str, args: EksClusterArgs) -> aws.cloudwatch.LogGroup:
        """The control plane's log group, created before the cluster so that it has a retention
        and ``pulumi destroy`` deletes it. With logging on, EKS otherwise creates
        ``/aws/eks/<cluster>/cluster`` itself, never expiring and unknown to the stack (EKS user
        guide, "Send control plane logs to CloudWatch Logs")."""
        return aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=f"/aws/eks/{args.name}/cluster",
            retention_in_days=args.settings.log_retention_days,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _node_role(self, name: str) -> tuple[aws.iam.Role, list[aws.iam.RolePolicyAttachment]]:
        role = aws.iam.Role(
            f"{name}-node-role",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-role-{key}", role=role.name, policy_arn=arn, opts=pulumi.ResourceOptions(parent=role)
            )
            for key, arn in NODE_ROLE_POLICIES.items()
        ]
        return role, attachments

    def _control_plane(self, name: str, args: EksClusterArgs) -> eks.Cluster:
        s = args.settings
        addons = versions.EKS_ADDONS[s.kubernetes_version]
        return eks.Cluster(
            f"{name}-eks",
            name=args.name,
            version=s.kubernetes_version,
            authentication_mode=eks.AuthenticationMode.API,
            vpc_id=args.vpc_id,
            private_subnet_ids=args.private_subnet_ids,
            public_subnet_ids=args.public_subnet_ids,
            node_associate_public_ip_address=False,
            skip_default_node_group=True,
            # Use the EKS-created cluster security group: the GPU launch template puts it on
            # every network interface, which is what lets the nodes join.
            skip_default_security_groups=True,
            **endpoint_access(s),
            enabled_cluster_log_types=control_plane_log_types(s),
            # pulumi-eks defaults the upgrade policy to EXTENDED (about 6x the control-plane price
            # once the version leaves standard support).
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=s.support_type),
            vpc_cni_options=vpc_cni_options(addons["vpc-cni"]),
            # Off here, created by us after the system nodes (self.coredns): the SDK fills in
            # enabled=True, and pulumi-eks then creates the add-on inside the cluster component,
            # before any node exists; its pods stay Pending, the add-on DEGRADED, and aws:eks:Addon
            # fails after its 20-minute wait (pulumi/pulumi-eks#1819). kube-proxy and the VPC CNI
            # are DaemonSets: with no node they are healthy at zero pods.
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(version=addons["kube-proxy"]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.log_group]),
        )

    def _access_entries(
        self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions
    ) -> list[aws.eks.AccessPolicyAssociation]:
        """``cluster.adminRoleArns`` / ``viewerRoleArns``: an access entry and a cluster-wide access
        policy each, so more than the identity that ran ``pulumi up`` can reach the cluster."""
        associations = []
        for key, (role_arn, policy_arn) in access_grants(args.settings).items():
            entry = aws.eks.AccessEntry(
                f"{name}-access-{key}", cluster_name=args.name, principal_arn=role_arn, type="STANDARD", opts=opts
            )
            associations.append(aws.eks.AccessPolicyAssociation(
                f"{name}-access-{key}-policy",
                cluster_name=args.name,
                principal_arn=entry.principal_arn,
                policy_arn=policy_arn,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[entry])),
            ))
        return associations

    def _system_launch_template(self, name: str) -> aws.ec2.LaunchTemplate:
        """Only the metadata options: IMDSv2 with one hop, as on the GPU nodes (node_metadata.py)."""
        return aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            description="fsdp-eks system nodes: IMDSv2, hop limit 1",
            metadata_options=metadata_options(),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _system_nodes(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions) -> aws.eks.NodeGroup:
        size = args.settings.system_nodes
        return aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=args.name,
            node_role_arn=self.node_role.arn,
            subnet_ids=args.private_subnet_ids,
            instance_types=[args.settings.system_instance_type],
            ami_type="AL2023_x86_64_STANDARD",
            release_version=versions.EKS_AMI_RELEASES[args.settings.kubernetes_version],
            capacity_type="ON_DEMAND",
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=size.min_size, desired_size=size.desired_size, max_size=size.max_size
            ),
            labels=SYSTEM_NODE_LABEL,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.system_launch_template.id, version=self.system_launch_template.latest_version.apply(str)
            ),
            opts=opts,
        )


@dataclass(frozen=True, kw_only=True)
class ExistingClusterArgs:
    """Inputs of ``ExistingCluster``."""

    name: str
    """Name of the EKS cluster that already runs."""
    region: str


def exec_kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with ``aws eks get-token`` (no token stored in state)."""
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"],
        }
    }
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
            "current-context": cluster_name,
            "users": [{"name": cluster_name, "user": user}],
        }
    )


class ExistingCluster(pulumi.ComponentResource):
    """An EKS cluster created elsewhere; the in-cluster layers deploy onto it."""

    def __init__(self, name: str, args: ExistingClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:cluster:ExistingCluster", name, None, opts)
        self.cluster_name = args.name
        self.ready: list[pulumi.Resource] = []
        """Its nodes and add-ons exist already."""
        self.dcgm_host_engine = None
        """Whether it runs the node monitoring agent is not known here: dcgm-exporter embeds its
        own host engine rather than crash-looping against a port nothing listens on."""
        self.system_node_selector: dict[str, str] = {}
        """Its nodes do not carry our system label: no selector."""
        found = aws.eks.get_cluster_output(name=args.name, opts=pulumi.InvokeOutputOptions(parent=self))
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(found.endpoint, found.certificate_authorities[0].data).apply(
                lambda parts: exec_kubeconfig(args.name, parts[0], parts[1], args.region)
            )
        )
        self.provider = kubernetes_provider(name, self.kubeconfig, self)
        self.register_outputs({"cluster_name": self.cluster_name, "kubeconfig": self.kubeconfig})
