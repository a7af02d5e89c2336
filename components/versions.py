"""Every external version fsdp-eks deploys, pinned exactly, in one place.

No ``latest``, no ``master``, no "most recent" look-ups: a ``pulumi up`` next year deploys what a
``pulumi up`` today deploys. Bump a pin here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True, kw_only=True)
class HelmChart:
    """A Helm chart at an exact version."""

    chart: str
    version: str
    repo: str


# Kubernetes minor versions the add-on pins below were chosen for. A stack asking for another
# version fails validation: add the version here with its add-on pins and its end of standard
# support to support it. Check each pin with
# `aws eks describe-addon-versions --kubernetes-version X --addon-name Y` when bumping.
EKS_ADDONS: dict[str, dict[str, str]] = {
    # 1.33 and 1.34: the AWS EKS user guide's per-version tables (coredns, kube-proxy,
    # vpc-cni); the others from pins used for these versions in public EKS repositories.
    "1.33": {
        # vpc-cni >= v1.18.4 is needed for `efa-only` network interfaces.
        "vpc-cni": "v1.20.1-eksbuild.3",
        "coredns": "v1.12.4-eksbuild.1",
        "kube-proxy": "v1.33.5-eksbuild.2",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
        "aws-ebs-csi-driver": "v1.53.0-eksbuild.1",
        "amazon-cloudwatch-observability": "v4.7.0-eksbuild.1",
    },
    "1.34": {
        "vpc-cni": "v1.21.1-eksbuild.1",
        "coredns": "v1.12.4-eksbuild.1",
        "kube-proxy": "v1.34.1-eksbuild.2",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
        "aws-ebs-csi-driver": "v1.53.0-eksbuild.1",
        "amazon-cloudwatch-observability": "v5.0.0-eksbuild.1",
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
    },
    # 1.36: vpc-cni, coredns, kube-proxy, pod identity agent and EBS CSI as a public Terraform
    # module pins them for an EKS 1.36 cluster (eks_version "1.36", 2026); CloudWatch: the
    # 1.35 pin, assumed to serve 1.36 too (the add-on's v5 builds span several Kubernetes
    # versions) -- all inferred, not read from the EKS add-on version tables.
    "1.36": {
        "vpc-cni": "v1.22.3-eksbuild.1",
        "coredns": "v1.14.3-eksbuild.3",
        "kube-proxy": "v1.36.0-eksbuild.13",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.3",
        "aws-ebs-csi-driver": "v1.63.1-eksbuild.1",
        "amazon-cloudwatch-observability": "v5.3.0-eksbuild.1",
    },
}
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


# Observability (components/observability.py).
KUBE_PROMETHEUS_STACK = HelmChart(
    chart="kube-prometheus-stack",
    version="91.2.1",
    repo="https://prometheus-community.github.io/helm-charts",
)
DCGM_EXPORTER = HelmChart(
    chart="dcgm-exporter",
    version="4.8.3",
    repo="https://nvidia.github.io/dcgm-exporter/helm-charts",
)
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
(the GPU-taint toleration) are visible to the tests under mocks (DESIGN.md section 4)."""
FSX_LUSTRE_VERSION = "2.15"
"""Lustre version of the file system (``file_system_type_version``; valid for PERSISTENT_2)."""

# --------------------------------------------------------------------------- the training workload

ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"
"""etcd for torchrun's ``etcd`` / ``etcd-v2`` rendezvous. Those backends speak the etcd v2 API:
3.5.x is the last minor that serves it (with ``--enable-v2``); 3.6 removed it."""

TRAINING_OPERATOR_REF = "v1.9.4"
"""Kubeflow Training Operator v1 (PyTorchJob ``kubeflow.org/v1``): newest release of release-1.9.
Trainer v2 (TrainJob) has no elastic policy and no etcd rendezvous."""
TRAINING_OPERATOR_MANIFESTS = (
    "https://github.com/kubeflow/trainer.git//manifests/overlays/standalone"
    f"?ref={TRAINING_OPERATOR_REF}"
)
"""Its standalone kustomize overlay at that tag, in kustomize's remote form (``repo//dir?ref=``):
the ``/tree/<ref>/`` form is not a kustomize remote and fails to load (pulumi-kubernetes #3358).
The repository was renamed from kubeflow/training-operator; the tag is the same."""

TRAINING_IMAGE_BUILD_ARGS: dict[str, str] = {
    # CUDA 13.0 userspace: needs the R580+ driver of the EKS AL2023 NVIDIA AMI.
    "CUDA_IMAGE": "nvcr.io/nvidia/cuda:13.0.2-devel-ubuntu22.04",
    # Bundles libfabric (EFA provider) and aws-ofi-nccl under /opt/amazon/ofi-nccl.
    "EFA_INSTALLER_VERSION": "1.48.0",
    "TORCH_VERSION": "2.11.0",
    "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu130",
    "PIP_VERSION": "25.3",
}
"""Build arguments of ``training/Dockerfile``; they are also its ``ARG`` defaults (a test checks
that both agree), so ``docker build training/`` alone builds the same image."""
TRAINING_IMAGE_PLATFORM = "linux/amd64"
"""p4de and p5 are x86_64."""
