"""The one function that wires the components into a stack. Nothing runs at import."""

from __future__ import annotations

from enum import StrEnum

import pulumi

from components.cluster import (
    EksCluster,
    EksClusterArgs,
    ExistingCluster,
    ExistingClusterArgs,
    KubernetesCluster,
)
from components.cluster_autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from components.device_plugins import DevicePlugins, DevicePluginsArgs
from components.gpu_nodes import GpuNodeGroup, GpuNodeGroupArgs
from components.network import Network, NetworkArgs
from components.observability import EksAddonTarget, Observability, ObservabilityArgs
from components.planning.forecast import forecast, forecast_line, idle_tail_line
from components.planning.memory_fit import model_shape
from components.preflight import preflight
from components.registry import TrainingImage, TrainingImageArgs
from components.settings import Settings, SettingsError, gpus_per_node
from components.settings_parser import load_settings
from components.storage import SharedClaim, SharedStorage, SharedStorageArgs
from components.training_job import (
    JOB_MANIFEST_OUTPUT,
    NODE_CHECK_MANIFEST_OUTPUT,
    TrainingJob,
    TrainingJobArgs,
)
from components.training_operator import TrainingOperator, TrainingOperatorArgs
from training import config as training_config


class Export(StrEnum):
    """The stack's outputs (``pulumi stack output <name>``), by the names the tests use too."""

    CLUSTER_NAME = "cluster_name"
    KUBECONFIG = "kubeconfig"
    GPU_NODES_COMMAND = "gpu_nodes_command"
    GPU_NODE_GROUP = "gpu_node_group"
    GPU_SCALE_TO_ZERO_COMMAND = "gpu_scale_to_zero_command"
    FSX_FILE_SYSTEM_ID = "fsx_file_system_id"
    GRAFANA_COMMAND = "grafana_command"
    JOB_NAME = "job_name"
    IMAGE_REF = "image_ref"
    JOB_STATUS_COMMAND = "job_status_command"
    JOB_LOGS_COMMAND = "job_logs_command"
    JOB_DELETE_COMMAND = "job_delete_command"
    JOB_MANIFEST = JOB_MANIFEST_OUTPUT
    JOB_RERUN_COMMAND = "job_rerun_command"
    NODE_CHECK_MANIFEST = NODE_CHECK_MANIFEST_OUTPUT
    NODE_CHECK_COMMAND = "node_check_command"


def gpu_nodes_command(profile_instance_type: str) -> str:
    """kubectl that lists the GPU nodes with what they can schedule."""
    return (
        f"kubectl get nodes -l node.kubernetes.io/instance-type={profile_instance_type} "
        "-o custom-columns='NODE:.metadata.name,"
        "GPU:.status.allocatable.nvidia\\.com/gpu,"
        "EFA:.status.allocatable.vpc\\.amazonaws\\.com/efa'"
    )


def preview_line(settings: Settings) -> str:
    """The forecast of the stack's job (none for a model the fit check does not know) and what
    its GPU nodes cost once it ends."""
    job, profile = settings.job, settings.profile
    g = settings.gpu_nodes
    tail = idle_tail_line(profile.usd_per_hour, job.nodes,
                          g.scale_down_delay_minutes if settings.creates_cluster else None,
                          reservation=g.capacity_reservation_id is not None)
    t = job.training
    shape = None if t.model.model == training_config.TINY_MODEL else model_shape(t.model.model, job.model_parameters)
    if shape is None:
        return tail
    f = forecast(shape, t, profile, job.nodes, gpus_per_node(job, profile))
    return f"{forecast_line(f, profile, job.nodes)}; {tail}"


def scale_to_zero_command(cluster_name: str, node_group: str, max_size: int, region: str) -> str:
    """The AWS CLI command that scales the GPU node group to zero nodes (the instances terminate).
    With the autoscaler off, the next ``pulumi up`` sets the stack file's sizes again: it refreshes
    first (Pulumi.yaml ``options.refresh: always``), so it sees the group's live sizes. With it on,
    ``pulumi up`` leaves the size to the autoscaler, which starts nodes for the next pending job."""
    return (f"aws eks update-nodegroup-config --cluster-name {cluster_name} --nodegroup-name {node_group} "
            f"--scaling-config minSize=0,maxSize={max_size},desiredSize=0 --region {region}")


def build_stack(settings: Settings) -> dict[Export, object]:
    """Check ``settings`` against the account (``preflight``: zones, offerings, GPU quota, the
    deploying role, add-on pins), then create every component and return the stack outputs: the
    cluster (new or existing, with its GPU nodes and shared storage), the device plugins,
    observability, then image, operator, job.

    Ordering: every in-cluster layer waits for the nodes its pods need (``cluster.ready``: the
    system nodes, CoreDNS, the Pod Identity agent; the device plugins also for the GPU nodes)."""
    preflight(settings)
    pulumi.log.info(preview_line(settings))  # time and money, before anything is created
    outputs: dict[Export, object] = {}
    if settings.creates_cluster:
        cluster, shared, gpu_nodes = _new_cluster(settings, outputs)
    else:
        cluster, shared, gpu_nodes = _existing_cluster(settings), _existing_claim(settings), []
    DevicePlugins(
        "device-plugins",
        DevicePluginsArgs(provider=cluster.provider, gpu_instance_type=settings.profile.instance_type,
                          region=settings.region, ready=[*cluster.ready, *gpu_nodes]),
    )
    # Before the training job: its PodMonitor needs the monitoring CRDs (depends_on=[observability]).
    observability = _observability(settings, cluster, outputs)
    outputs[Export.CLUSTER_NAME] = cluster.cluster_name
    outputs[Export.KUBECONFIG] = cluster.kubeconfig
    outputs[Export.GPU_NODES_COMMAND] = gpu_nodes_command(settings.profile.instance_type)
    outputs.update(_training(settings, cluster, monitoring=[observability] if observability else None, shared=shared))
    return outputs


def _existing_claim(settings: Settings) -> SharedClaim | None:
    """Where the job's checkpoints go: a claim every worker mounts, or (None) each node's NVMe."""
    name = settings.storage.existing_claim_name
    return None if name is None else SharedClaim(name=name)


def _existing_cluster(settings: Settings) -> KubernetesCluster:
    return ExistingCluster(
        "cluster", ExistingClusterArgs(name=settings.cluster.existing_cluster_name, region=settings.region)
    )


def _new_cluster(
    settings: Settings, outputs: dict[Export, object]
) -> tuple[KubernetesCluster, SharedClaim | None, list[pulumi.Resource]]:
    """Network, EKS cluster, GPU node group and (with FSx) the shared storage; adds their outputs.
    Returns the cluster, the checkpoint claim (FSx's, else an existing one, else None) and the GPU
    node group (what the device plugins wait for)."""
    network = Network(
        "network",
        NetworkArgs(
            name=settings.name,
            settings=settings.network,
            gpu_availability_zone=settings.gpu_nodes.availability_zone,
            region=settings.region,
        ),
    )
    cluster = EksCluster(
        "cluster",
        EksClusterArgs(
            name=settings.name,
            settings=settings.cluster,
            vpc_id=network.vpc_id,
            private_subnet_ids=network.private_subnet_ids,
            public_subnet_ids=network.public_subnet_ids,
        ),
    )
    gpu = _gpu_nodes(settings, network, cluster, outputs)
    return cluster, _shared_storage(settings, network, cluster, outputs), [gpu.node_group]


def _gpu_nodes(
    settings: Settings, network: Network, cluster: EksCluster, outputs: dict[Export, object]
) -> GpuNodeGroup:
    """The GPU node group and (with ``gpuNodes.scaleDownDelayMinutes`` above 0) the autoscaler
    that sizes it; adds the group's name and its scale-to-zero command to outputs."""
    gpu = GpuNodeGroup(
        "gpu",
        GpuNodeGroupArgs(
            name=settings.name,
            cluster_name=cluster.cluster_name,
            profile=settings.profile,
            settings=settings.gpu_nodes,
            vpc_id=network.vpc_id,
            subnet_ids=network.gpu_subnet_ids,
            cluster_security_group_id=cluster.cluster_security_group_id,
            node_role_arn=cluster.node_role.arn,
            kubernetes_version=settings.cluster.kubernetes_version,
            lustre_client=settings.storage.fsx,
            # Not the whole cluster: the GPU nodes start beside the system nodes, not after
            # CoreDNS (which waits for the system nodes).
            can_join=cluster.nodes_can_join,
        ),
    )
    outputs[Export.GPU_NODE_GROUP] = gpu.node_group_name
    if settings.gpu_nodes.autoscaling:
        ClusterAutoscaler(
            "gpu-autoscaling",
            ClusterAutoscalerArgs(
                cluster_name=settings.name,
                region=settings.region,
                kubernetes_version=settings.cluster.kubernetes_version,
                scale_down_delay_minutes=settings.gpu_nodes.scale_down_delay_minutes,
                provider=cluster.provider,
                system_node_selector=cluster.system_node_selector,
                ready=[*cluster.ready, *gpu.autoscaling_tags],
            ),
        )
    # With the autoscaler off (gpuNodes.scaleDownDelayMinutes 0) idle GPU nodes bill by the hour
    # until this command (alert GpuNodesIdle); with it on, it stops them before the delay.
    outputs[Export.GPU_SCALE_TO_ZERO_COMMAND] = gpu.node_group_name.apply(
        lambda group: scale_to_zero_command(settings.name, group, settings.gpu_nodes.max_size, settings.region))
    return gpu


def _shared_storage(
    settings: Settings, network: Network, cluster: EksCluster, outputs: dict[Export, object]
) -> SharedClaim | None:
    """The checkpoint claim: FSx's (created here, its id added to outputs), else an existing one,
    else None (each node's NVMe)."""
    if not settings.storage.fsx:
        return _existing_claim(settings)
    storage = SharedStorage(
        "storage",
        SharedStorageArgs(
            name=settings.name,
            region=settings.region,
            settings=settings.storage,
            namespace=settings.job.namespace,
            vpc_id=network.vpc_id,
            gpu_subnet_ids=network.gpu_subnet_ids,
            cluster_security_group_id=cluster.cluster_security_group_id,
            provider=cluster.provider,
            ready=cluster.ready,
        ),
    )
    outputs[Export.FSX_FILE_SYSTEM_ID] = storage.file_system_id
    return storage.claim


def _observability(
    settings: Settings, cluster: KubernetesCluster, outputs: dict[Export, object]
) -> Observability | None:
    """The monitoring stack when enabled (None otherwise); adds the Grafana command to outputs."""
    if not settings.observability.enabled:
        return None
    observability = Observability(
        "observability",
        ObservabilityArgs(
            name=settings.name,
            settings=settings.observability,
            provider=cluster.provider,
            grafana_admin_password=settings.secrets.grafana_admin_password,
            alert_slack_webhook=settings.secrets.alert_slack_webhook,
            system_node_selector=cluster.system_node_selector,
            gpu_instance_type=settings.profile.instance_type,
            eks=(
                EksAddonTarget(cluster_name=cluster.cluster_name,
                               kubernetes_version=settings.cluster.kubernetes_version,
                               log_retention_days=settings.cluster.log_retention_days)
                if settings.creates_cluster
                else None
            ),
            dcgm_host_engine=cluster.dcgm_host_engine,
            ready=cluster.ready,
        ),
    )
    outputs[Export.GRAFANA_COMMAND] = observability.grafana_port_forward_command
    return observability


def _training(
    settings: Settings,
    cluster: KubernetesCluster,
    monitoring: list[pulumi.Resource] | None = None,
    shared: SharedClaim | None = None,
) -> dict[Export, object]:
    """The image, the Training Operator and the job; returns their outputs.

    ``monitoring``: the stack that installs the PodMonitor CRD (None: no PodMonitor);
    ``shared``: the claim for checkpoints every worker mounts (None: node-local NVMe)."""
    image = TrainingImage("training-image", TrainingImageArgs(name=settings.name))
    operator = TrainingOperator(
        "training-operator",
        TrainingOperatorArgs(provider=cluster.provider, system_node_selector=cluster.system_node_selector,
                             ready=cluster.ready),
    )
    job = TrainingJob(
        "training-job",
        TrainingJobArgs(
            job=settings.job,
            profile=settings.profile,
            image=image.ref,
            provider=cluster.provider,
            hf_token=settings.secrets.hf_token,
            system_node_selector=cluster.system_node_selector,
            operator=[operator],
            monitoring=monitoring,
            shared=shared,
            ready=cluster.ready,
        ),
    )
    return {
        Export.JOB_NAME: job.job_name,
        Export.IMAGE_REF: image.ref,
        Export.JOB_STATUS_COMMAND: job.status_command,
        Export.JOB_LOGS_COMMAND: job.logs_command,
        Export.JOB_DELETE_COMMAND: job.delete_command,
        Export.JOB_MANIFEST: job.manifest,
        Export.JOB_RERUN_COMMAND: job.rerun_command,
        Export.NODE_CHECK_MANIFEST: job.node_check_manifest,
        Export.NODE_CHECK_COMMAND: job.node_check_command,
    }


def main() -> None:
    """The program of ``pulumi up``: settings from the stack file, components, exports.

    A wrong configuration (``SettingsError``, raised before any resource) ends it as a
    ``pulumi.RunError``, whose message the language host logs alone; any other exception it logs
    as "Program failed with an unhandled exception" with the traceback
    (pulumi/pulumi, sdk/python/cmd/pulumi-language-python-exec).
    """
    try:
        outputs = build_stack(load_settings())
    except SettingsError as error:
        raise pulumi.RunError(str(error)) from None
    for key, value in outputs.items():
        pulumi.export(key, value)
