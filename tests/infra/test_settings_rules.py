"""Every branch of every settings rule (components/settings_rules/), one case each, and the
values just inside each limit, which must pass.

Each case starts from a stack file of the repository (valid as committed), changes what the
case says, and asserts the problem a user would see: the key to change and the reason. Checked
against the facts behind each limit (docs/design.md; the sources are named per case) and,
mechanically, by ``test_every_rule_is_needed``: with any one rule removed, some case here fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from components import settings_parser, settings_rules
from components.planning import hardware
from components.settings import Secrets, SettingsError
from tests.harness import SECRETS, parse
from tests.harness import raw_settings as raw

DROP = object()
"""A change that removes the key."""


def changed(stack: str, changes: dict) -> dict:
    """A stack file's settings with ``{"section.key": value}`` changes (DROP removes the key)."""
    config = raw(stack)
    for path, value in changes.items():
        section, _, key = path.partition(".")
        if not key:
            config[section] = value
        elif value is DROP:
            config[section].pop(key, None)
        else:
            config.setdefault(section, {})[key] = value
    return config


def problems(config: dict, secrets: Secrets = SECRETS) -> dict[str, list[str]]:
    """Key -> the problems named on it; {} when the settings are accepted."""
    try:
        parse(config, secrets)
    except SettingsError as error:
        found: dict[str, list[str]] = {}
        for p in error.problems:
            found.setdefault(p.key, []).append(str(p))
        return found
    return {}


EXISTING = {"cluster.existingClusterName": "research", "storage": {"existingClaimName": "checkpoints"}}
"""An existing cluster (its checkpoints on a claim the user brings: FSx needs a cluster of ours)."""
VPC, SUBNET_A, SUBNET_B = "vpc-0123456789abcdef0", "subnet-0a1b2c3d4e5f60718", "subnet-0f1e2d3c4b5a69788"
EXISTING_VPC = {"existingVpcId": VPC, "existingPrivateSubnetIds": [SUBNET_A, SUBNET_B],
                "existingGpuSubnetIds": [SUBNET_B]}
"""An existing VPC with its private subnets, one of them in the GPU AZ."""
NO_GRAFANA = Secrets(hf_token="hf_x", grafana_admin_password=None)
NO_TOKEN = Secrets(hf_token=None, grafana_admin_password="pw")

# (case, stack, changes, secrets, key, reason)
CASES = [
    # network: EKS needs subnets in two AZs; pods take VPC IPs (VPC CNI), so the block is large.
    ("vpc-cidr-too-small", "p5", {"network.vpcCidr": "10.0.0.0/21"}, SECRETS,
     "network.vpcCidr", "use a /20 or larger"),
    ("vpc-cidr-malformed", "p5", {"network.vpcCidr": "10.0.0/16"}, SECRETS,
     "network.vpcCidr", "give an IPv4 CIDR"),
    ("one-az", "p5", {"network.availabilityZones": ["us-west-2c"]}, SECRETS,
     "network.availabilityZones", "at least two AZs"),
    ("one-az-twice", "p5", {"network.availabilityZones": ["us-west-2c", "us-west-2c"]}, SECRETS,
     "network.availabilityZones", "at least two AZs"),
    ("an-az-twice", "p5", {"network.availabilityZones": ["us-west-2a", "us-west-2c", "us-west-2a"]}, SECRETS,
     "network.availabilityZones", "listed twice"),
    # the subnet plan (components/network.py) has room for seven AZs
    ("eight-azs", "p5", {"network.availabilityZones": [f"us-west-2{z}" for z in "abcdefgh"]}, SECRETS,
     "network.availabilityZones", "list at most 7 AZs"),
    # EC2 CreateVpc: a VPC's IPv4 block is /16 at most (and /28 at least)
    ("vpc-cidr-too-large", "p5", {"network.vpcCidr": "10.0.0.0/8"}, SECRETS,
     "network.vpcCidr", "use a /16 to /20 block"),
    ("vpc-cidr-ipv6", "p5", {"network.vpcCidr": "fd00::/48"}, SECRETS,
     "network.vpcCidr", "give an IPv4 CIDR"),
    ("existing-vpc-no-private-subnets", "p5",
     {"network": {"existingVpcId": VPC, "existingGpuSubnetIds": [SUBNET_B]}}, SECRETS,
     "network.existingPrivateSubnetIds", "list the subnet ids"),
    ("existing-vpc-no-gpu-subnets", "p5",
     {"network": {"existingVpcId": VPC, "existingPrivateSubnetIds": [SUBNET_A]}}, SECRETS,
     "network.existingGpuSubnetIds", "list the subnet ids"),
    # EC2 ids: prefix and 8 or 17 hex digits (EC2 user guide, "Resource IDs")
    ("vpc-id-malformed", "p5", {"network": {**EXISTING_VPC, "existingVpcId": "my-vpc"}}, SECRETS,
     "network.existingVpcId", "vpc- and 8 or 17 hex digits"),
    ("vpc-id-of-another-resource", "p5", {"network": {**EXISTING_VPC, "existingVpcId": "subnet-0123abcd"}},
     SECRETS, "network.existingVpcId", "vpc- and 8 or 17 hex digits"),
    ("subnet-id-malformed", "p5", {"network": {**EXISTING_VPC, "existingGpuSubnetIds": ["subnet-b"]}}, SECRETS,
     "network.existingGpuSubnetIds", "subnet- and 8 or 17 hex digits"),
    ("subnet-id-of-ten-digits", "p5", {"network": {**EXISTING_VPC, "existingPublicSubnetIds": ["subnet-0123456789"]}},
     SECRETS, "network.existingPublicSubnetIds", "subnet- and 8 or 17 hex digits"),
    ("subnets-without-their-vpc", "p5", {"network.existingPrivateSubnetIds": [SUBNET_A]}, SECRETS,
     "network.existingPrivateSubnetIds", "set network.existingVpcId too"),
    # cluster
    ("kubernetes-version-unpinned", "p5", {"cluster.kubernetesVersion": "1.20"}, SECRETS,
     "cluster.kubernetesVersion", "add-on versions are pinned"),
    ("system-nodes-out-of-order", "p5",
     {"cluster.systemNodes": {"minSize": 2, "desiredSize": 1, "maxSize": 3}}, SECRETS,
     "cluster.systemNodes.minSize/desiredSize/maxSize", "minSize <= desiredSize <= maxSize"),
    ("system-instance-type-malformed", "p5", {"cluster.systemInstanceType": "m6i-2xlarge"}, SECRETS,
     "cluster.systemInstanceType", "give an EC2 instance type"),
    ("public-access-cidr-malformed", "p5", {"cluster.publicAccessCidrs": ["0.0.0.0/0", "office"]}, SECRETS,
     "cluster.publicAccessCidrs", "give IPv4 CIDRs"),
    # pulumi_aws eks ClusterVpcConfig.public_access_cidrs: "EKS defaults this to a list with 0.0.0.0/0".
    ("public-access-cidrs-empty", "p5", {"cluster.publicAccessCidrs": []}, SECRETS,
     "cluster.publicAccessCidrs", "an empty list opens the public endpoint to the whole internet"),
    # GPU nodes (EC2 reservations and capacity blocks: docs/design.md#gpu-nodes-and-efa)
    ("gpu-min-above-desired", "p5", {"gpuNodes.minSize": 3, "gpuNodes.maxSize": 4}, SECRETS,
     "gpuNodes.minSize/desiredSize/maxSize", "maxSize >= 1"),
    ("gpu-negative-min", "p5", {"gpuNodes.minSize": -1}, SECRETS,
     "gpuNodes.minSize/desiredSize/maxSize", "0 <= minSize"),
    ("gpu-max-zero", "p5", {"gpuNodes.desiredSize": 0, "gpuNodes.maxSize": 0, "job.nodes": 1,
                            "storage.fsx": True}, SECRETS,
     "gpuNodes.minSize/desiredSize/maxSize", "maxSize >= 1"),
    ("gpu-az-not-listed", "p5", {"gpuNodes.availabilityZone": "us-west-2d"}, SECRETS,
     "gpuNodes.availabilityZone", "use the reservation's AZ"),
    ("reservation-id-malformed", "p4de", {"gpuNodes.capacityReservationId": "cr-xyz"}, SECRETS,
     "gpuNodes.capacityReservationId", "cr- followed by 17 hex digits"),
    # capacity reservations came after EC2's switch to 17-digit ids: never 8 (docs/design.md)
    ("reservation-id-8-hex", "p4de", {"gpuNodes.capacityReservationId": "cr-0123abcd"}, SECRETS,
     "gpuNodes.capacityReservationId", "cr- followed by 17 hex digits"),
    ("reservation-id-upper-case", "p4de", {"gpuNodes.capacityReservationId": "cr-0123456789ABCDEF0"}, SECRETS,
     "gpuNodes.capacityReservationId", "cr- followed by 17 hex digits"),
    ("reservation-only-profile-without-reservation", "p4de", {"gpuNodes.capacityReservationId": DROP}, SECRETS,
     "gpuNodes.capacityReservationId", "p4de.24xlarge is only sold through capacity reservations"),
    ("capacity-block-without-reservation", "p5", {"gpuNodes.capacityBlock": True}, SECRETS,
     "gpuNodes.capacityReservationId", "capacityBlock needs the capacity block's reservation id"),
    ("root-volume-too-small", "p5", {"gpuNodes.rootVolumeGiB": 199}, SECRETS,
     "gpuNodes.rootVolumeGiB", "use at least 200"),
    # job (p5.48xlarge: 8 GPUs, 32 EFA interfaces)
    ("no-nodes", "p5", {"job.nodes": 0}, SECRETS, "job.nodes", "must be at least 1"),
    ("negative-restarts", "p5", {"job.maxRestarts": -1}, SECRETS, "job.maxRestarts", "must be 0 or more"),
    ("parameters-not-positive", "p5", {"job.model": "mistralai/Mistral-7B-v0.1", "job.modelParameters": 0.0},
     SECRETS, "job.modelParameters", "in billions"),
    ("more-gpus-than-the-node", "p5", {"job.gpusPerNode": 9}, SECRETS, "job.gpusPerNode", "use 1..8"),
    ("no-gpus", "p5", {"job.gpusPerNode": 0}, SECRETS, "job.gpusPerNode", "use 1..8"),
    ("more-efa-than-the-node", "p5", {"job.efaPerNode": 33}, SECRETS, "job.efaPerNode", "use 0..32"),
    ("negative-efa", "p5", {"job.efaPerNode": -1}, SECRETS, "job.efaPerNode", "use 0..32"),
    ("min-nodes-above-nodes", "p5", {"job.minNodes": 3}, SECRETS,
     "job.minNodes/maxNodes", "minNodes <= nodes (2) <= maxNodes"),
    ("max-nodes-below-nodes", "p5", {"job.maxNodes": 1}, SECRETS,
     "job.minNodes/maxNodes", "minNodes <= nodes (2) <= maxNodes"),
    ("min-nodes-zero", "p5", {"job.minNodes": 0}, SECRETS,
     "job.minNodes/maxNodes", "need 1 <= minNodes <= nodes (2) <= maxNodes"),
    ("max-nodes-zero", "p5", {"job.maxNodes": 0}, SECRETS,
     "job.minNodes/maxNodes", "need 1 <= minNodes <= nodes (2) <= maxNodes"),
    ("max-nodes-beyond-the-node-group", "p5", {"job.maxNodes": 3}, SECRETS,
     "job.maxNodes", "at most gpuNodes.maxSize (2)"),
    ("nodes-beyond-desired-without-autoscaler", "p5", {"job.nodes": 3, "gpuNodes.maxSize": 4,
                                                        "gpuNodes.scaleDownDelayMinutes": 0}, SECRETS,
     "job.nodes", "raise gpuNodes.desiredSize (2)"),
    # GpuNodesIdle (30 idle minutes) must mean "the autoscaler is off or stuck".
    ("scale-down-delay-past-the-idle-alert", "p5", {"gpuNodes.scaleDownDelayMinutes": 21}, SECRETS,
     "gpuNodes.scaleDownDelayMinutes", "use 1..20 minutes"),
    ("scale-down-delay-negative", "p5", {"gpuNodes.scaleDownDelayMinutes": -1}, SECRETS,
     "gpuNodes.scaleDownDelayMinutes", "or 0 to keep the nodes"),
    ("hybrid-shard-on-one-node", "p5", {"job.nodes": 1, "job.sharding": "HYBRID_SHARD"}, SECRETS,
     "job.sharding", "replicates across nodes"),
    # HYBRID_SHARD's mesh is (world / shard, shard): torch's DeviceMesh needs the shard size to divide
    # the world (2 nodes x p5's 8 GPUs = 16; elastic down to 1 node: 8).
    ("hsdp-shard-not-dividing-the-world", "p5", {"job.sharding": "HYBRID_SHARD", "job.hsdpShardSize": 3},
     SECRETS, "job.hsdpShardSize", "must divide the world size, job nodes x GPUs per node (2 x 8 = 16 GPUs)"),
    ("hsdp-shard-not-dividing-the-smallest-elastic-world", "p5",
     {"job.sharding": "HYBRID_SHARD", "job.hsdpShardSize": 16, "job.minNodes": 1}, SECRETS,
     "job.hsdpShardSize", "(1 x 8 = 8 GPUs)"),
    # secrets
    ("gated-model-without-token", "p5", {}, NO_TOKEN, "hfToken", "is gated"),
    ("grafana-without-password", "p5", {}, NO_GRAFANA, "grafanaAdminPassword", "--secret grafanaAdminPassword"),
    # observability (Prometheus duration syntax; EBS gp3 volumes)
    ("retention-not-a-duration", "p5", {"observability.prometheusRetention": "15 days"}, SECRETS,
     "observability.prometheusRetention", "a Prometheus duration"),
    ("retention-zero", "p5", {"observability.prometheusRetention": "0d"}, SECRETS,
     "observability.prometheusRetention", "a Prometheus duration"),
    ("prometheus-volume-too-small", "p5", {"observability.prometheusStorageGiB": 9}, SECRETS,
     "observability.prometheusStorageGiB", "use at least 10"),
    ("cloudwatch-on-existing-cluster", "p5", {**EXISTING, "observability.cloudwatchContainerInsights": True},
     SECRETS, "observability.cloudwatchContainerInsights", "one DCGM exporter per GPU node"),
    # storage (FSx API CreateFileSystem: PERSISTENT_2 capacities and throughputs)
    ("fsx-and-a-claim", "p5", {"storage.existingClaimName": "checkpoints"}, SECRETS,
     "storage.existingClaimName", "use one of storage.fsx"),
    ("fsx-on-existing-cluster", "p5", {**EXISTING, "storage": {"fsx": True}}, SECRETS,
     "storage.fsx", "only for a cluster this stack creates"),
    ("fsx-capacity-not-a-size", "p5", {"storage.fsxStorageCapacityGiB": 3600}, SECRETS,
     "storage.fsxStorageCapacityGiB", "1200, 2400 or a multiple of 2400"),
    ("fsx-throughput-not-offered", "p5", {"storage.fsxThroughputPerTiB": 300}, SECRETS,
     "storage.fsxThroughputPerTiB", "125, 250, 500, 1000"),
    ("claim-name-not-a-kubernetes-name", "p5", {**EXISTING, "storage": {"existingClaimName": "Check_Points"}},
     SECRETS, "storage.existingClaimName", "lower-case letters"),
    ("several-nodes-without-shared-storage", "p5", {"storage.fsx": False}, SECRETS,
     "storage.fsx", "needs storage every node shares"),
    # EC2 placement group names: 1-255 ASCII characters (CreatePlacementGroup GroupName).
    ("placement-group-name-too-long", "p4de", {"gpuNodes.placementGroupName": "g" * 256}, SECRETS,
     "gpuNodes.placementGroupName", "1-255 ASCII characters"),
    ("placement-group-name-not-ascii", "p4de", {"gpuNodes.placementGroupName": "grüppe"}, SECRETS,
     "gpuNodes.placementGroupName", "1-255 ASCII characters"),
    # names: Kubernetes' own namespaces (Kubernetes docs, "Namespaces") and the monitoring stack's
    ("job-namespace-of-kubernetes", "p5", {"job.namespace": "kube-system"}, SECRETS,
     "job.namespace", "not one that Kubernetes or the monitoring stack owns"),
    ("job-namespace-of-monitoring", "p5", {"job.namespace": "monitoring"}, SECRETS,
     "job.namespace", "not one that Kubernetes or the monitoring stack owns"),
    # the region (the harness takes it from the GPU AZ, as the stack files set aws:region)
    ("region-without-known-registry", "p5", {"gpuNodes.availabilityZone": "xx-moon-1a"}, SECRETS,
     "(aws:region)", "EKS add-on image registry is known"),
    # the memory-fit rule (components/planning/memory_fit.py; its estimate is tested in test_memory_fit.py)
    ("unknown-model-without-size", "p5", {"job.model": "mistralai/Mistral-7B-v0.1"}, SECRETS,
     "job.modelParameters", "not in the GPU-memory fit check's table"),
    ("model-too-large", "p5", {"job.model": "meta-llama/Llama-2-70b-hf", "job.nodes": 1, "job.sharding": "NO_SHARD"},
     SECRETS, "job", "does not fit in GPU memory"),
    ("async-copy-beyond-host-memory", "p5", {"job.model": "meta-llama/Llama-2-70b-hf", "job.nodes": 1,
                                             "job.activationCheckpointing": "full", "job.batchSize": 1},
     SECRETS, "job.asyncCheckpoint", "to host memory"),
]


@pytest.mark.parametrize(("stack", "changes", "secrets", "key", "reason"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_rule_names_the_key_and_the_reason(stack, changes, secrets, key, reason):
    """The key, the reason, and (where the case set that key) the bad value as the user wrote it."""
    found = problems(changed(stack, changes), secrets)
    assert key in found, f"no problem on {key}; got {found}"
    assert any(reason in message for message in found[key]), found[key]
    if key in changes and changes[key] is not DROP:  # the list, or the one bad item of it
        given = changes[key]
        named = [given, *(given if isinstance(given, list) else [])]
        assert any(f"{key} = {v!r}: " in message for v in named for message in found[key]), found[key]


# (case, stack, changes): each value just inside the limit a case above crosses.
ACCEPTED = [
    ("vpc-cidr-/20", "p5", {"network.vpcCidr": "10.0.0.0/20"}),
    ("two-azs", "p5", {"network.availabilityZones": ["us-west-2b", "us-west-2c"]}),
    ("existing-vpc-with-subnets", "p5", {"network": EXISTING_VPC}),
    ("existing-vpc-of-8-hex-digits", "p5", {"network": {**EXISTING_VPC, "existingVpcId": "vpc-a01106c2",
                                                        "existingPublicSubnetIds": ["subnet-9d4a7b6c"]}}),
    ("system-instance-type-with-options", "p5", {"cluster.systemInstanceType": "c7i-flex.2xlarge"}),
    ("public-access-cidrs", "p5", {"cluster.publicAccessCidrs": ["203.0.113.0/24"]}),
    ("private-endpoint-without-cidrs", "p5",
     {"cluster.endpointPublicAccess": False, "cluster.publicAccessCidrs": []}),
    ("gpu-min-equals-desired-equals-max", "p5", {"gpuNodes.minSize": 2}),
    ("reservation-id-17-hex", "p4de", {"gpuNodes.capacityReservationId": "cr-0123456789abcdef0"}),
    ("capacity-block-with-reservation", "p5", {"gpuNodes.capacityBlock": True,
                                                "gpuNodes.capacityReservationId": "cr-0abc1234def567890"}),
    ("root-volume-200", "p5", {"gpuNodes.rootVolumeGiB": 200}),
    ("placement-group-name-255", "p4de", {"gpuNodes.placementGroupName": "g" * 255}),
    ("no-restarts", "p5", {"job.maxRestarts": 0}),
    ("one-gpu", "p5", {"job.gpusPerNode": 1, "job.activationCheckpointing": "full", "job.batchSize": 1}),
    ("every-gpu", "p5", {"job.gpusPerNode": 8}),
    ("no-efa", "p5", {"job.efaPerNode": 0}),
    ("every-efa", "p5", {"job.efaPerNode": 32}),
    ("elastic-within-the-node-group", "p5", {"job.minNodes": 1, "job.maxNodes": 2}),
    ("hybrid-shard-on-two-nodes", "p5", {"job.sharding": "HYBRID_SHARD"}),
    ("ungated-model-without-token", "p5", {"job.model": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                                            "job.modelParameters": 1.1}),
    ("retention-compound", "p5", {"observability.prometheusRetention": "1w3d"}),
    ("prometheus-volume-10", "p5", {"observability.prometheusStorageGiB": 10}),
    ("observability-off-without-password", "p5", {"observability.enabled": False}),
    ("job-namespace-monitoring-without-monitoring", "p5", {"job.namespace": "monitoring",
                                                            "observability.enabled": False}),
    ("fsx-2400", "p5", {"storage.fsxStorageCapacityGiB": 2400}),
    ("fsx-4800", "p5", {"storage.fsxStorageCapacityGiB": 4800}),
    ("fsx-throughput-1000", "p5", {"storage.fsxThroughputPerTiB": 1000}),
    ("one-node-on-its-nvme", "p5", {"storage.fsx": False, "job.nodes": 1}),
    ("existing-cluster-with-a-claim", "p5", EXISTING),
    # The autoscaler brings nodes up to maxSize for the job's pending pods.
    ("nodes-beyond-desired-with-autoscaler", "p5", {"job.nodes": 3, "gpuNodes.maxSize": 4}),
    ("scale-down-delay-20", "p5", {"gpuNodes.scaleDownDelayMinutes": 20}),
    ("no-autoscaler", "p5", {"gpuNodes.scaleDownDelayMinutes": 0}),
    ("one-node-group-of-one", "p5", {"gpuNodes.desiredSize": 1, "gpuNodes.maxSize": 1, "job.nodes": 1}),
    ("system-nodes-one", "p5", {"cluster.systemNodes": {"minSize": 1, "desiredSize": 1, "maxSize": 1}}),
    ("half-a-billion-parameters", "p5", {"job.model": "Qwen/Qwen2.5-0.5B", "job.modelParameters": 0.5}),
    ("unknown-model-with-size", "p5", {"job.model": "mistralai/Mistral-7B-v0.1", "job.modelParameters": 7.2,
                                       "job.activationCheckpointing": "full"}),
]


@pytest.mark.parametrize(("stack", "changes"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_values_inside_the_limits_are_accepted(stack, changes):
    secrets = NO_GRAFANA if changes.get("observability.enabled") is False else SECRETS
    assert problems(changed(stack, changes), secrets) == {}


@pytest.mark.parametrize("rule", settings_rules.RULES, ids=lambda r: r.__name__)
def test_every_rule_is_needed(rule, monkeypatch):
    """Removing any one rule makes at least one case above go unreported: no rule is untested."""
    monkeypatch.setattr(settings_rules, "RULES", list(settings_rules.RULES))  # restored afterwards
    rules = settings_rules.RULES
    index = rules.index(rule)
    rules[index] = lambda s: []
    monkeypatch.setattr(settings_parser, "RULES", rules)
    missed = [case for case, stack, changes, secrets, key, reason in CASES
              if not any(reason in m for m in problems(changed(stack, changes), secrets).get(key, []))]
    assert missed, f"no case needs {rule.__name__}"


def test_reservation_only_is_a_property_of_the_profile(monkeypatch):
    """Checked against the profile table, not the profile's name: a profile marked
    reservation-only is refused without a reservation, and p4de unmarked would be accepted."""
    p5, p4de = hardware.PROFILES["p5"], hardware.PROFILES["p4de"]
    monkeypatch.setitem(hardware.PROFILES, "p5", dataclasses.replace(p5, reservation_only=True))
    monkeypatch.setitem(hardware.PROFILES, "p4de", dataclasses.replace(p4de, reservation_only=False))
    no_reservation = changed("p5", {"gpuNodes.capacityReservationId": DROP})
    assert "p5.48xlarge is only sold" in problems(no_reservation)["gpuNodes.capacityReservationId"][0]
    assert problems(changed("p4de", {"gpuNodes.capacityReservationId": DROP})) == {}


# --------------------------------------------------------------------------- the training keys
# The job's training keys are checked by the package's own rules (training/config.py's
# problems()), the ones the pod applies; the stack names them by their stack key.
TRAINING_REFUSED = [
    ("model", " ", "must name a model"),
    ("dataset", "", "must name a dataset or a file"),
    ("seqLen", 7, "must be at least 8"),
    ("epochs", 0, "must be >= 1"),
    ("maxSteps", 0, "must be >= 1 when set"),
    ("batchSize", 0, "must be >= 1"),
    ("gradAccum", 0, "must be >= 1"),
    ("seed", -1, "must be >= 0"),
    ("logEvery", 0, "must be >= 1"),
    ("learningRate", 0.0, "must be in (0, 1)"),
    ("learningRate", 1.0, "must be in (0, 1)"),
    ("warmupSteps", -1, "must be >= 0"),
    ("minLrRatio", -0.1, "must be in [0, 1]"),
    ("minLrRatio", 1.5, "must be in [0, 1]"),
    ("weightDecay", -0.1, "must be >= 0"),
    ("maxGradNorm", -1.0, "must be >= 0"),
    ("hsdpShardSize", -1, "must be >= 0"),
    ("float8Recipe", "rowwise", "only applies with job.precision fp8 (got job.precision auto)"),
    ("checkpointEvery", -1, "must be >= 0"),
    ("keepCheckpoints", 0, "must be >= 1"),
    ("dataset", "s3://bucket/train.jsonl", "is a URL, and the job reads a local path or a Hugging Face dataset"),
]


@pytest.mark.parametrize(("key", "value", "reason"), TRAINING_REFUSED, ids=lambda v: str(v))
def test_each_training_rule_names_its_stack_key(key, value, reason):
    found = problems(changed("p5", {f"job.{key}": value}))
    assert any(m.startswith(f"fsdp-eks:job.{key} = {value!r}: {reason}") for m in found.get(f"job.{key}", [])), found


TRAINING_ACCEPTED = {
    "seqLen": 8, "maxSteps": 1, "seed": 0, "epochs": 1, "batchSize": 1, "gradAccum": 1, "logEvery": 1,
    "learningRate": 0.5, "warmupSteps": 0, "minLrRatio": 0.0, "weightDecay": 0.0, "maxGradNorm": 0.0,
    "checkpointEvery": 0, "keepCheckpoints": 1,
}
"""The value at each training limit, which the package accepts."""


@pytest.mark.parametrize(("key", "value"), [*TRAINING_ACCEPTED.items(), ("minLrRatio", 1.0)], ids=str)
def test_training_values_at_their_limits_are_accepted(key, value):
    assert problems(changed("p5", {f"job.{key}": value})) == {}


@pytest.mark.parametrize("shard", [8, 16, 4])
def test_hsdp_shard_size_is_accepted_with_hybrid_shard(shard):
    """Divisors of the 16 GPUs (2 x p5's 8): one node's GPUs, the whole world, half a node."""
    config = changed("p5", {"job.sharding": "HYBRID_SHARD", "job.hsdpShardSize": shard})
    assert problems(config) == {}
    assert [w for w in settings_parser.settings_warnings(parse(config)) if w.key == "job.hsdpShardSize"] == []


# --------------------------------------------------------------------------- warnings
def warnings_on(key: str, config: dict) -> list[str]:
    """The preview warnings on ``key`` of settings that are accepted."""
    assert problems(config) == {}, problems(config)
    return [str(w) for w in settings_parser.settings_warnings(parse(config)) if w.key == key]


def test_hsdp_shard_groups_across_node_boundaries_are_a_warning():
    """6 GPUs per node x 2 nodes = 12, shard size 4: divides the world (accepted), but every
    other group spans two nodes (4 does not divide 6): a warning naming both numbers."""
    config = changed("p5", {"job.gpusPerNode": 6, "job.sharding": "HYBRID_SHARD", "job.hsdpShardSize": 4,
                            "job.activationCheckpointing": "full"})
    [warning] = warnings_on("job.hsdpShardSize", config)
    assert "job.hsdpShardSize = 4: does not divide the 6 GPUs per node" in warning


@pytest.mark.parametrize("changes, warned", [
    ({"job.efaPerNode": 0}, True),
    ({"job.efaPerNode": 0, "job.nodes": 1, "job.minNodes": 1, "job.maxNodes": 2}, True),  # elastic up to 2
    ({"job.efaPerNode": 0, "job.nodes": 1}, False),
    ({"job.efaPerNode": 1}, False),
])
def test_a_multi_node_job_without_efa_is_a_warning(changes, warned):
    """docs/design.md#gpu-nodes-and-efa: without EFA, NCCL between nodes falls back to TCP
    (`via NET/Socket`). efaPerNode 0 is accepted (0..32 on p5), and preview warns whenever
    the job can span two nodes; one node, or any EFA at all, gets no warning."""
    found = warnings_on("job.efaPerNode", changed("p5", changes))
    assert bool(found) == warned, found
    if warned:
        assert "without EFA: its collectives between nodes run over TCP sockets instead of the 32 EFA" in found[0]


@pytest.mark.parametrize("seq_len, warned", [(8192, True), (4096, False)])
def test_a_sequence_beyond_the_models_trained_context_is_a_warning(seq_len, warned):
    """Llama-2-7b-hf's config.json: max_position_embeddings 4096. At 8192 (fitting in memory with
    batch 1 and full activation checkpointing) preview warns, saying that the fine-tune has no
    RoPE-scaling option; at 4096 it does not."""
    config = changed("p5", {"job.seqLen": seq_len, "job.batchSize": 1, "job.activationCheckpointing": "full"})
    found = warnings_on("job.seqLen", config)
    assert bool(found) == warned, found
    if warned:
        assert "meta-llama/Llama-2-7b-hf was trained at 4,096 positions" in found[0]
        assert "no RoPE-scaling option" in found[0]
