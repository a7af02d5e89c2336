"""Run the whole Pulumi program offline, under mocks that answer like AWS.

``run_program`` runs ``build_stack(load_settings())`` exactly as ``pulumi up`` would and records
every registration with its inputs (camelCase, as the engine sees them). The tests assert on
that recording; ``make demo`` prints it as a plan and writes the Kubernetes objects as YAML.
No AWS account, Pulumi CLI or provider plugin is involved.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import config as runtime_config
from pulumi.runtime import mocks as pulumi_mocks

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
FAKE_ACCOUNT = "123456789012"
# Stand-ins for the secrets a user sets with `pulumi config set --secret` (never committed).
DUMMY_SECRETS = {"fsdp-eks:hfToken": "hf_dummy_token_offline", "fsdp-eks:grafanaAdminPassword": "dummy-grafana-pw"}


EXAMPLE_RESERVATION_ID = "cr-0123456789abcdef0"
"""A made-up capacity reservation id, for the offline plan only."""
OFFLINE_EXAMPLES: dict[str, dict[str, dict[str, Any]]] = {
    # p4de.24xlarge is sold only through capacity reservations, so the p4de stack file carries
    # no id (a made-up one passes preview and fails half an hour into `pulumi up`): preview asks
    # for the user's. The offline plan fills in this example where the stack file has none.
    "p4de": {"gpuNodes": {"capacityReservationId": EXAMPLE_RESERVATION_ID}},
}
"""Profile -> section -> key: example values the offline plan (never `pulumi up`) supplies for
what each user must set themselves, when the stack file leaves them out."""


def offline_examples(config: dict[str, Any]) -> dict[str, Any]:
    """The example values ``config`` lacks, as ``{"section.key": value}`` (what the plan prints)."""
    examples = {}
    for section, values in OFFLINE_EXAMPLES.get(config.get("fsdp-eks:profile", ""), {}).items():
        given = config.get(f"fsdp-eks:{section}", {})
        examples.update({f"{section}.{k}": v for k, v in values.items() if k not in given})
    return examples


def stack_file_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` as committed (values parsed)."""
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def stack_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` plus dummy secrets and the offline
    examples it lacks (values parsed)."""
    config = stack_file_config(stack)
    committed = [k for k, v in config.items() if isinstance(v, dict) and "secure" in v]
    if committed:
        raise ValueError(f"Pulumi.{stack}.yaml commits encrypted values for {committed}: remove them")
    for dotted, value in offline_examples(config).items():
        section, key = dotted.split(".", 1)
        config[f"fsdp-eks:{section}"] = {**config.get(f"fsdp-eks:{section}", {}), key: value}
    return {**config, **DUMMY_SECRETS}


EXAMPLE_ZONE_IDS: dict[str, dict[str, str]] = {
    "us-west-2": {"us-west-2a": "usw2-az2", "us-west-2b": "usw2-az1", "us-west-2c": "usw2-az3",
                  "us-west-2d": "usw2-az4"},
    "us-east-1": {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2",
                  "us-east-1d": "use1-az4", "us-east-1e": "use1-az3", "us-east-1f": "use1-az5"},
}
"""AZ name -> zone id, as ``aws ec2 describe-availability-zones`` answers one account: an
EXAMPLE. Each account maps names to physical zones differently (us-east-1e is use1-az3, where EKS
places no control plane, only in this table)."""
EXAMPLE_OFFERINGS: dict[tuple[str, str], tuple[str, ...]] = {
    ("us-west-2", "p5.48xlarge"): ("us-west-2a", "us-west-2c"),
    ("us-west-2", "p4de.24xlarge"): ("us-west-2b",),
    ("us-east-1", "p5.48xlarge"): ("us-east-1a", "us-east-1d"),
    ("us-east-1", "p4de.24xlarge"): ("us-east-1a", "us-east-1c"),
}
"""(region, instance type) -> AZ names that offer it (``describe-instance-type-offerings
--location-type availability-zone``): an EXAMPLE, not what any account is offered."""


EXAMPLE_P_INSTANCE_QUOTAS: dict[str, float] = {"us-west-2": 384.0, "us-east-1": 384.0}
"""Region -> "Running On-Demand P instances" quota (vCPUs; ``get-service-quota --quota-code
L-417A185B``): an EXAMPLE of an account raised to two p5.48xlarge. New accounts often have 0."""
EXAMPLE_CALLER_ROLE = f"arn:aws:iam::{FAKE_ACCOUNT}:role/fsdp-eks-deployer"
"""The IAM role the offline run deploys as (its session: ``assumed-role/fsdp-eks-deployer/...``)."""


def example_addon_versions() -> dict[tuple[str, str], str]:
    """(add-on, Kubernetes version) -> the newest build EKS offers: an EXAMPLE account where every
    pin of components/versions.py is the newest build (what ``get_addon_version`` answers offline)."""
    from components.versions import EKS_ADDONS

    return {(addon, k8s): pin for k8s, pins in EKS_ADDONS.items() for addon, pin in pins.items()}


@dataclass
class Registration:
    """One resource as the engine saw it."""

    type: str
    name: str
    inputs: dict[str, Any]
    provider: str | None
    dependencies: list[str] = field(default_factory=list)
    """Names of the resources it waits for (``depends_on`` and the resources its inputs come from)."""
    delete_before_replace: bool = False
    """Its ``delete_before_replace`` option: a replacement deletes the old one first."""
    urn: str = ""
    """Its URN, as the engine builds it: the parent's type chain, its type, its name."""
    parent: str = ""
    """Its parent's URN."""
    aliases: list[str] = field(default_factory=list)
    """The URNs of its ``aliases`` option (what a stack's state may still know it by); those it
    inherits from its parent's aliases are not listed."""


@dataclass
class Recording:
    """What one run of the program registered and exported."""

    resources: list[Registration]
    exports: dict[str, Any] = field(default_factory=dict)
    secret_exports: set[str] = field(default_factory=set)

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> Registration:
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {type_} {name or ''}, found {[r.name for r in found]}"
        return found[0]

    def named(self, name: str) -> Registration:
        found = [r for r in self.resources if r.name == name]
        assert len(found) == 1, f"expected one resource named {name}, found {len(found)}"
        return found[0]


def fake_kubeconfig(cluster: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [{"name": cluster}]})


class AwsLikeMocks(pulumi.runtime.Mocks):
    """Answers like AWS would: ids, ARNs, and the outputs our components read."""

    def __init__(self, region: str, zone_ids: dict[str, dict[str, str]] | None = None,
                 offerings: dict[tuple[str, str], tuple[str, ...]] | None = None,
                 p_instance_quotas: dict[str, float] | None = None,
                 addon_versions: dict[tuple[str, str], str] | None = None,
                 caller_role: str = EXAMPLE_CALLER_ROLE, clusters: tuple[str, ...] = ()):
        self.region = region
        self.registrations: list[Registration] = []
        self.zone_ids = EXAMPLE_ZONE_IDS if zone_ids is None else zone_ids
        """How the AZ invokes answer: region -> AZ name -> zone id."""
        self.offerings = EXAMPLE_OFFERINGS if offerings is None else offerings
        """How the offerings invoke answers: (region, instance type) -> AZ names."""
        self.p_instance_quotas = EXAMPLE_P_INSTANCE_QUOTAS if p_instance_quotas is None else p_instance_quotas
        """How the quota invoke answers: region -> P-instance vCPUs."""
        self.addon_versions = example_addon_versions() if addon_versions is None else addon_versions
        """How the add-on version invoke answers: (add-on, Kubernetes version) -> newest build."""
        self.caller_role = caller_role
        """The role behind the caller's session (``get_session_context``'s issuer)."""
        self.clusters = clusters
        """EKS clusters that exist in the region (none: every run creates its cluster)."""

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
        if args.token == "aws:index/getRegion:getRegion":
            return {"region": self.region, "name": self.region}
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            zones = self.zone_ids.get(args.args.get("region") or self.region, {})
            return {"names": list(zones), "zoneIds": list(zones.values()), "id": self.region}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            region = args.args.get("region") or self.region
            wanted = [v for f in args.args.get("filters", []) if f["name"] == "instance-type" for v in f["values"]]
            found = [(az, t) for t in wanted for az in self.offerings.get((region, t), ())]
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
        self.identities[key] = (self.make_urn(request.parent, request.type, request.name), request.parent,
                                [self._alias_urn(a, request) for a in request.aliases])
        return super().RegisterResource(request)


def run_program(config: dict[str, Any], stack: str = "test", mocks: AwsLikeMocks | None = None) -> Recording:
    """Run ``build_stack(load_settings())`` with ``config`` (keys with namespace, values parsed);
    ``mocks``: how AWS answers (default: ``AwsLikeMocks`` with the example tables)."""
    from components.settings import SECRET_KEYS
    from components.settings_parser import load_settings
    from components.stack import build_stack

    flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    secret_keys = [f"fsdp-eks:{k}" for k in SECRET_KEYS]
    runtime_config.set_all_config(flat, secret_keys)
    region = config.get("aws:region", "us-west-2")
    mocks = mocks or AwsLikeMocks(region)
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
        registration.urn, registration.parent, registration.aliases = monitor.identities[
            (registration.type, registration.name)]
    return recording


# --------------------------------------------------------------------------- the offline plan

SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"  # how the engine marks a secret value
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
MASK = "[secret]"


def is_secret_value(value: Any) -> bool:
    """True for a value the engine received as a Pulumi secret."""
    return isinstance(value, dict) and value.get(SECRET_SIG_KEY) == SECRET_SIG


def masked(value: Any) -> Any:
    """``value`` with every secret replaced by a mask: what may be printed or written."""
    if is_secret_value(value):
        return MASK
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the engine passes every number as a float
    return value


def kubernetes_objects(recording: Recording) -> list[dict[str, Any]]:
    """The Kubernetes objects of a run, as a ``kubectl apply`` would see them (secrets masked).

    Helm releases and kustomize directories are rendered by their tools at deploy time; they
    appear here as their inputs (chart, version, values), not as manifests.
    """
    objects = []
    for r in recording.resources:
        if not r.type.startswith("kubernetes:") or r.type.startswith(("kubernetes:helm.sh", "kubernetes:kustomize")):
            continue
        group_version, kind = r.type[len("kubernetes:"):].split(":")
        group, version = group_version.split("/")
        body = masked(r.inputs)
        body.setdefault("apiVersion", version if group == "core" else f"{group}/{version}")
        body.setdefault("kind", kind)
        objects.append(body)
    return objects


def _summary(r: Registration) -> str:
    """Key settings of a resource: its scalar inputs, and the size of its lists."""
    parts = []
    meta = r.inputs.get("metadata")
    if isinstance(meta, dict) and "name" in meta:  # a Kubernetes object: where it lives
        parts.append(f"{meta.get('namespace', '')}/{meta['name']}".lstrip("/"))
    for key, value in sorted(masked(r.inputs).items()):
        if isinstance(value, (str, int, bool)) and len(str(value)) <= 80 and key not in ("__self__",):
            parts.append(f"{key}={value}")
        elif isinstance(value, list) and value and key in ("networkInterfaces", "subnetIds", "instanceTypes", "taints"):
            parts.append(f"{key}=[{len(value)}]" if key == "networkInterfaces" else f"{key}={value}")
    return ", ".join(parts)


def print_plan(recording: Recording, stack: str, examples: dict[str, Any] | None = None) -> None:
    """One line per resource, grouped by component, with its key settings; ``examples``: the
    example values the plan used in place of the user's (``offline_examples``), labelled."""
    print(f"Plan of stack {stack}: {len(recording.resources)} resources (offline, under mocks)")
    for dotted, value in (examples or {}).items():
        print(f"  EXAMPLE value, offline plan only: {dotted} = {value} "
              f"(for pulumi up set yours: pulumi config set --path {dotted} <value>)")
    for r in sorted(recording.resources, key=lambda r: r.name):  # names start with their component
        print(f"  + {r.type} {r.name}")
        summary = _summary(r)
        if summary:
            print(f"      {summary}")
    print("Outputs:")
    for key, value in recording.exports.items():
        shown = MASK if key in recording.secret_exports else value
        print(f"  {key}: {shown}")


def write_manifests(recording: Recording, out: Path) -> list[Path]:
    """Write every Kubernetes object and every Helm release's values as YAML under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in kubernetes_objects(recording):
        name = obj.get("metadata", {}).get("name", "unnamed")
        path = out / f"{obj['kind'].lower()}-{name}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
        written.append(path)
    for r in recording.of_type("kubernetes:helm.sh/v3:Release"):
        path = out / f"helm-{r.name}.yaml"
        release = masked({k: r.inputs.get(k) for k in ("chart", "version", "namespace", "values")})
        path.write_text(yaml.safe_dump(release, sort_keys=False))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Render a stack's plan offline (no AWS, no Pulumi CLI).")
    parser.add_argument("--stack", default="p5", choices=STACKS, help="stack file Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, default=Path("out/p5"), help="folder for the rendered YAML")
    args = parser.parse_args(argv)
    recording = run_program(stack_config(args.stack), args.stack)
    print_plan(recording, args.stack, offline_examples(stack_file_config(args.stack)))
    written = write_manifests(recording, args.out)
    print(f"Wrote {len(written)} Kubernetes objects and Helm values to {args.out}/")
    from components import rendering

    try:
        rendered = rendering.render_stack(recording)
    except rendering.ToolMissing as missing:
        print(f"Charts not rendered: {missing}")
        return
    files = rendering.write_rendered(rendered, args.out / "rendered")
    objects = sum(len(r.objects) for r in rendered)
    print(f"Rendered {len(files)} Helm releases and kustomizations ({objects} objects) to {args.out}/rendered/")


if __name__ == "__main__":
    main()
