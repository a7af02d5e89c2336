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
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import config as runtime_config

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
FAKE_ACCOUNT = "123456789012"
# Stand-ins for the secrets a user sets with `pulumi config set --secret` (never committed).
DUMMY_SECRETS = {"fsdp-eks:hfToken": "hf_dummy_token_offline", "fsdp-eks:grafanaAdminPassword": "dummy-grafana-pw"}


def stack_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` plus dummy secrets (values parsed)."""
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    committed = [k for k, v in config.items() if isinstance(v, dict) and "secure" in v]
    if committed:
        raise ValueError(f"Pulumi.{stack}.yaml commits encrypted values for {committed}: remove them")
    return {**config, **DUMMY_SECRETS}


@dataclass
class Registration:
    """One resource as the engine saw it."""

    type: str
    name: str
    inputs: dict[str, Any]
    provider: str | None


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

    def __init__(self, region: str):
        self.region = region
        self.registrations: list[Registration] = []

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
            return {"accountId": FAKE_ACCOUNT, "arn": "arn", "userId": "user"}
        if args.token == "aws:index/getRegion:getRegion":
            return {"region": self.region, "name": self.region}
        return {}


class NoResourceRefsMonitor(pulumi_mocks.MockMonitor):
    """Resource references to mocked component outputs cannot be rebuilt: turn them off."""

    def SupportsFeature(self, request):
        has_support = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": has_support})


def run_program(config: dict[str, Any], stack: str = "test") -> Recording:
    """Run ``build_stack(load_settings())`` with ``config`` (keys with namespace, values parsed)."""
    from components.settings import SECRET_KEYS, load_settings
    from components.stack import build_stack

    flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    secret_keys = [f"fsdp-eks:{k}" for k in SECRET_KEYS]
    runtime_config.set_all_config(flat, secret_keys)
    region = config.get("aws:region", "us-west-2")
    mocks = AwsLikeMocks(region)
    pulumi.runtime.set_mocks(mocks, project="fsdp-eks", stack=stack, preview=False, monitor=NoResourceRefsMonitor(mocks))
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
    return recording
