"""Every external version fsdp-eks deploys, pinned exactly, in one place.

No ``latest``, no ``master``, no "most recent" look-ups: a ``pulumi up`` next year deploys what a
``pulumi up`` today deploys. Bump a pin here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import PurePosixPath

VENDOR_DIR = PurePosixPath("vendor")
"""Third-party source the program installs, relative to the project root (where ``pulumi up``
runs), beside the program rather than inside ``components/``; ``PROVENANCE.md`` there says where
each folder comes from, ``LICENSES/`` holds the licence texts."""
CHARTS_DIR = VENDOR_DIR / "charts"
"""Vendored Helm charts, ``<chart>-<version>/`` each."""
KUSTOMIZE_DIR = VENDOR_DIR / "kustomize"
"""Vendored kustomizations (and our overlay on them)."""


@dataclass(frozen=True, kw_only=True)
class HelmChart:
    """A Helm chart at an exact version."""

    chart: str
    version: str
    repo: str
    """The Helm repository that publishes it (provenance: ``pulumi up`` installs the vendored copy)."""

    @property
    def folder(self) -> PurePosixPath:
        """The vendored copy, relative to the project root."""
        return CHARTS_DIR / f"{self.chart}-{self.version}"


# Kubernetes minor versions the add-on pins below were chosen for. A stack asking for another
# version fails validation: add the version here with its add-on pins and its end of standard
# support to support it. Check each pin with
# `aws eks describe-addon-versions --kubernetes-version X --addon-name Y` when bumping.
EKS_ADDONS: dict[str, dict[str, str]] = {
    # 1.33 and 1.34: the AWS EKS user guide's per-version tables (coredns, kube-proxy,
    # vpc-cni); the others from pins used for these versions in public EKS repositories.
    # eks-node-monitoring-agent (the node health checks behind GPU-node auto repair): 1.33's
    # v1.4.0-eksbuild.2 beside kube-proxy v1.33.3 in a public EKS Terraform stack; 1.34's
    # v1.4.2-eksbuild.1 and 1.35's v1.6.2-eksbuild.1 in the public Terraform environment
    # file of the UK MoJ Analytical Platform's clusters at those versions. The agent reads node
    # logs and is not tied to a Kubernetes minor, but EKS lists its builds per version.
    # For 1.36: v1.7.2-eksbuild.1, from a public configuration of a 1.36 cluster (below).
    "1.33": {
        # vpc-cni >= v1.18.4 is needed for `efa-only` network interfaces.
        "vpc-cni": "v1.20.1-eksbuild.3",
        "coredns": "v1.12.4-eksbuild.1",
        "kube-proxy": "v1.33.5-eksbuild.2",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
        "aws-ebs-csi-driver": "v1.53.0-eksbuild.1",
        "amazon-cloudwatch-observability": "v4.7.0-eksbuild.1",
        "eks-node-monitoring-agent": "v1.4.0-eksbuild.2",
    },
    "1.34": {
        "vpc-cni": "v1.21.1-eksbuild.1",
        "coredns": "v1.12.4-eksbuild.1",
        "kube-proxy": "v1.34.1-eksbuild.2",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
        "aws-ebs-csi-driver": "v1.53.0-eksbuild.1",
        "amazon-cloudwatch-observability": "v5.0.0-eksbuild.1",
        "eks-node-monitoring-agent": "v1.4.2-eksbuild.1",
    },
    # 1.35: every pin as a public Terraform configuration of an EKS 1.35 cluster pins it
    # (eks_addons of a 1.35 cluster, 2026): not read from the EKS add-on version tables, whose
    # stored copies stop at 1.34 -- inferred, check with describe-addon-versions.
    "1.35": {
        "vpc-cni": "v1.21.1-eksbuild.3",
        "coredns": "v1.13.2-eksbuild.1",
        "kube-proxy": "v1.35.0-eksbuild.2",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.3",
        "aws-ebs-csi-driver": "v1.57.1-eksbuild.1",
        "amazon-cloudwatch-observability": "v5.3.0-eksbuild.1",
        "eks-node-monitoring-agent": "v1.6.2-eksbuild.1",
    },
    # 1.36: vpc-cni, coredns, kube-proxy, pod identity agent and EBS CSI as a public Terraform
    # module pins them for an EKS 1.36 cluster (eks_version "1.36", 2026); CloudWatch: the
    # 1.35 pin, assumed to serve 1.36 too (the add-on's v5 builds span several Kubernetes
    # versions; public 1.36 configurations pin v6.2.0-eksbuild.1, whose configuration schema
    # for our keys is not confirmed); the node monitoring agent as a public Terraform
    # configuration of a 1.36 cluster (kube-proxy v1.36.0-eksbuild.25) pins it -- all inferred,
    # not read from the EKS add-on version tables; preview refuses a pin newer than EKS offers.
    "1.36": {
        "vpc-cni": "v1.22.3-eksbuild.1",
        "coredns": "v1.14.3-eksbuild.3",
        "kube-proxy": "v1.36.0-eksbuild.13",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.3",
        "aws-ebs-csi-driver": "v1.63.1-eksbuild.1",
        "amazon-cloudwatch-observability": "v5.3.0-eksbuild.1",
        "eks-node-monitoring-agent": "v1.7.2-eksbuild.1",
    },
}
NODE_MONITORING_AGENT_DCGM_HOST_ENGINE = "localhost:5555"
"""The one DCGM host engine of a GPU node: the eks-node-monitoring-agent add-on's ``dcgm-server``
DaemonSet runs ``nv-hostengine`` on host port 5555 (aws/eks-node-monitoring-agent, chart
``templates/dcgm-daemonset.yaml`` at v1.6.2 and v1.7.0). Our dcgm-exporter connects to it with
``-r`` from the host network instead of embedding a second host engine (two on one node are
unsupported, NVIDIA/DCGM #108). The agent's chart gained a switch to use an external host
engine instead (``dcgmAgent.enabled: false`` with ``nodeAgent.dcgmAddress``, chart v1.7.2;
not in the v1.7.0 add-on schema), but that needs a standalone host engine of our own, which
dcgm-exporter is not: the agent's is the one."""


def node_monitoring_agent_configuration(gpu_tolerations: list[dict[str, str]]) -> dict[str, object]:
    """``configuration_values`` of the pinned ``eks-node-monitoring-agent`` add-on: its
    ``dcgm-server`` DaemonSet tolerates the GPU nodes' taint.

    The chart's default is ``dcgmAgent.tolerations: []``: on a tainted GPU node no host engine
    runs, the agent reports ``AcceleratedHardwareReady=False`` (DCGMError) and node auto repair
    replaces the node (aws/containers-roadmap #2555, #2567). ``dcgmAgent.tolerations`` is in the
    add-on's configuration schema at v1.6.0 through v1.7.0 (the agent's
    ``charts/configuration.schema.json``; a test validates this against the v1.6.2 and v1.7.0
    copies) and in the chart's values at v1.7.2. The v1.4 builds pinned for 1.33 and 1.34
    predate the published schema: their chart values carry the key (since
    aws/eks-node-monitoring-agent #5), their add-on schema is not confirmed."""
    return {"dcgmAgent": {"tolerations": gpu_tolerations}}


EKS_AMI_RELEASES: dict[str, str] = {
    # awslabs/amazon-eks-ami, AMI release v20260714 (CHANGELOG.md, "Release version" per
    # Kubernetes version, the same for the AL2023 standard and NVIDIA AMIs): NVIDIA driver
    # 580.159.03 (kmod-nvidia-latest-dkms, R580: what CUDA 13.0 in the training image needs),
    # EFA 3.1.0, containerd 2.2.4; kernel 6.18.36 for 1.36, 6.12 for 1.33 to 1.35.
    "1.33": "1.33.13-20260714",
    "1.34": "1.34.9-20260714",
    "1.35": "1.35.6-20260714",
    "1.36": "1.36.2-20260714",
}
"""EKS-optimized AMI release (``release_version`` of the managed node groups) per Kubernetes
version. Without it a node group takes the newest AMI when it is created and on every replacement:
a new driver, kernel or EFA module arrives unannounced. Bump with the AMI's release notes read."""
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = tuple(EKS_ADDONS)
DEFAULT_KUBERNETES_VERSION = "1.36"
"""The newest pinned version: the one with the longest standard support ahead."""

STANDARD_SUPPORT_END: dict[str, date] = {
    # AWS EKS user guide, "Amazon EKS Kubernetes release calendar" (dates in UTC; extended
    # support is billed from the start of that day).
    "1.33": date(2026, 7, 29),
    "1.34": date(2026, 12, 2),
    # Released on EKS 2026-01-27/28: endoflife.date's amazon-eks table (from the same calendar).
    "1.35": date(2027, 3, 27),
    # Released on EKS 2026-06-02: endoflife.date's amazon-eks table (PR #10240); 14 months
    # after release, as the calendar rule gives.
    "1.36": date(2027, 8, 2),
}
"""End of EKS standard support per version. After it a cluster with the ``EXTENDED`` support
type is billed about 6x the standard control-plane price; with ``STANDARD`` EKS upgrades it
to the next version automatically (EKS user guide, "Manage EKS extended support")."""


def standard_support_warning(version: str, today: date) -> str | None:
    """A warning for a Kubernetes version whose EKS standard support has ended (or ends within
    30 days) on ``today``; None when it has time left or is unknown."""
    end = STANDARD_SUPPORT_END.get(version)
    if end is None:
        return None
    newest = max(STANDARD_SUPPORT_END, key=STANDARD_SUPPORT_END.__getitem__)
    advice = (f"set cluster.kubernetesVersion to {newest} (standard support until "
              f"{STANDARD_SUPPORT_END[newest].isoformat()})")
    if today >= end:
        return (f"Kubernetes {version} left EKS standard support on {end.isoformat()}: with "
                f"cluster.supportType EXTENDED the control plane costs about 6x, with STANDARD EKS "
                f"upgrades it on its own; {advice}")
    if (end - today).days <= 30:
        return (f"Kubernetes {version} leaves EKS standard support on {end.isoformat()} "
                f"({(end - today).days} days); {advice}")
    return None


# Observability (components/observability/).
KUBE_PROMETHEUS_STACK = HelmChart(
    chart="kube-prometheus-stack",
    version="88.5.3",
    repo="https://prometheus-community.github.io/helm-charts",
)
"""The newest release whose source could be vendored (91.2.1 could not), with its four subcharts
(grafana 12.11.1, kube-state-metrics 8.4.0, prometheus-node-exporter 4.56.1,
prometheus-windows-exporter 0.12.8) in its ``charts/``: vendor/PROVENANCE.md."""
DCGM_EXPORTER = HelmChart(
    chart="dcgm-exporter",
    version="4.8.2",
    repo="https://nvidia.github.io/dcgm-exporter/helm-charts",
)
"""4.8.2 is vendored exactly (its package digest matches the repository index); 4.8.3 exists only
as a reconstruction."""
DEBUG_TOOLS_IMAGE = "nvidia/cuda:12.8.1-base-ubuntu22.04"
"""htop/nvtop DaemonSet: CUDA's base image (Ubuntu 22.04 with universe, where nvtop lives); the
tools are apt-installed when the pod starts. No maintained public image ships nvtop."""

NVIDIA_DEVICE_PLUGIN = HelmChart(
    chart="nvidia-device-plugin",
    version="0.18.2",
    repo="https://nvidia.github.io/k8s-device-plugin",
)
EFA_DEVICE_PLUGIN = HelmChart(
    chart="aws-efa-k8s-device-plugin",
    version="v0.5.18",
    repo="https://aws.github.io/eks-charts",
)
"""The newest chart vendored. Its default image is plugin v0.5.10 in us-west-2: the values
override both with ``EFA_DEVICE_PLUGIN_IMAGE_TAG`` from the stack's region (``eks_image_registry``)."""
EFA_DEVICE_PLUGIN_IMAGE_TAG = "v0.5.20"
"""The plugin image that chart v0.5.30 ships (its appVersion, 2026-08-01, as quoted from
aws/eks-charts ``stable/aws-efa-k8s-device-plugin/Chart.yaml``); chart v0.5.26 shipped v0.5.18.
Not verified here: that the image is in every regional registry, and that the v0.5.18 chart's
DaemonSet (arguments, security context, mounts) suits it as well as the v0.5.30 chart's."""

EKS_IMAGE_REGISTRY_ACCOUNT = "602401143452"
"""The account of the regional ECR registries with the images of EKS add-ons, in most regions.
Source: EKS user guide, "View Amazon container image registries for Amazon EKS add-ons"
(add-ons-images.html)."""
EKS_IMAGE_REGISTRY_ACCOUNTS: dict[str, str] = {
    **dict.fromkeys(
        ("us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1", "eu-west-1",
         "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1", "ap-south-1", "ap-northeast-1",
         "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2"),
        EKS_IMAGE_REGISTRY_ACCOUNT,
    ),
    # Regions with their own account (same page).
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "ap-south-2": "900889452093",
    "ap-southeast-3": "296578399912",
    "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707",
    "ap-southeast-6": "333609536671",
    "ap-southeast-7": "121268973566",
}
"""Region -> account of its EKS add-on image registry; a region not listed here has not been
checked against the guide's table (add its row from there)."""


def eks_image_registry(region: str) -> str:
    """The ECR registry that serves EKS add-on images to nodes in ``region``."""
    if region not in EKS_IMAGE_REGISTRY_ACCOUNTS:
        raise ValueError(
            f"no EKS image registry known for region {region}: add its account to "
            "EKS_IMAGE_REGISTRY_ACCOUNTS in components/versions.py (EKS user guide, add-ons-images)"
        )
    return f"{EKS_IMAGE_REGISTRY_ACCOUNTS[region]}.dkr.ecr.{region}.amazonaws.com"

# GPU node autoscaling (components/cluster_autoscaler.py).
CLUSTER_AUTOSCALER = HelmChart(
    chart="cluster-autoscaler",
    version="9.59.0",
    repo="https://kubernetes.github.io/autoscaler",
)
"""The Kubernetes Cluster Autoscaler's chart, the newest release (tag
``cluster-autoscaler-chart-9.59.0``, 2026-07-21; vendor/PROVENANCE.md). Its default
image is v1.35.0: the values set ``CLUSTER_AUTOSCALER_IMAGE_TAGS`` for the cluster's version."""
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
CLUSTER_AUTOSCALER_IMAGE_TAGS: dict[str, str] = {
    # The newest patch of each minor: release tags cluster-autoscaler-1.33.6, -1.34.5, -1.35.2 and
    # -1.36.1 of kubernetes/autoscaler (all 2026-07-22). The autoscaler's README asks for the
    # minor that matches the control plane's, as it simulates that version's scheduler (cluster-autoscaler/README.md, "Releases": "using
    # different versions of scheduler code can lead to subtle issues").
    "1.33": "v1.33.6",
    "1.34": "v1.34.5",
    "1.35": "v1.35.2",
    "1.36": "v1.36.1",
}
"""Cluster Autoscaler image per Kubernetes minor (a version in ``EKS_ADDONS`` without one here
fails a test)."""

# Shared storage (components/storage.py).
FSX_CSI_DRIVER = HelmChart(
    chart="aws-fsx-csi-driver",
    version="1.17.0",
    repo="https://kubernetes-sigs.github.io/aws-fsx-csi-driver",
)
"""FSx for Lustre CSI driver, Helm chart (kubernetes-sigs/aws-fsx-csi-driver). 1.17.0 is a published
release tag (``helm-chart-aws-fsx-csi-driver-1.17.0``); PR #491 (Apr 2026) set the chart's appVersion
to driver 1.9.0 over chart 1.16.0, so 1.17.0 should deploy driver v1.9.0 -- inferred from the PR,
not read from the released Chart.yaml: check ``helm show chart`` when bumping. The driver needs
Kubernetes >= 1.20 (its install guide), so one pin serves every version in EKS_ADDONS.

A Helm release, not the ``aws-fsx-csi-driver`` EKS add-on (which exists and takes Pod Identity):
no add-on build could be confirmed for each pinned Kubernetes version, and the release's values
(the GPU-taint toleration) are visible to the tests under mocks (docs/design.md#verifying-without-aws)."""
FSX_LUSTRE_VERSION = "2.15"
"""Lustre version of the file system (``file_system_type_version``; valid for PERSISTENT_2)."""

# --------------------------------------------------------------------------- the training workload

ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"
"""etcd for torchrun's ``etcd`` / ``etcd-v2`` rendezvous. Those backends speak the etcd v2 API:
3.5.x is the last minor that serves it (with ``--enable-v2``); 3.6 removed it."""

TRAINING_OPERATOR_REF = "v1.9.4"
"""Kubeflow Training Operator v1 (PyTorchJob ``kubeflow.org/v1``): newest release of release-1.9.
Trainer v2 (TrainJob) has no elastic policy and no etcd rendezvous."""
TRAINING_OPERATOR_MANIFESTS = KUSTOMIZE_DIR / f"training-operator-{TRAINING_OPERATOR_REF}" / "manifests"
"""Its manifests at that tag (kubeflow/trainer, formerly kubeflow/training-operator), vendored:
``overlays/standalone`` is the upstream overlay; ``pulumi up`` needs no git or GitHub."""
TRAINING_OPERATOR_OVERLAYS: dict[str, PurePosixPath] = {
    "standalone": TRAINING_OPERATOR_MANIFESTS / "overlays" / "standalone",
    "system-nodes": KUSTOMIZE_DIR / "training-operator-system-nodes",
}
"""The overlay the stack applies: ``system-nodes`` (ours: the standalone overlay with the system
node selector) on a cluster this stack creates, ``standalone`` on an existing cluster."""
TRAINING_OPERATOR_IMAGE = "ghcr.io/kubeflow/training-v1/training-operator:v1-93c5489"
"""The operator image the v1.9.4 standalone overlay sets (its ``images:`` entry); a test checks."""

TRAINING_IMAGE_BUILD_ARGS: dict[str, str] = {
    # CUDA 13.0 userspace: needs the R580+ driver of the EKS AL2023 NVIDIA AMI. Ubuntu 24.04:
    # Python 3.12 (22.04's 3.10 is past end of life, October 2026). A dry-run resolve of
    # training/requirements.txt for Python 3.12 on manylinux x86_64 (2026-12-03) gives
    # transformers 5.24.0, tokenizers 0.23.3, huggingface_hub 2.4.0, datasets 5.2.0,
    # safetensors 0.8.0, torchao 0.17.0; torch is TORCH_VERSION from TORCH_INDEX_URL.
    "CUDA_IMAGE": "nvcr.io/nvidia/cuda:13.0.2-devel-ubuntu24.04",
    # What the build asserts python3 is (the base image's Ubuntu release decides it).
    "PYTHON_VERSION": "3.12",
    # Bundles libfabric (EFA provider) and aws-ofi-nccl under /opt/amazon/ofi-nccl.
    "EFA_INSTALLER_VERSION": "1.48.0",
    "TORCH_VERSION": "2.11.0",
    "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu130",
    "PIP_VERSION": "25.3",
}
"""Build arguments of ``training/Dockerfile``; they are also its ``ARG`` defaults (a test checks
that both agree), so ``docker build training/`` alone builds the same image."""
TRAINING_IMAGE_PLATFORM = "linux/amd64"
"""The GPU profiles are x86_64 (a Grace-based type, such as p6e-gb200, would need an arm64 image)."""
