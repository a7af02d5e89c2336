"""The validation rules of the stack's settings: each takes ``Settings`` and returns its problems.

``components/settings_parser.py`` runs every rule of ``RULES`` and reports all problems at once.
The job's training keys are not checked here: the training package's own rules check them
(``training/config.py``), so there is one rule for each, where the pod reads it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from components import versions
from components.planning import memory_fit
from components.planning.hardware import HardwareProfile
from components.settings import (
    FSX_THROUGHPUTS_PER_TIB,
    JobSettings,
    Problem,
    Settings,
    gpus_per_node,
    job_node_bounds,
)
from training import config as training_config
from training.shapes import ModelShape, trained_context

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
    if c.log_retention_days not in LOG_RETENTION_DAYS:
        problems.append(Problem("cluster.logRetentionDays", c.log_retention_days,
                                f"use one of {', '.join(map(str, LOG_RETENTION_DAYS))} (CloudWatch Logs "
                                "retention; 0 keeps the logs forever)"))
    return problems + _cluster_access_rules(s)


IAM_ROLE_ARN = re.compile(r"arn:aws(-[a-z]+)*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
"""An IAM role ARN (path allowed): what an EKS access entry's principal must be here."""
OPEN_TO_THE_INTERNET = "0.0.0.0/0"


def _cluster_access_rules(s: Settings) -> list[Problem]:
    """Who reaches the cluster: access-entry roles, the endpoint (only on a cluster this stack creates)."""
    c = s.cluster
    problems = []
    lists = (("cluster.adminRoleArns", c.admin_role_arns), ("cluster.viewerRoleArns", c.viewer_role_arns))
    for key, arns in lists:
        for arn in arns:
            if not IAM_ROLE_ARN.fullmatch(arn):
                problems.append(Problem(key, arn, "give IAM role ARNs such as arn:aws:iam::123456789012:role/ml-admins"))
    for arn in sorted(set(c.admin_role_arns) & set(c.viewer_role_arns)):
        problems.append(Problem("cluster.viewerRoleArns", arn, "already in cluster.adminRoleArns: list a role once"))
    if not s.creates_cluster:
        changed = [(key, list(arns)) for key, arns in lists if arns]
        changed += [] if c.endpoint_public_access else [("cluster.endpointPublicAccess", False)]
        problems += [Problem(key, value, "only for a cluster this stack creates: on an existing cluster manage "
                             "its access entries and endpoint where it was created") for key, value in changed]
    return problems


LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
                      2922, 3288, 3653, 0)
"""What CloudWatch Logs accepts as a log group's retention (PutRetentionPolicy ``retentionInDays``)."""


PLACEMENT_GROUP_NAME = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,254}")
"""An EC2 placement group name: up to 255 ASCII characters (CreatePlacementGroup ``GroupName``)."""


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
    if s.profile.reservation_only and rid is None:
        problems.append(
            Problem("gpuNodes.capacityReservationId", None,
                    f"{s.profile.instance_type} is only sold through capacity reservations: set your reservation's id "
                    "and AZ (pulumi config set --path gpuNodes.capacityReservationId cr-...; "
                    "pulumi config set --path gpuNodes.availabilityZone <its AZ>; "
                    "aws ec2 describe-capacity-reservations shows both)")
        )
    if g.capacity_block and rid is None:
        problems.append(
            Problem("gpuNodes.capacityReservationId", None,
                    "gpuNodes.capacityBlock needs the capacity block's reservation id (cr-...)")
        )
    pg = g.placement_group_name
    if pg is not None and not PLACEMENT_GROUP_NAME.fullmatch(pg):
        problems.append(Problem("gpuNodes.placementGroupName", pg,
                                "give the placement group's name (1-255 ASCII characters; "
                                "aws ec2 describe-placement-groups lists them)"))
    if g.root_volume_gib < 200:
        problems.append(Problem("gpuNodes.rootVolumeGiB", g.root_volume_gib,
                                "use at least 200: CUDA training images are tens of GB"))
    return problems


def _job_rules(s: Settings) -> list[Problem]:
    """The job's own keys. Its training keys are the package's, checked by the package's rules."""
    j, p = s.job, s.profile
    problems = []
    if j.nodes < 1:
        problems.append(Problem("job.nodes", j.nodes, "must be at least 1"))
    if j.max_restarts < 0:
        problems.append(Problem("job.maxRestarts", j.max_restarts, "must be 0 or more"))
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
    if j.training.model.precision == "fp8" and not p.float8:
        problems.append(Problem("job.precision", "fp8",
                                f"{p.instance_type}'s {p.gpu_model} has no float8 matrix units: use bf16 "
                                "(or a profile with H100s, e.g. p5)"))
    if j.training.parallel.sharding == "HYBRID_SHARD" and j.nodes < 2:
        problems.append(Problem("job.sharding", "HYBRID_SHARD", "HYBRID_SHARD replicates across nodes: use "
                                "FULL_SHARD on one node, or job.nodes >= 2"))
    return problems + _hsdp_shard_problems(s)


def _hsdp_worlds(s: Settings) -> list[tuple[int, int]]:
    """(nodes, GPUs) of every world the job can run at (each node count of its elastic range)."""
    lo, hi = job_node_bounds(s.job)
    gpus = gpus_per_node(s.job, s.profile)
    return [(n, n * gpus) for n in sorted({s.job.nodes, *range(max(lo, 1), hi + 1)})]


def _hsdp_shard_problems(s: Settings) -> list[Problem]:
    """HYBRID_SHARD's 2-D mesh is (replicas, shard size): the shard size must divide the world
    size, at every node count the job can run at (torch's DeviceMesh refuses otherwise, in the pod)."""
    shard = s.job.training.parallel.hsdp_shard_size
    if s.job.training.parallel.sharding != "HYBRID_SHARD" or shard < 1:
        return []
    bad = [f"{nodes} x {world // nodes} = {world}" for nodes, world in _hsdp_worlds(s) if world % shard]
    if not bad:
        return []
    return [Problem("job.hsdpShardSize", shard,
                    f"must divide the world size, job nodes x GPUs per node ({', '.join(bad)} GPUs): use a "
                    f"divisor, e.g. {gpus_per_node(s.job, s.profile)} (one node's GPUs), or leave it unset")]


# --------------------------------------------------------------------------- fit in memory


def _min_nodes(job: JobSettings) -> int:
    """Elastic jobs may run at their lower bound: the fewest GPUs, the largest shards."""
    return job_node_bounds(job)[0]


def _job_estimate(shape: ModelShape, job: JobSettings, profile: HardwareProfile, **changes) -> memory_fit.MemoryEstimate:
    t = training_config.flat(job.training)
    params = {
        "nodes": _min_nodes(job),
        "gpus_per_node": gpus_per_node(job, profile),
        **{k: t[k] for k in ("sharding", "batch_size", "seq_len", "activation_checkpointing", "compile",
                             "loss", "precision", "packed_attention")},
    }
    params.update(changes)
    return memory_fit.estimate(shape, **params)


def _what_would_fit(shape: ModelShape, job: JobSettings, profile: HardwareProfile) -> list[str]:
    """Changes of one or two keys that bring the estimate under the budget, each with its total."""
    budget = memory_fit.budget_gib(profile)
    nodes = _min_nodes(job)
    t = training_config.flat(job.training)
    options = []
    for n in range(nodes + 1, memory_fit.MAX_SUGGESTED_NODES + 1):
        e = _job_estimate(shape, job, profile, nodes=n, sharding="FULL_SHARD")
        if e.total <= budget:
            also = "" if t["sharding"] == "FULL_SHARD" else " with job.sharding FULL_SHARD"
            options.append(f"job.nodes {n}{also} (and gpuNodes.desiredSize/maxSize >= {n}): {e.total:.1f} GiB")
            break
    for key, change in (
        ("job.sharding FULL_SHARD", {"sharding": "FULL_SHARD"}),
        ("job.activationCheckpointing full", {"activation_checkpointing": "full"}),
        ("job.sharding FULL_SHARD and job.activationCheckpointing full",
         {"sharding": "FULL_SHARD", "activation_checkpointing": "full"}),
        ("job.batchSize 1", {"batch_size": 1}),
    ):
        if any(t[k] == v for k, v in change.items()):
            continue  # already so, or the same as a single change above
        e = _job_estimate(shape, job, profile, **change)
        if e.total <= budget:
            options.append(f"{key}: {e.total:.1f} GiB")
    return options


def host_memory_rules(s: Settings) -> list[Problem]:
    """The host-memory check of components/planning/memory_fit.py: refuse an async-checkpointing
    job whose host copy would not fit in the memory the pod requests."""
    j = s.job
    t = training_config.flat(j.training)
    if (not t["async_checkpoint"] or t["model"] == training_config.TINY_MODEL or _min_nodes(j) < 1
            or (j.model_parameters is not None and j.model_parameters <= 0)):
        return []  # nothing staged, or the other rules report what is wrong
    shape = memory_fit.model_shape(t["model"], j.model_parameters)
    if shape is None:
        return []  # gpu_memory_rules asks for the parameter count
    staged = memory_fit.staging_gib(shape, sharding=t["sharding"], nodes=_min_nodes(j),
                         gpus_per_node=gpus_per_node(j, s.profile))
    requested = s.profile.pod_memory_gib_per_gpu
    if staged + memory_fit.HOST_ALLOWANCE_GIB <= requested:
        return []
    return [Problem("job.asyncCheckpoint", True,
                    f"an async checkpoint copies {staged:.1f} GiB per GPU process to host memory "
                    f"({memory_fit.STAGED_BYTES_PER_PARAM} B x {shape.parameters / 1e9:.2f}B parameters over the "
                    f"{t['sharding']} shard group), which with {memory_fit.HOST_ALLOWANCE_GIB:.0f} GiB for the process "
                    f"exceeds the {requested} GiB the worker requests per GPU: run on more nodes, "
                    "use job.sharding FULL_SHARD, or set job.asyncCheckpoint false (checkpoints then "
                    "pause training while they are written)")]


def gpu_memory_rules(s: Settings) -> list[Problem]:
    """The GPU-memory check of components/planning/memory_fit.py: refuse a job whose per-GPU
    estimate exceeds the budget, with what would fit instead."""
    j, p = s.job, s.profile
    t = training_config.flat(j.training)
    if t["model"] == training_config.TINY_MODEL:
        return []
    if j.model_parameters is not None and j.model_parameters <= 0:
        return []  # the job rules report it; nothing sensible to estimate
    shape = memory_fit.model_shape(t["model"], j.model_parameters)
    if shape is None:
        return [Problem("job.modelParameters", None,
                        f"{t['model']} is not in the GPU-memory fit check's table (components/planning/memory_fit.py): "
                        "give its parameter count in billions, e.g. modelParameters: 8.0")]
    if min(j.nodes, _min_nodes(j)) < 1:
        return []  # the job rules report these; nothing sensible to estimate
    e = _job_estimate(shape, j, p)
    budget = memory_fit.budget_gib(p)
    if e.total <= budget:
        return []
    gpus = gpus_per_node(j, p)
    nodes = _min_nodes(j)
    value = (f"{t['model']} on {nodes} x {p.instance_type} ({nodes * gpus} GPUs), {t['sharding']}, "
             f"batchSize {t['batch_size']}, seqLen {t['seq_len']}, "
             f"activationCheckpointing {t['activation_checkpointing']}")
    options = _what_would_fit(shape, j, p)
    would = ("would fit: " + "; ".join(options)) if options else (
        f"nothing up to {memory_fit.MAX_SUGGESTED_NODES} nodes fits: use a smaller model or a GPU with more memory")
    return [Problem("job", value,
                    f"does not fit in GPU memory: estimated {e.total:.1f} GiB per GPU > {budget:.1f} GiB "
                    f"({memory_fit.BUDGET_FRACTION:.0%} of {p.gpu_memory_gib} GiB, {p.gpu_model}): "
                    f"{e.breakdown(shape, t['activation_checkpointing'])}. It {would}")]


def _secret_rules(s: Settings) -> list[Problem]:
    problems = []
    if s.job.training.model.model.startswith("meta-llama/") and s.secrets.hf_token is None:
        problems.append(Problem("hfToken", None, f"{s.job.training.model.model} is gated: "
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
    topic = o.alert_sns_topic_arn
    if topic is not None and not SNS_TOPIC_ARN.fullmatch(topic):
        problems.append(Problem("observability.alertSnsTopicArn", topic,
                                "give an SNS topic ARN such as arn:aws:sns:us-west-2:123456789012:gpu-alerts"))
    if topic is not None and not s.creates_cluster:
        problems.append(Problem("observability.alertSnsTopicArn", topic,
                                "only for a cluster this stack creates (Alertmanager publishes through EKS Pod Identity): "
                                "on an existing cluster use the alertSlackWebhook secret"))
    if o.cloudwatch_container_insights and not s.creates_cluster:
        problems.append(Problem("observability.cloudwatchContainerInsights", True,
                                "only for a cluster this stack creates: on an existing cluster install the "
                                "amazon-cloudwatch-observability add-on yourself, with "
                                "accelerated_compute_metrics false (one DCGM exporter per GPU node)"))
    return problems


SNS_TOPIC_ARN = re.compile(r"arn:aws(-[a-z]+)*:sns:[a-z]{2}(-[a-z]+)+-\d:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?")
"""A standard or FIFO SNS topic ARN; its region is the fourth field (Alertmanager signs for it)."""


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
    most = max(s.job.nodes, job_node_bounds(s.job)[1])
    if most > 1 and not st.shared:
        problems.append(Problem("storage.fsx", st.fsx,
                                f"a job on {most} nodes needs storage every node shares: each node writes its "
                                "checkpoint shards to its own NVMe, so a checkpoint would be scattered across "
                                "nodes and a restarted or resumed run could not load it. Set storage.fsx: true "
                                "(storage.existingClaimName on an existing cluster), or run on one node (job.nodes: 1)"))
    return problems


DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A Kubernetes namespace name (RFC 1123 label: at most 63 lower-case letters, digits and '-')."""
DNS_1123_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes object name such as a PersistentVolumeClaim's or a StorageClass's (RFC 1123
subdomain: at most 253 characters, lower-case labels joined by '.')."""
EKS_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9_-]{0,99}")
"""An EKS cluster name (CreateCluster ``name``: 1-100 characters, ``^[0-9A-Za-z][A-Za-z0-9_-]*$``)."""
STACK_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]{0,98}[a-z0-9])?")
"""``<project>-<stack>``, the prefix of every physical name: it must be a valid EKS cluster name, the
first path part of an ECR repository name (lower case: ``[a-z0-9]+(?:[._-][a-z0-9]+)*``) and the
start of a Kubernetes StorageClass name (RFC 1123): lower-case letters, digits and '-' only."""
AVAILABILITY_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
"""An AZ name such as ``us-west-2c`` (a zone id such as ``usw2-az3`` is not a name)."""


def _name_rules(s: Settings) -> list[Problem]:
    """Every setting that becomes a Kubernetes or AWS name, checked against that API's rules."""
    problems = []
    if not STACK_PREFIX.fullmatch(s.name):
        problems.append(Problem("(stack name)", s.stack,
                                f"'{s.name}' (project-stack) names the EKS cluster, the ECR repository and a "
                                "Kubernetes StorageClass: use lower-case letters, digits and '-' only, at most "
                                f"{100 - len(s.project) - 1} characters (pulumi stack rename <new name>)"))
    if not DNS_1123_LABEL.fullmatch(s.job.namespace):
        problems.append(Problem("job.namespace", s.job.namespace,
                                "a Kubernetes namespace name: at most 63 lower-case letters, digits and '-', "
                                "starting and ending with a letter or digit"))
    claim = s.storage.existing_claim_name
    if claim is not None and not DNS_1123_SUBDOMAIN.fullmatch(claim):
        problems.append(Problem("storage.existingClaimName", claim,
                                "give the name of a PersistentVolumeClaim (lower-case letters, digits, '-' and '.', "
                                "at most 253 characters)"))
    existing = s.cluster.existing_cluster_name
    if existing is not None and not EKS_CLUSTER_NAME.fullmatch(existing):
        problems.append(Problem("cluster.existingClusterName", existing,
                                "an EKS cluster name: 1-100 letters, digits, '-' and '_', starting with a letter "
                                "or digit"))
    if s.creates_cluster:
        new_vpc = s.network.existing_vpc_id is None
        zones = [("network.availabilityZones", az) for az in s.network.availability_zones if new_vpc]
        if new_vpc or s.gpu_nodes.availability_zone:
            zones.append(("gpuNodes.availabilityZone", s.gpu_nodes.availability_zone))
        for key, az in zones:
            if not AVAILABILITY_ZONE.fullmatch(az) or (s.region and not az.startswith(s.region)):
                problems.append(Problem(key, az, f"give an AZ name of the stack's region {s.region or '(aws:region)'}, "
                                        f"such as {s.region or 'us-west-2'}a"))
    return problems


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


def _open_endpoint_warning(s: Settings) -> list[Problem]:
    c = s.cluster
    if s.creates_cluster and c.endpoint_public_access and OPEN_TO_THE_INTERNET in c.public_access_cidrs:
        return [Problem("cluster.publicAccessCidrs", list(c.public_access_cidrs),
                        "the Kubernetes API endpoint is open to the whole internet: list your networks' CIDRs, "
                        "or set cluster.endpointPublicAccess: false (private endpoint only)")]
    return []


def _no_alert_receiver_warning(s: Settings) -> list[Problem]:
    o = s.observability
    if o.enabled and o.alert_sns_topic_arn is None and s.secrets.alert_slack_webhook is None:
        return [Problem("observability.alertSnsTopicArn", None,
                        "no alert receiver: the GPU and training alerts fire but reach no one. Set it, or "
                        "`pulumi config set --secret alertSlackWebhook https://hooks.slack.com/...`")]
    return []


def _hsdp_straddles_nodes_warning(s: Settings) -> list[Problem]:
    """A shard group that is neither a part nor a multiple of a node mixes NVLink and EFA links in
    its all-gathers and reduce-scatters: it runs, at the slower link's speed."""
    shard, gpus = s.job.training.parallel.hsdp_shard_size, gpus_per_node(s.job, s.profile)
    if s.job.training.parallel.sharding != "HYBRID_SHARD" or shard < 1 or gpus % shard == 0 or shard % gpus == 0:
        return []
    return [Problem("job.hsdpShardSize", shard,
                    f"does not divide the {gpus} GPUs per node nor is a multiple of it: some shard groups span "
                    "two nodes, and their collectives run at the network's speed instead of NVLink's; use a "
                    f"divisor or a multiple of {gpus}")]


def _context_warning(s: Settings) -> list[Problem]:
    """A sequence longer than the model's trained context: positions beyond it were never trained
    (rotary embeddings extrapolate badly). The job fits it in memory; the quality is the risk."""
    trained = trained_context(s.job.training.model.model)
    seq_len = s.job.training.data.seq_len
    if trained is None or seq_len <= trained:
        return []
    return [Problem("job.seqLen", seq_len,
                    f"{s.job.training.model.model} was trained at {trained:,} positions: beyond that its rotary "
                    "position embeddings are untrained and quality drops. The fine-tune has no RoPE-scaling "
                    f"option: use at most {trained}, or a model whose config.json sets rope_scaling for the "
                    "length you need")]


WARNINGS: list[Rule] = [_open_endpoint_warning, _no_alert_receiver_warning, _hsdp_straddles_nodes_warning,
                        _context_warning]
"""What preview warns about but accepts (``settings_parser.settings_warnings``)."""

RULES: list[Rule] = [_network_rules, _cluster_rules, _gpu_node_rules, _job_rules, _secret_rules,
                     gpu_memory_rules, host_memory_rules, _observability_rules, _storage_rules, _name_rules]
