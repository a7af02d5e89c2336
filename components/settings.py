"""Stack configuration -> one frozen, validated ``Settings`` object.

This module is the only reader of ``pulumi.Config``. It parses every ``fsdp-eks:*`` key of the
stack file into typed, keyword-only dataclasses, rejects unknown keys, then runs every validation
rule and raises one ``SettingsError`` listing every problem at once: the key, the bad value and
the fix. It runs at preview, before anything is created.

The parsing half (``parse_settings``) is pure: tests call it with plain dictionaries.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from components import memory_fit, versions
from components.hardware import PROFILES, HardwareProfile

NAMESPACE = "fsdp-eks"
SECRET_KEYS = ("hfToken", "grafanaAdminPassword")

Sharding = Literal["FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD"]
ActivationCheckpointing = Literal["none", "full", "selective"]
RdzvBackend = Literal["etcd", "etcd-v2", "c10d"]
SecondaryInterfaceType = Literal["efa", "efa-only"]


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


@dataclass(frozen=True, kw_only=True)
class GpuNodeSettings:
    """The GPU managed node group and the capacity it runs on."""

    availability_zone: str = ""
    """The one AZ of the GPU nodes: the capacity reservation's AZ."""
    min_size: int = 0
    """Fewest GPU nodes."""
    desired_size: int = 2
    """GPU nodes to run (capacity blocks: changes only while the group is at 0)."""
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

    @property
    def placement_group(self) -> bool:
        """A cluster placement group only for plain on-demand capacity.

        With a reservation or capacity block, a placement group the reservation was not made in
        makes launches fail with InsufficientInstanceCapacity (eksctl #7949).
        """
        return self.capacity_reservation_id is None


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """The Kubeflow PyTorchJob and the fine-tune it runs."""

    model: str = "meta-llama/Llama-2-7b-hf"
    """Hugging Face model id or a path inside the container (FSx, NVMe)."""
    model_parameters: float | None = None
    """Parameters in billions, for models the GPU-memory fit check does not know."""
    dataset: str = ""
    """Hugging Face dataset name or a json/jsonl/parquet path; empty: the package's own."""
    nodes: int = 2
    """GPU nodes the job runs on (also the rendezvous size)."""
    gpus_per_node: int | None = None
    """GPUs per node; default: all GPUs of the profile."""
    efa_per_node: int | None = None
    """EFA devices per node; default: all of the profile's EFA interfaces."""
    epochs: int = 1
    """Passes over the dataset."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (for smoke runs)."""
    batch_size: int = 1
    """Sequences per GPU per micro-step."""
    grad_accum: int = 1
    """Micro-steps per optimizer step."""
    seq_len: int = 4096
    """Tokens per sequence after packing."""
    learning_rate: float = 2e-5
    """Peak learning rate of the warmup + cosine schedule."""
    warmup_steps: int = 100
    """Linear warmup steps."""
    sharding: Sharding = "FULL_SHARD"
    """FSDP strategy."""
    activation_checkpointing: ActivationCheckpointing = "full"
    """Recompute activations in backward: none, full (every block) or selective."""
    compile: bool = False
    """``torch.compile`` each decoder block."""
    rdzv_backend: RdzvBackend = "etcd"
    """torchrun rendezvous: ``etcd`` (the in-cluster etcd) or ``c10d`` (no etcd)."""
    min_nodes: int | None = None
    """Elastic lower bound; default: ``nodes`` (elastic only when asked)."""
    max_nodes: int | None = None
    """Elastic upper bound; default: ``nodes``."""
    max_restarts: int = 3
    """Restarts of the worker group before the job fails."""
    checkpoint_every: int = 200
    """Optimizer steps between distributed checkpoints."""
    namespace: str = "training"
    """Kubernetes namespace of the job, its Secret and etcd."""


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
    """One thing wrong with the stack configuration."""

    key: str
    value: Any
    fix: str

    def __str__(self) -> str:
        return f"{NAMESPACE}:{self.key} = {self.value!r}: {self.fix}"


class SettingsError(ValueError):
    """Every problem of a stack configuration, in one message."""

    def __init__(self, stack: str, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"Pulumi.{stack}.yaml has {len(problems)} configuration problem(s); "
            f"nothing was created:\n{lines}"
        )


# --------------------------------------------------------------------------- parsing


UNITS = {"gib": "GiB", "tib": "TiB"}
"""Units spelt as units in camelCase keys (``prometheusStorageGiB``, ``fsxThroughputPerTiB``)."""


def _snake(name: str) -> str:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    for unit in UNITS:  # "GiB" splits into "gi_b": join it back
        snake = re.sub(rf"{unit[:2]}_{unit[2:]}(?=_|$)", unit, snake)
    return snake


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(UNITS.get(part, part.title()) for part in rest)


def _coerce(value: Any, hint: Any, key: str, problems: list[Problem]) -> Any:
    """Check ``value`` against a type hint; return it converted, or None with a problem."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _coerce(value, options[0], key, problems)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            problems.append(Problem(key, value, f"use one of {', '.join(map(str, allowed))}"))
            return None
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            problems.append(Problem(key, value, "give a list of strings"))
            return ()
        return tuple(value)
    if dataclasses.is_dataclass(hint):
        return _parse_dataclass(value, hint, key, problems)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        problems.append(Problem(key, value, f"must be a {hint.__name__}"))
        return None
    return value


def _parse_dataclass(raw: Any, cls: type, key: str, problems: list[Problem]) -> Any:
    """Build ``cls`` from a camelCase mapping; unknown keys and wrong types become problems."""
    if not isinstance(raw, Mapping):
        problems.append(Problem(key, raw, f"must be an object with keys of {cls.__name__}"))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for raw_key, value in raw.items():
        name = _snake(raw_key)
        if name not in fields or _camel(name) != raw_key:  # exact spelling only
            known = ", ".join(_camel(f) for f in fields)
            problems.append(Problem(f"{key}.{raw_key}", value, f"unknown key; known: {known}"))
            continue
        coerced = _coerce(value, hints[name], f"{key}.{raw_key}", problems)
        if coerced is not None or value is None:
            kwargs[name] = coerced
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    for name in missing:
        problems.append(Problem(f"{key}.{_camel(name)}", None, "required"))
    return cls(**kwargs) if not missing else None


def parse_settings(
    raw: Mapping[str, Any],
    *,
    project: str,
    stack: str,
    region: str,
    secrets: Secrets | None = None,
) -> Settings:
    """Turn the ``fsdp-eks:*`` keys of a stack (without namespace, values parsed) into Settings.

    Raises ``SettingsError`` listing every problem found: parsing and validation both.
    """
    problems: list[Problem] = []
    for key in raw:
        if key not in SECTIONS and key not in SCALAR_KEYS and key not in SECRET_KEYS:
            known = ", ".join([*SCALAR_KEYS, *SECTIONS, *SECRET_KEYS])
            problems.append(Problem(key, raw[key], f"unknown key; known: {known}"))
    profile_name = raw.get("profile", "")
    profile = PROFILES.get(profile_name)
    if profile is None:
        problems.append(
            Problem("profile", profile_name, f"use one of {', '.join(PROFILES)} (components/hardware.py)")
        )
    sections = {
        key: _parse_dataclass(raw.get(key, {}), cls, key, problems)
        for key, cls in SECTIONS.items()
    }
    if profile is None or any(section is None for section in sections.values()):
        # The rules need a profile and every section; without them, report what parsing found.
        # (A value of the wrong type or an unknown key is left out, so the rules still run.)
        raise SettingsError(stack, problems)
    settings = Settings(
        project=project,
        stack=stack,
        region=region,
        profile_name=profile_name,
        profile=profile,
        network=sections["network"],
        cluster=sections["cluster"],
        gpu_nodes=sections["gpuNodes"],
        job=sections["job"],
        observability=sections["observability"],
        storage=sections["storage"],
        secrets=secrets or Secrets(),
    )
    for rule in RULES:
        problems.extend(rule(settings))
    if problems:
        raise SettingsError(stack, problems)
    return settings


# --------------------------------------------------------------------------- validation rules

Rule = Callable[[Settings], list[Problem]]


def _network_rules(s: Settings) -> list[Problem]:
    if not s.creates_cluster:
        return []
    n = s.network
    problems = []
    if n.existing_vpc_id is None:
        try:
            net = ipaddress.ip_network(n.vpc_cidr)
            if net.prefixlen > 20:
                problems.append(
                    Problem("network.vpcCidr", n.vpc_cidr, "use a /20 or larger block (e.g. 10.0.0.0/16): "
                            "pods take VPC IPs")
                )
        except ValueError:
            problems.append(Problem("network.vpcCidr", n.vpc_cidr, "give an IPv4 CIDR such as 10.0.0.0/16"))
        if len(n.availability_zones) < 2:
            problems.append(
                Problem("network.availabilityZones", list(n.availability_zones),
                        "list at least two AZs of the region (EKS requires subnets in two AZs)")
            )
    else:
        for key, ids in (
            ("network.existingPrivateSubnetIds", n.existing_private_subnet_ids),
            ("network.existingGpuSubnetIds", n.existing_gpu_subnet_ids),
        ):
            if not ids:
                problems.append(Problem(key, [], "with network.existingVpcId, list the subnet ids"))
    return problems


def _cluster_rules(s: Settings) -> list[Problem]:
    c = s.cluster
    problems = []
    if c.kubernetes_version not in versions.SUPPORTED_KUBERNETES_VERSIONS:
        problems.append(
            Problem("cluster.kubernetesVersion", c.kubernetes_version,
                    f"use one of {', '.join(versions.SUPPORTED_KUBERNETES_VERSIONS)} "
                    "(add-on versions are pinned per Kubernetes version in components/versions.py)")
        )
    problems += _size_rules("cluster.systemNodes", c.system_nodes.min_size,
                            c.system_nodes.desired_size, c.system_nodes.max_size)
    for cidr in c.public_access_cidrs:
        if not _is_cidr(cidr):
            problems.append(Problem("cluster.publicAccessCidrs", cidr, "give IPv4 CIDRs such as 203.0.113.0/24"))
    return problems


def _gpu_node_rules(s: Settings) -> list[Problem]:
    if not s.creates_cluster:
        return []
    g = s.gpu_nodes
    problems = _size_rules("gpuNodes", g.min_size, g.desired_size, g.max_size)
    azs = s.network.availability_zones
    if s.network.existing_vpc_id is None and g.availability_zone not in azs:
        problems.append(
            Problem("gpuNodes.availabilityZone", g.availability_zone,
                    f"use the reservation's AZ and list it in network.availabilityZones ({', '.join(azs)})")
        )
    rid = g.capacity_reservation_id
    if rid is not None and not re.fullmatch(r"cr-[0-9a-f]{8,17}", rid):
        problems.append(
            Problem("gpuNodes.capacityReservationId", rid, "give the reservation id, cr- followed by hex digits")
        )
    if s.profile_name == "p4de" and rid is None:
        problems.append(
            Problem("gpuNodes.capacityReservationId", None,
                    "p4de.24xlarge is only sold through capacity reservations: set the ODCR id "
                    "(pulumi config set --path gpuNodes.capacityReservationId cr-...)")
        )
    if g.capacity_block and rid is None:
        problems.append(
            Problem("gpuNodes.capacityReservationId", None,
                    "gpuNodes.capacityBlock needs the capacity block's reservation id (cr-...)")
        )
    if g.root_volume_gib < 200:
        problems.append(Problem("gpuNodes.rootVolumeGiB", g.root_volume_gib,
                                "use at least 200: CUDA training images are tens of GB"))
    return problems


def _job_rules(s: Settings) -> list[Problem]:
    j, p = s.job, s.profile
    problems = []
    for key, value in (("job.nodes", j.nodes), ("job.epochs", j.epochs), ("job.batchSize", j.batch_size),
                       ("job.gradAccum", j.grad_accum), ("job.seqLen", j.seq_len),
                       ("job.checkpointEvery", j.checkpoint_every)):
        if value < 1:
            problems.append(Problem(key, value, "must be at least 1"))
    if j.max_restarts < 0:
        problems.append(Problem("job.maxRestarts", j.max_restarts, "must be 0 or more"))
    if not 0 < j.learning_rate < 1:
        problems.append(Problem("job.learningRate", j.learning_rate, "use a value in (0, 1), e.g. 2e-5"))
    if j.model_parameters is not None and j.model_parameters <= 0:
        problems.append(Problem("job.modelParameters", j.model_parameters,
                                "give the parameter count in billions, e.g. 8.0"))
    if j.gpus_per_node is not None and not 1 <= j.gpus_per_node <= p.gpus:
        problems.append(Problem("job.gpusPerNode", j.gpus_per_node, f"use 1..{p.gpus} ({p.instance_type})"))
    if j.efa_per_node is not None and not 0 <= j.efa_per_node <= p.efa_interfaces:
        problems.append(Problem("job.efaPerNode", j.efa_per_node,
                                f"use 0..{p.efa_interfaces} ({p.instance_type}); leave unset for all"))
    lo, hi = job_node_bounds(j)
    if not 1 <= lo <= j.nodes <= hi:
        problems.append(Problem("job.minNodes/maxNodes", [lo, hi],
                                f"need minNodes <= nodes ({j.nodes}) <= maxNodes"))
    if s.creates_cluster and hi > s.gpu_nodes.max_size:
        problems.append(Problem("job.maxNodes", hi, f"at most gpuNodes.maxSize ({s.gpu_nodes.max_size})"))
    if s.creates_cluster and j.nodes > s.gpu_nodes.desired_size:
        problems.append(Problem("job.nodes", j.nodes,
                                f"raise gpuNodes.desiredSize ({s.gpu_nodes.desired_size}) or lower job.nodes: "
                                "the job would wait for nodes that never come"))
    if j.sharding == "HYBRID_SHARD" and j.nodes < 2:
        problems.append(Problem("job.sharding", j.sharding, "HYBRID_SHARD replicates across nodes: use "
                                "FULL_SHARD on one node, or job.nodes >= 2"))
    return problems


def _secret_rules(s: Settings) -> list[Problem]:
    problems = []
    if s.job.model.startswith("meta-llama/") and s.secrets.hf_token is None:
        problems.append(Problem("hfToken", None, f"{s.job.model} is gated: "
                                "pulumi config set --secret hfToken hf_..."))
    if s.observability.enabled and s.secrets.grafana_admin_password is None:
        problems.append(Problem("grafanaAdminPassword", None,
                                "pulumi config set --secret grafanaAdminPassword <a strong password>"))
    return problems


PROMETHEUS_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
"""A Prometheus duration such as ``15d`` or ``1w3d``."""


def _observability_rules(s: Settings) -> list[Problem]:
    o = s.observability
    if not o.enabled:
        return []
    problems = []
    if not PROMETHEUS_DURATION.fullmatch(o.prometheus_retention) or not re.search(r"[1-9]", o.prometheus_retention):
        problems.append(Problem("observability.prometheusRetention", o.prometheus_retention,
                                "give a Prometheus duration such as 15d, 12h or 1w"))
    if o.prometheus_storage_gib < 10:
        problems.append(Problem("observability.prometheusStorageGiB", o.prometheus_storage_gib,
                                "use at least 10 (EBS gp3, GiB)"))
    if o.cloudwatch_container_insights and not s.creates_cluster:
        problems.append(Problem("observability.cloudwatchContainerInsights", True,
                                "only for a cluster this stack creates: on an existing cluster install the "
                                "amazon-cloudwatch-observability add-on yourself, with "
                                "accelerated_compute_metrics false (one DCGM exporter per GPU node)"))
    return problems


def fsx_capacity_valid(gib: int) -> bool:
    """FSx for Lustre PERSISTENT_2 on SSD: 1200 GiB, 2400 GiB, or increments of 2400 GiB.

    (FSx API CreateFileSystem ``StorageCapacity``; 3600 is not a valid size.)
    """
    return gib == 1200 or (gib >= 2400 and gib % 2400 == 0)


def _storage_rules(s: Settings) -> list[Problem]:
    st = s.storage
    problems = []
    if st.fsx and st.existing_claim_name is not None:
        problems.append(Problem("storage.existingClaimName", st.existing_claim_name,
                                "use one of storage.fsx (a new FSx for Lustre file system) and "
                                "storage.existingClaimName (a claim you already have)"))
    if st.fsx and not s.creates_cluster:
        problems.append(Problem("storage.fsx", True,
                                "only for a cluster this stack creates (the file system needs its GPU subnet and "
                                "security groups): on an existing cluster create a ReadWriteMany "
                                f"PersistentVolumeClaim in {s.job.namespace} and set storage.existingClaimName"))
    if st.fsx and not fsx_capacity_valid(st.fsx_storage_capacity_gib):
        problems.append(Problem("storage.fsxStorageCapacityGiB", st.fsx_storage_capacity_gib,
                                "FSx for Lustre PERSISTENT_2 takes 1200, 2400 or a multiple of 2400 GiB"))
    if st.fsx and st.fsx_throughput_per_tib not in FSX_THROUGHPUTS_PER_TIB:
        problems.append(Problem("storage.fsxThroughputPerTiB", st.fsx_throughput_per_tib,
                                f"use one of {', '.join(map(str, FSX_THROUGHPUTS_PER_TIB))} (MB/s per TiB, PERSISTENT_2)"))
    if st.existing_claim_name is not None and not DNS_1123_LABEL.fullmatch(st.existing_claim_name):
        problems.append(Problem("storage.existingClaimName", st.existing_claim_name,
                                "give the name of a PersistentVolumeClaim (lower-case letters, digits and '-')"))
    most = max(s.job.nodes, job_node_bounds(s.job)[1])
    if most > 1 and not st.shared:
        problems.append(Problem("storage.fsx", st.fsx,
                                f"a job on {most} nodes needs storage every node shares: each node writes its "
                                "checkpoint shards to its own NVMe, so a checkpoint would be scattered across "
                                "nodes and a restarted or resumed run could not load it. Set storage.fsx: true "
                                "(storage.existingClaimName on an existing cluster), or run on one node (job.nodes: 1)"))
    return problems


DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A Kubernetes object name such as a PersistentVolumeClaim's (RFC 1123 label)."""


def _size_rules(key: str, lo: int, desired: int, hi: int) -> list[Problem]:
    if 0 <= lo <= desired <= hi and hi >= 1:
        return []
    return [Problem(f"{key}.minSize/desiredSize/maxSize", [lo, desired, hi],
                    "need 0 <= minSize <= desiredSize <= maxSize and maxSize >= 1")]


def _is_cidr(text: str) -> bool:
    try:
        ipaddress.IPv4Network(text)
    except ValueError:
        return False
    return True


def job_node_bounds(job: JobSettings) -> tuple[int, int]:
    """Elastic bounds of the job: min = max = nodes unless asked otherwise."""
    return (job.min_nodes or job.nodes, job.max_nodes or job.nodes)


def gpus_per_node(job: JobSettings, profile: HardwareProfile) -> int:
    """GPUs each worker takes: ``job.gpusPerNode``, or every GPU of the instance."""
    return job.gpus_per_node or profile.gpus


RULES: list[Rule] = [_network_rules, _cluster_rules, _gpu_node_rules, _job_rules, _secret_rules,
                     memory_fit.fit_problems, _observability_rules, _storage_rules]


# --------------------------------------------------------------------------- the Pulumi reader


def load_settings() -> Settings:
    """Read the current stack's configuration through ``pulumi.Config``: the only reader."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    config = pulumi.Config(NAMESPACE)
    prefix = f"{NAMESPACE}:"
    keys = {*runtime_config.CONFIG.get(), *runtime_config.get_config_env()}
    raw: dict[str, Any] = {}
    for full_key in sorted(keys):
        if not full_key.startswith(prefix) or full_key[len(prefix):] in SECRET_KEYS:
            continue
        key = full_key[len(prefix):]
        text = config.get(key)
        try:
            raw[key] = json.loads(text)
        except (TypeError, json.JSONDecodeError):
            raw[key] = text
    secrets = Secrets(
        hf_token=config.get_secret("hfToken"),
        grafana_admin_password=config.get_secret("grafanaAdminPassword"),
    )
    region = pulumi.Config("aws").get("region") or ""
    return parse_settings(
        raw, project=pulumi.get_project(), stack=pulumi.get_stack(), region=region, secrets=secrets
    )
