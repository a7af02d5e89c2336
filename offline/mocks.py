"""Run the whole Pulumi program offline, under mocks that answer like AWS.

``run_program`` runs ``build_stack(load_settings())`` exactly as ``pulumi up`` would and records
every registration with its inputs (camelCase, as the engine sees them). The tests assert on
that recording; ``make demo`` prints it as a plan and writes the Kubernetes objects as YAML.
No AWS account, Pulumi CLI or provider plugin is involved.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config
from pulumi.runtime import mocks as pulumi_mocks

from components.planning.hardware import PROFILES
from components.settings_parser import load_settings
from components.stack import build_stack
from components.versions import EKS_ADDONS
from offline.recording import Recording, Registration
from offline.stacks import is_secure

FAKE_ACCOUNT = "123456789012"

EXAMPLE_ZONE_IDS: dict[str, dict[str, str]] = {
    "us-west-2": {"us-west-2a": "usw2-az2", "us-west-2b": "usw2-az1", "us-west-2c": "usw2-az3",
                  "us-west-2d": "usw2-az4"},
    "us-east-1": {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2",
                  "us-east-1d": "use1-az4", "us-east-1e": "use1-az3", "us-east-1f": "use1-az5"},
    "us-east-2": {"us-east-2a": "use2-az1", "us-east-2b": "use2-az2", "us-east-2c": "use2-az3"},
}
"""AZ name -> zone id, as ``aws ec2 describe-availability-zones`` answers one account: an
EXAMPLE. Each account maps names to physical zones differently (us-east-1e is use1-az3, where EKS
places no control plane, only in this table)."""
EXAMPLE_OFFERINGS: dict[tuple[str, bool], tuple[str, ...]] = {
    ("us-west-2", False): ("us-west-2a", "us-west-2c"),
    ("us-west-2", True): ("us-west-2b",),
    ("us-east-1", False): ("us-east-1a", "us-east-1d"),
    ("us-east-1", True): ("us-east-1a", "us-east-1c"),
    ("us-east-2", False): ("us-east-2a", "us-east-2b"),
    ("us-east-2", True): ("us-east-2b", "us-east-2c"),
}
"""(region, sold only through reservations) -> AZ names that offer such a GPU instance type
(``describe-instance-type-offerings --location-type availability-zone``): an EXAMPLE, not what
any account is offered, keyed by the profile's ``reservation_only`` so that a new row needs no
entry here."""


EXAMPLE_P_INSTANCE_QUOTAS: dict[str, float] = {"us-west-2": 384.0, "us-east-1": 384.0, "us-east-2": 384.0}
"""Region -> "Running On-Demand P instances" quota (vCPUs; ``get-service-quota --quota-code
L-417A185B``): an EXAMPLE of an account raised to two p5.48xlarge. New accounts often have 0."""
EXAMPLE_CALLER_ROLE = f"arn:aws:iam::{FAKE_ACCOUNT}:role/fsdp-eks-deployer"
"""The IAM role the offline run deploys as (its session: ``assumed-role/fsdp-eks-deployer/...``)."""


def example_addon_versions() -> dict[tuple[str, str], str]:
    """(add-on, Kubernetes version) -> the newest build EKS offers: an EXAMPLE account where every
    pin of components/versions.py is the newest build (what ``get_addon_version`` answers offline)."""
    return {(addon, k8s): pin for k8s, pins in EKS_ADDONS.items() for addon, pin in pins.items()}


def example_offerings(region: str, instance_type: str) -> tuple[str, ...]:
    """The example offerings of a known GPU instance type (none for any other)."""
    profiles = [p for p in PROFILES.values() if p.instance_type == instance_type]
    return EXAMPLE_OFFERINGS.get((region, profiles[0].reservation_only), ()) if profiles else ()


def example_capacity_blocks(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """reservation id -> capacity block: an EXAMPLE account whose capacity block (if the stack
    names one) is active, in the stack's GPU AZ, of its instance type, with room for its nodes."""
    gpu = config.get("fsdp-eks:gpuNodes") or {}
    profile = PROFILES.get(config.get("fsdp-eks:profile", ""))
    if not gpu.get("capacityReservationId") or profile is None:
        return {}
    return {gpu["capacityReservationId"]: {
        "state": "active", "startDate": "2026-01-01T00:00:00Z", "endDate": "2099-01-01T00:00:00Z",
        "availabilityZone": gpu.get("availabilityZone", ""), "instanceType": profile.instance_type,
        "instanceCount": int(gpu.get("maxSize", gpu.get("desiredSize", 1)))}}


def fake_kubeconfig(cluster: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [{"name": cluster}]})


class AwsLikeMocks(pulumi.runtime.Mocks):
    """Answers like AWS would: ids, ARNs, and the outputs our components read."""

    def __init__(self, region: str, zone_ids: dict[str, dict[str, str]] | None = None,
                 offerings: Callable[[str, str], tuple[str, ...]] | None = None,
                 p_instance_quotas: dict[str, float] | None = None,
                 addon_versions: dict[tuple[str, str], str] | None = None,
                 caller_role: str = EXAMPLE_CALLER_ROLE, clusters: tuple[str, ...] = (),
                 capacity_blocks: dict[str, dict[str, Any]] | None = None):
        self.region = region
        self.registrations: list[Registration] = []
        self.zone_ids = EXAMPLE_ZONE_IDS if zone_ids is None else zone_ids
        """How the AZ invokes answer: region -> AZ name -> zone id."""
        self.offerings = example_offerings if offerings is None else offerings
        """How the offerings invoke answers: (region, instance type) -> AZ names."""
        self.p_instance_quotas = EXAMPLE_P_INSTANCE_QUOTAS if p_instance_quotas is None else p_instance_quotas
        """How the quota invoke answers: region -> P-instance vCPUs."""
        self.addon_versions = example_addon_versions() if addon_versions is None else addon_versions
        """How the add-on version invoke answers: (add-on, Kubernetes version) -> newest build."""
        self.caller_role = caller_role
        """The role behind the caller's session (``get_session_context``'s issuer)."""
        self.clusters = clusters
        """EKS clusters that exist in the region (none: every run creates its cluster)."""
        self.capacity_blocks = capacity_blocks or {}
        """How the capacity block invoke answers: reservation id -> its state, dates, AZ, type, count."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        inputs = dict(args.inputs)
        self.registrations.append(Registration(args.typ, args.name, inputs, args.provider))
        state = dict(inputs)
        state.setdefault("arn", f"arn:aws:mock:{self.region}:{FAKE_ACCOUNT}:{args.name}")
        state.setdefault("name", args.name)
        if args.typ == "eks:index:Cluster":
            state.update(
                kubeconfigJson=fake_kubeconfig(inputs.get("name", args.name)),
                clusterSecurityGroupId="sg-eks-cluster",
                nodeSecurityGroupId="sg-eks-node",
            )
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif args.typ == "aws:eks/nodeGroup:NodeGroup":
            state.setdefault("nodeGroupName", args.name)
            # EKS names the group's Auto Scaling group eks-<node group>-<uuid>.
            state["resources"] = [{"autoscalingGroups": [{"name": f"eks-{args.name}-0000"}]}]
        elif args.typ == "aws:ecr/repository:Repository":
            state["registryId"] = FAKE_ACCOUNT
            state["repositoryUrl"] = f"{FAKE_ACCOUNT}.dkr.ecr.{self.region}.amazonaws.com/{inputs.get('name', args.name)}"
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            state["dnsName"] = f"{args.name}-id.fsx.{self.region}.amazonaws.com"
            state["mountName"] = "mockmnt1"  # FSx: up to 8 characters
        elif args.typ == "docker-build:index:Image":
            state["ref"] = f"{inputs['tags'][0]}@sha256:{'0' * 64}"
            state["digest"] = f"sha256:{'0' * 64}"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:eks/getCluster:getCluster":
            return {
                "name": args.args["name"],
                "endpoint": "https://EXAMPLE.gr7.eks.amazonaws.com",
                "certificateAuthorities": [{"data": "Q0VSVA=="}],
                "vpcConfig": {"clusterSecurityGroupId": "sg-existing", "vpcId": "vpc-existing"},
            }
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            return {"userName": "AWS", "password": "ecr-password-secret", "proxyEndpoint": "https://ecr"}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            role = self.caller_role.rsplit("/", 1)[-1]
            return {"accountId": FAKE_ACCOUNT, "arn": f"arn:aws:sts::{FAKE_ACCOUNT}:assumed-role/{role}/session",
                    "userId": "AROAEXAMPLE:session"}
        if args.token == "aws:iam/getSessionContext:getSessionContext":
            return {"arn": args.args["arn"], "issuerArn": self.caller_role,
                    "issuerName": self.caller_role.rsplit("/", 1)[-1], "sessionName": "session"}
        if args.token == "aws:eks/getClusters:getClusters":
            return {"names": list(self.clusters), "id": self.region}
        if args.token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            region = args.args.get("region") or self.region
            return {"value": self.p_instance_quotas.get(region, 0.0), "quotaCode": args.args["quotaCode"],
                    "serviceCode": args.args["serviceCode"], "id": region}
        if args.token == "aws:eks/getAddonVersion:getAddonVersion":
            key = (args.args["addonName"], args.args["kubernetesVersion"])
            return {**args.args, "version": self.addon_versions[key], "id": args.args["addonName"]}
        if args.token == "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation":
            block = self.capacity_blocks.get(args.args["id"])
            if block is None:  # as AWS answers an unknown id: the data source fails, not the RPC
                return {}, [("id", f"InvalidCapacityReservationId.NotFound: {args.args['id']}")]
            return {**block, "id": args.args["id"], "reservationType": "capacity-block"}
        if args.token == "aws:index/getRegion:getRegion":
            return {"region": self.region, "name": self.region}
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            zones = self.zone_ids.get(args.args.get("region") or self.region, {})
            return {"names": list(zones), "zoneIds": list(zones.values()), "id": self.region}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            region = args.args.get("region") or self.region
            wanted = [v for f in args.args.get("filters", []) if f["name"] == "instance-type" for v in f["values"]]
            found = [(az, t) for t in wanted for az in self.offerings(region, t)]
            return {"locations": [az for az, _ in found], "instanceTypes": [t for _, t in found],
                    "locationTypes": ["availability-zone"] * len(found), "id": region}
        return {}


def engine_urn(parent: str, type_: str, name: str, stack: str | None = None) -> str:
    """A resource's URN as the engine builds it: the parent's whole type chain (the stack's
    excepted), then the type and the name; ``stack``: the current one. (The SDK's mock keeps only
    the parent's last type.)"""
    chain = parent.split("::")[2] if parent else "pulumi:pulumi:Stack"
    if chain != "pulumi:pulumi:Stack":
        type_ = f"{chain}${type_}"
    return f"urn:pulumi:{stack or pulumi.get_stack()}::{pulumi.get_project()}::{type_}::{name}"


class NoResourceRefsMonitor(pulumi_mocks.MockMonitor):
    """Resource references to mocked component outputs cannot be rebuilt: turn them off."""

    def SupportsFeature(self, request):
        has_support = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": has_support})

    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.dependencies: dict[tuple[str, str], list[str]] = {}
        self.delete_before_replace: set[tuple[str, str]] = set()
        self.ignore_changes: dict[tuple[str, str], list[str]] = {}
        self.identities: dict[tuple[str, str], tuple[str, str, list[str]]] = {}
        """(type, name) -> URN, parent URN, alias URNs."""

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        return engine_urn(parent, type_, name)

    def _alias_urn(self, alias, request) -> str:
        """An alias as the engine resolves it: a URN, or a spec whose unset fields are the resource's own."""
        if alias.urn:
            return alias.urn
        spec = alias.spec
        parent = "" if spec.noParent else (spec.parentUrn or request.parent)
        return self.make_urn(parent, spec.type or request.type, spec.name or request.name)

    def RegisterResource(self, request):
        # The engine's view of ordering: what this resource waits for, as resource names.
        key = (request.type, request.name)
        self.dependencies[key] = [urn.split("::")[-1] for urn in request.dependencies]
        if request.deleteBeforeReplace:
            self.delete_before_replace.add(key)
        self.ignore_changes[key] = list(request.ignoreChanges)
        self.identities[key] = (self.make_urn(request.parent, request.type, request.name), request.parent,
                                [self._alias_urn(a, request) for a in request.aliases])
        return super().RegisterResource(request)


def run_program(config: dict[str, Any], stack: str = "test", mocks: AwsLikeMocks | None = None) -> Recording:
    """Run ``build_stack(load_settings())`` with ``config`` (keys with namespace, values parsed;
    a secret as ``offline.stacks.secure`` writes it, anything else is plain text as in a stack
    file); ``mocks``: how AWS answers (default: ``AwsLikeMocks`` with the example tables)."""
    plain = {k: v["secure"] if is_secure(v) else v for k, v in config.items()}
    flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in plain.items()}
    runtime_config.set_all_config(flat, [k for k, v in config.items() if is_secure(v)])
    region = config.get("aws:region", "us-west-2")
    mocks = mocks or AwsLikeMocks(region, capacity_blocks=example_capacity_blocks(config))
    monitor = NoResourceRefsMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="fsdp-eks", stack=stack, preview=False, monitor=monitor)
    recording = Recording(mocks.registrations)

    async def collect(outputs: dict[str, Any]) -> None:
        for key, value in outputs.items():
            out = pulumi.Output.from_input(value)
            recording.exports[key] = await out.future()
            if await out.is_secret():
                recording.secret_exports.add(key)

    @pulumi.runtime.test
    def program():
        outputs = build_stack(load_settings())
        return pulumi.Output.from_input(asyncio.ensure_future(collect(outputs)))

    program()
    for registration in recording.resources:
        registration.dependencies = monitor.dependencies.get((registration.type, registration.name), [])
        registration.delete_before_replace = (registration.type, registration.name) in monitor.delete_before_replace
        registration.ignore_changes = monitor.ignore_changes.get((registration.type, registration.name), [])
        registration.urn, registration.parent, registration.aliases = monitor.identities[
            (registration.type, registration.name)]
    return recording
