"""Every external version fsdp-eks deploys, pinned exactly, in one place.

No ``latest``, no ``master``, no "most recent" look-ups: a ``pulumi up`` next year deploys what a
``pulumi up`` today deploys. Bump a pin here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class HelmChart:
    """A Helm chart at an exact version."""

    chart: str
    version: str
    repo: str


# Kubernetes minor versions the add-on pins below were chosen for. A stack asking for another
# version fails validation: add the version here with its add-on pins to support it.
EKS_ADDONS: dict[str, dict[str, str]] = {
    # Sources: the AWS EKS user guide's per-version tables (coredns, kube-proxy, vpc-cni for
    # 1.33); the others from pins used for these versions in public EKS repositories. Check
    # with `aws eks describe-addon-versions --kubernetes-version X --addon-name Y` when bumping.
    # eks-node-monitoring-agent (the node health checks behind GPU-node auto repair): 1.33's
    # v1.4.0-eksbuild.2 beside kube-proxy v1.33.3 in a public EKS Terraform stack; 1.34's
    # v1.4.2-eksbuild.1 and 1.35's v1.6.2-eksbuild.1 in the public Terraform environment
    # file of the UK MoJ Analytical Platform's clusters at those versions. The agent reads node
    # logs and is not tied to a Kubernetes minor, but EKS lists its builds per version.
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
}
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = tuple(EKS_ADDONS)
DEFAULT_KUBERNETES_VERSION = "1.33"

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
