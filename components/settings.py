"""The stack's settings: the typed, frozen objects every component receives, and their errors.

``components/settings_parser.py`` builds them from the stack file (the only reader of
``pulumi.Config``) and ``components/settings_rules/`` validates them; this module holds only the
types, so that every component (and the fit check, which is one of the rules) can import them
without a cycle.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from components import versions
from components.planning.hardware import HardwareProfile
from training import config as training_config
from training.config import JobConfig

NAMESPACE = "fsdp-eks"
SECRET_KEYS = ("hfToken", "grafanaAdminPassword", "alertSlackWebhook")
"""Top-level keys, each set with ``pulumi config set --secret`` (a secret inside a section would
turn the section secret or stay plain text). Preview refuses one stored in plain text, and one
written inside a section (components/settings_parser.py)."""

RdzvBackend = Literal["etcd", "etcd-v2", "c10d"]
SecondaryInterfaceType = Literal["efa", "efa-only"]
SupportType = Literal["STANDARD", "EXTENDED"]


# --------------------------------------------------------------------------- the settings types


@dataclass(frozen=True, kw_only=True)
class NodeGroupSize:
    """Sizes of a managed node group."""

    min_size: int
    """Fewest nodes the group scales to."""
    desired_size: int
    """Nodes the group starts with."""
    max_size: int
    """Most nodes the group scales to."""


MAX_AVAILABILITY_ZONES = 7
"""AZs the subnet plan of components/network.py has room for: seven private eighths of the VPC,
the eighth one for the public subnets."""


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    """The VPC: a new one over ``availability_zones``, or an existing one given by id."""

    vpc_cidr: str = "10.0.0.0/16"
    """CIDR of the new VPC; split into one public and one private subnet per AZ."""
    availability_zones: tuple[str, ...] = ()
    """AZs of the cluster (at least two); the GPU AZ must be one of them."""
    existing_vpc_id: str | None = None
    """Use this VPC instead of creating one (then give the subnet ids too)."""
    existing_private_subnet_ids: tuple[str, ...] = ()
    """Private subnets of the existing VPC, for the nodes."""
    existing_public_subnet_ids: tuple[str, ...] = ()
    """Public subnets of the existing VPC, for load balancers."""
    existing_gpu_subnet_ids: tuple[str, ...] = ()
    """Private subnets of the existing VPC that lie in the GPU AZ."""


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """The EKS cluster and its system node group."""

    kubernetes_version: str = versions.DEFAULT_KUBERNETES_VERSION
    """Kubernetes minor version; one of ``versions.SUPPORTED_KUBERNETES_VERSIONS``."""
    existing_cluster_name: str | None = None
    """Deploy the in-cluster layers onto this existing EKS cluster instead of creating one."""
    system_instance_type: str = "m6i.2xlarge"
    """Instance type of the CPU node group that runs etcd, the operator and monitoring."""
    system_nodes: NodeGroupSize = NodeGroupSize(min_size=2, desired_size=2, max_size=4)
    """Sizes of the system node group."""
    public_access_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    """CIDRs allowed to reach the public Kubernetes API endpoint."""
    endpoint_public_access: bool = True
    """Serve the Kubernetes API on a public endpoint (limited to ``public_access_cidrs``); false: the
    private endpoint only, reachable from inside the VPC (README, "Security")."""
    admin_role_arns: tuple[str, ...] = ()
    """IAM roles given cluster-admin (EKS access entries, ``AmazonEKSClusterAdminPolicy``)."""
    viewer_role_arns: tuple[str, ...] = ()
    """IAM roles given read-only access to the cluster (EKS access entries, ``AmazonEKSViewPolicy``)."""
    support_type: SupportType = "STANDARD"
    """EKS upgrade policy at the end of standard support: ``STANDARD`` (EKS upgrades the cluster)
    or ``EXTENDED`` (stays, at about 6x the control-plane price). pulumi-eks defaults to EXTENDED."""
    log_retention_days: int = 30
    """Days CloudWatch keeps the control-plane logs (``/aws/eks/<cluster>/cluster``) and Container
    Insights' log groups; 0 keeps them forever."""
    audit_log: bool = False
    """Also send the control plane's ``audit`` log to CloudWatch: every API request, the largest
    of its streams (billed per GB ingested). ``api`` and ``authenticator`` are always on."""


@dataclass(frozen=True, kw_only=True)
class GpuNodeSettings:
    """The GPU managed node group and the capacity it runs on."""

    availability_zone: str = ""
    """The one AZ of the GPU nodes: the capacity reservation's AZ."""
    min_size: int = 0
    """Fewest GPU nodes."""
    desired_size: int = 2
    """GPU nodes to start with; with the autoscaler on (``scale_down_delay_minutes``) it sizes the
    group from then on, and this is read only when the group is created (capacity blocks: created
    at 0, the autoscaler adds nodes once the block is active)."""
    max_size: int = 2
    """Most GPU nodes."""
    capacity_reservation_id: str | None = None
    """On-Demand Capacity Reservation (``cr-...``) or capacity block id to launch into."""
    capacity_block: bool = False
    """The reservation is an EC2 capacity block for ML (market type ``capacity-block``)."""
    root_volume_gib: int = 512
    """Root EBS volume; container images of CUDA stacks are large."""
    secondary_interface_type: SecondaryInterfaceType = "efa-only"
    """Interface type of network cards 1..N: ``efa-only`` saves IPs (VPC CNI >= 1.18.4)."""
    scale_down_delay_minutes: int = 10
    """Minutes a GPU node stays after its last GPU pod ends, before the Cluster Autoscaler removes
    it (``--scale-down-unneeded-time``); pending GPU pods bring nodes back. 0: no autoscaler, the
    group keeps ``desired_size`` until it is scaled by hand."""
    auto_repair: bool = False
    """EKS node auto repair: replace (or reboot) a GPU node that the node monitoring agent or
    the kubelet reports unhealthy (GPU Xid/NVLink errors, EFA, kernel, disk, NotReady). Off by
    default: the agent's DCGM condition latches (a host-engine outage of a minute, a dcgm-server
    restart, leaves ``AcceleratedHardwareReady=False`` until the agent's pod restarts:
    aws/eks-node-monitoring-agent #266, fix #275 unreleased), and a repair then terminates a
    healthy GPU node, whose on-demand replacement may find no capacity. The alert
    ``GpuNodeAcceleratedHardwareNotReady`` pages a person instead."""

    placement_group_name: str | None = None
    """An existing placement group to launch into: the one an On-Demand Capacity Reservation was
    made in (a reservation in a cluster placement group serves only launches into that group),
    or a cluster placement group of your own for on-demand nodes."""

    @property
    def autoscaling(self) -> bool:
        """The Cluster Autoscaler sizes the group (``scale_down_delay_minutes`` above 0)."""
        return self.scale_down_delay_minutes > 0

    @property
    def placement_group(self) -> bool:
        """Create a cluster placement group of ours: only for plain on-demand capacity, and only
        when ``placement_group_name`` names none.

        With a reservation or capacity block, a placement group the reservation was not made in
        makes launches fail with InsufficientInstanceCapacity (eksctl #7949).
        """
        return self.capacity_reservation_id is None and self.placement_group_name is None


STACK_OWNED_TRAINING_FIELDS = ("checkpoint_dir", "output_dir", "cache_dir", "metrics_port",
                               "metrics_file", "node_check_gpus", "node_check_efa",
                               "node_check_min_shm_gib", "node_check_min_busbw_gbs",
                               "node_check_min_node_busbw_gbs")
"""Training flags the stack sets itself (where the pod's volumes and ports are, what the node
check must find: the pod's devices and the profile's thresholds); not stack keys."""

DATASET_DEFAULTS: dict[str, Any] = {
    "dataset": "knkarthick/samsum",
    "data_format": "fields",
    "prompt_field": "dialogue",
    "response_field": "summary",
    "prompt_template": "Summarize this dialog:\n{dialogue}\n---\nSummary:\n",
}
"""The seed's dataset: samsum (dialogue -> summary) with llama-recipes' prompt, the summary
trained on and the prompt masked (meta-llama/llama-recipes,
src/llama_recipes/datasets/samsum_dataset.py), from the hub's knkarthick/samsum: the original
``samsum`` / ``Samsung/samsum`` repo was a loading script, which ``datasets`` >= 3 no longer
runs, and it is gone from the hub (huggingface/datasets#7573, meta-llama/llama-cookbook#948);
knkarthick/samsum holds the same train/validation/test splits as plain data files, which
``datasets`` reads without running code, and its validation split is the job's. The stack
applies these only while ``job.dataset`` is not set: a stack file naming its own dataset gets
the package's defaults (format auto-detected) for the keys it does not give."""

TRAINING_DEFAULTS: dict[str, Any] = {
    "model": "meta-llama/Llama-2-7b-hf",
    "warmup_steps": 100,
    "activation_checkpointing": "full",
    "checkpoint_every": 200,
    **DATASET_DEFAULTS,
}
"""A production run's defaults where they differ from the training package's (whose own defaults
suit the tiny offline demo): a real model, a longer warm-up, every block recomputed (fits any
model the fit check accepts), a checkpoint every 200 steps, the seed's samsum data."""


def training_defaults(given: Collection[str]) -> dict[str, Any]:
    """The stack's training defaults for a stack file that gives the training fields ``given``
    (snake_case): without the samsum mapping when it names its own dataset."""
    if "dataset" not in given:
        return dict(TRAINING_DEFAULTS)
    return {k: v for k, v in TRAINING_DEFAULTS.items() if k not in DATASET_DEFAULTS}


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """The Kubeflow PyTorchJob: where and how it runs, and the fine-tune it runs.

    The fine-tune's own settings (``training``) are the training package's ``JobConfig``: every
    field of ``training/config.py`` is a ``job.<camelCase>`` key of the stack file, validated by
    the package's own rules at preview and passed to the pod as the package's flags.
    """

    training: JobConfig = field(default_factory=lambda: training_config.from_fields(training_defaults(())))
    """The fine-tune: the training package's config (stack keys ``job.model``, ``job.seqLen`` ...)."""
    model_parameters: float | None = None
    """Parameters in billions, for models the GPU-memory fit check does not know."""
    nodes: int = 2
    """GPU nodes the job runs on (also the rendezvous size)."""
    gpus_per_node: int | None = None
    """GPUs per node; default: all GPUs of the profile."""
    efa_per_node: int | None = None
    """EFA devices per node; default: all of the profile's EFA interfaces."""
    rdzv_backend: RdzvBackend = "etcd"
    """torchrun rendezvous: ``etcd`` (the in-cluster etcd) or ``c10d`` (no etcd)."""
    min_nodes: int | None = None
    """Elastic lower bound; default: ``nodes`` (elastic only when asked)."""
    max_nodes: int | None = None
    """Elastic upper bound; default: ``nodes``."""
    max_restarts: int = 3
    """Restarts of the worker group before the job fails."""
    namespace: str = "training"
    """Kubernetes namespace of the job, its Secret and etcd."""


MONITORING_NAMESPACE = "monitoring"
"""The namespace of the metrics stack and its parts (components/observability/); a name the
job's namespace may not take while observability is on."""


@dataclass(frozen=True, kw_only=True)
class ObservabilitySettings:
    """Prometheus, Grafana, DCGM exporter and the optional extras."""

    enabled: bool = True
    """Deploy kube-prometheus-stack, dcgm-exporter, dashboard and alerts."""
    prometheus_retention: str = "15d"
    """How long Prometheus keeps samples (Prometheus duration)."""
    prometheus_storage_gib: int = 100
    """Size of Prometheus' persistent volume (EBS gp3)."""
    cloudwatch_container_insights: bool = False
    """Also install the amazon-cloudwatch-observability add-on (its own DCGM exporter stays off)."""
    debug_tools: bool = False
    """Run an htop/nvtop DaemonSet on the GPU nodes."""
    alert_sns_topic_arn: str | None = None
    """Send the GPU and training alerts to this SNS topic (Alertmanager publishes through EKS Pod
    Identity, ``sns:Publish`` on this topic only). The Slack webhook is the secret ``alertSlackWebhook``."""


FSX_THROUGHPUTS_PER_TIB = (125, 250, 500, 1000)
"""MB/s per TiB that FSx for Lustre PERSISTENT_2 (SSD) offers (FSx API ``PerUnitStorageThroughput``)."""


@dataclass(frozen=True, kw_only=True)
class StorageSettings:
    """Storage every node of the job shares: where distributed checkpoints and the exported model go.

    torch.distributed.checkpoint writes each rank's shards to its own node; only a directory that
    every node mounts holds a whole checkpoint. Without one the job keeps today's node-local NVMe.
    """

    fsx: bool = False
    """Create an FSx for Lustre file system (PERSISTENT_2, in the GPU AZ) and mount it in every worker."""
    fsx_storage_capacity_gib: int = 1200
    """Its size: 1200, 2400 or a multiple of 2400 GiB (PERSISTENT_2 SSD)."""
    fsx_throughput_per_tib: int = 250
    """Its throughput per TiB of storage, MB/s: 125, 250, 500 or 1000."""
    existing_claim_name: str | None = None
    """Instead of ``fsx``: a ReadWriteMany PersistentVolumeClaim that already exists in
    ``job.namespace`` (for an existing cluster); its file system must let root chown a directory."""

    @property
    def shared(self) -> bool:
        """Every node of the job mounts the same file system."""
        return self.fsx or self.existing_claim_name is not None


@dataclass(frozen=True, kw_only=True)
class Secrets:
    """Secret inputs; Pulumi secrets end to end, never plain text."""

    hf_token: Any = None
    """``pulumi.Output[str]`` of the Hugging Face token, or None."""
    grafana_admin_password: Any = None
    """``pulumi.Output[str]`` of Grafana's admin password, or None."""
    alert_slack_webhook: Any = None
    """``pulumi.Output[str]`` of the Slack incoming-webhook URL the alerts go to, or None."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the components need, parsed and validated."""

    project: str
    stack: str
    region: str
    profile_name: str
    profile: HardwareProfile
    network: NetworkSettings
    cluster: ClusterSettings
    gpu_nodes: GpuNodeSettings
    job: JobSettings
    observability: ObservabilitySettings
    storage: StorageSettings = field(default_factory=StorageSettings)
    secrets: Secrets = field(default_factory=Secrets)

    @property
    def name(self) -> str:
        """Prefix of every physical name: ``<project>-<stack>``."""
        return f"{self.project}-{self.stack}"

    @property
    def creates_cluster(self) -> bool:
        """False when the stack deploys onto an existing cluster."""
        return self.cluster.existing_cluster_name is None


# Structured keys of the stack file and the dataclass each one parses into.
SECTIONS: dict[str, type] = {
    "network": NetworkSettings,
    "cluster": ClusterSettings,
    "gpuNodes": GpuNodeSettings,
    "job": JobSettings,
    "observability": ObservabilitySettings,
    "storage": StorageSettings,
}
SCALAR_KEYS = ("profile",)


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the stack configuration: the key, the value found there, the fix."""

    key: str
    value: Any
    fix: str

    def __str__(self) -> str:
        # A key in parentheses is not a config key (the stack's name): no namespace before it.
        key = self.key if self.key.startswith("(") else f"{NAMESPACE}:{self.key}"
        return f"{key} = {self.value!r}: {self.fix}"


class SettingsError(ValueError):
    """Every problem of a stack configuration, in one message."""

    def __init__(self, stack: str, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"Pulumi.{stack}.yaml has {len(problems)} configuration problem(s); "
            f"nothing was created:\n{lines}"
        )


def job_node_bounds(job: JobSettings) -> tuple[int, int]:
    """Elastic bounds of the job: min = max = nodes unless asked otherwise (0 is asked: refused)."""
    return (job.nodes if job.min_nodes is None else job.min_nodes,
            job.nodes if job.max_nodes is None else job.max_nodes)


def gpus_per_node(job: JobSettings, profile: HardwareProfile) -> int:
    """GPUs each worker takes: ``job.gpusPerNode``, or every GPU of the instance."""
    return job.gpus_per_node or profile.gpus
