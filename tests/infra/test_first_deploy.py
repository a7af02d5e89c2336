"""What only a first `pulumi up` / `pulumi destroy` on AWS would show, proven the ways it can be
proven here: the dependency graph of the mock run (what each resource waits for, so the create
order and the reverse destroy order), the parsed user data, the rendered objects, the SDK's own
input types, and the zone invokes answered from tables.

Sources per fact: pulumi/pulumi-eks#1819 (CoreDNS before nodes), the EKS user guide (zones EKS
refuses, the release calendar, control-plane log group), awslabs/amazon-eks-ami nodeadm
(base runtime spec, its JSON merge), awslabs/awsome-distributed-training#647 (EFA and
RLIMIT_MEMLOCK), Helm's 300 s default timeout.
"""

from __future__ import annotations

import base64
import email
import json
from datetime import date
from pathlib import Path

import pulumi
import pulumi_eks as eks
import pytest
import yaml

from components import versions
from components.gpu_nodes import container_rlimits
from components.preflight import EKS_UNSUPPORTED_ZONE_IDS, addon_pin_problems, quota_problems, zone_problems
from components.settings import Secrets, SettingsError
from offline import plan, stacks
from offline import mocks as offline_mocks
from offline.mocks import AwsLikeMocks, example_addon_versions
from tests.harness import (
    HELM,
    Recording,
    parse,
    raw_settings,
    release,
    run_program,
    settings_error,
    stack_config,
    variant_config,
    waits_for,
)
from training import dist

ADDON = "aws:eks/addon:Addon"
ROOT = Path(__file__).resolve().parents[2]


def addon(recording: Recording, addon_name: str):
    [found] = [r for r in recording.of_type(ADDON) if r.inputs["addonName"] == addon_name]
    return found


@pytest.fixture(scope="module")
def with_cloudwatch() -> Recording:
    return run_program(variant_config("p5", observability={"cloudwatchContainerInsights": True}), "p5-cw")


# --------------------------------------------------------------------------- 1. CoreDNS after nodes


def test_the_sdk_turns_coredns_on_when_only_a_version_is_given():
    """Checked against the pulumi-eks 4.4 SDK's own input type: why `enabled=False` is explicit."""
    assert eks.CoreDnsAddonOptionsArgs(version="v1.0.0-eksbuild.1").enabled is True
    assert eks.CoreDnsAddonOptionsArgs(enabled=False).enabled is False


def test_coredns_is_ours_and_waits_for_the_system_nodes(recording: Recording, stack: str):
    """pulumi/pulumi-eks#1819: the add-on inside eks.Cluster has no node to run on."""
    cluster = recording.one("eks:index:Cluster").inputs
    assert cluster["corednsAddonOptions"]["enabled"] is False
    coredns = addon(recording, "coredns")
    version = stack_config(stack)["fsdp-eks:cluster"]["kubernetesVersion"]
    assert coredns.inputs["addonVersion"] == versions.EKS_ADDONS[version]["coredns"]
    assert "cluster-system" in waits_for(recording, coredns.name)


def test_every_addon_that_runs_pods_waits_for_nodes(with_cloudwatch: Recording):
    """CoreDNS, EBS CSI and CloudWatch run Deployments: created before a node, they are DEGRADED."""
    for name in ("coredns", "aws-ebs-csi-driver", "amazon-cloudwatch-observability"):
        assert "cluster-system" in waits_for(with_cloudwatch, addon(with_cloudwatch, name).name), name


def test_every_addon_overwrites_what_eks_bootstrapped(with_cloudwatch: Recording):
    """CreateAddon over the self-managed CoreDNS (kube-proxy, VPC CNI) EKS installs "might fail"
    without OVERWRITE (EKS API reference, CreateAddon resolveConflicts; eksctl #5880)."""
    addons = with_cloudwatch.of_type(ADDON)
    assert {"coredns", "eks-pod-identity-agent", "eks-node-monitoring-agent", "aws-ebs-csi-driver",
            "amazon-cloudwatch-observability"} <= {a.inputs["addonName"] for a in addons}
    for a in addons:
        assert a.inputs.get("resolveConflictsOnCreate") == "OVERWRITE", a.inputs["addonName"]
        # A pin bump is an UpdateAddon: the same resolution, or it may fail on a changed field.
        assert a.inputs.get("resolveConflictsOnUpdate") == "OVERWRITE", a.inputs["addonName"]


def test_node_groups_wait_for_the_node_role_policies_not_for_coredns(recording: Recording):
    """A node that boots before its CNI/worker policies are attached never joins; the GPU nodes
    start beside the system nodes instead of after CoreDNS."""
    policies = {r.name for r in recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r.name.startswith("cluster-node-role-")}
    assert len(policies) == 4
    for group in ("cluster-system", "gpu-gpu"):
        assert policies <= waits_for(recording, group), group
    assert "cluster-coredns" not in waits_for(recording, "gpu-gpu")


# --------------------------------------------------------------------------- 3. zones


def test_zone_problems_refuse_eks_unsupported_zone_ids_and_unoffered_gpu_azs():
    """Checked against zone tables: names resolve to ids per account; the GPU AZ must offer the
    instance type, and the message names where it is offered."""
    settings = parse(raw_settings("p4de"), stack="p4de")
    ids = {"us-east-1a": "use1-az3", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2", "us-east-1d": "use1-az4"}
    problems = {(p.key, p.value): p.fix for p in zone_problems(settings, ids, ["us-east-1c", "us-east-1d"])}
    assert "use1-az3" in EKS_UNSUPPORTED_ZONE_IDS
    assert "is zone use1-az3" in problems[("network.availabilityZones", "us-east-1a")]
    assert "us-east-1c, us-east-1d" in problems[("gpuNodes.availabilityZone", "us-east-1a")]
    assert len(problems) == 2
    assert zone_problems(settings, ids | {"us-east-1a": "use1-az6"}, ["us-east-1a"]) == [], "the case that passes"


def refused(config: dict, stack: str, **account) -> tuple[str, list]:
    """The preview's error for ``config`` in an account that answers as ``account`` says
    (``AwsLikeMocks``' tables; the example tables otherwise), and what it registered."""
    mocks = AwsLikeMocks(config["aws:region"], **account)
    with pytest.raises(SettingsError) as info:
        run_program(config, stack, mocks=mocks)
    return str(info.value), mocks.registrations


def test_preview_refuses_a_control_plane_zone_eks_does_not_support():
    """Under mocks the AZ invoke answers from the example table (us-east-1e is use1-az3 there)."""
    config = variant_config("p4de", network={"availabilityZones": ["us-east-1a", "us-east-1e"]})
    message, created = refused(config, "p4de-az3")
    assert "fsdp-eks:network.availabilityZones = 'us-east-1e': is zone use1-az3" in message
    assert created == [], "refused before any resource"


def test_preview_refuses_a_gpu_az_without_the_instance_type_and_names_where_it_is():
    config = variant_config("p5", gpuNodes={"availabilityZone": "us-west-2b"})
    message, created = refused(config, "p5-no-offer")
    assert "fsdp-eks:gpuNodes.availabilityZone = 'us-west-2b': p5.48xlarge is not offered" in message
    assert "offered in: us-west-2a, us-west-2c" in message
    assert created == []


def test_what_the_account_says_comes_with_the_stack_files_problems():
    """One preview: a stack file with problems of its own (a malformed CIDR, an unpinned
    Kubernetes version) and a GPU AZ the account is not offered the instance in (the example
    offerings: p5.48xlarge in us-west-2a and 2c) lists all of them, not the file's first and the
    account's at the next run. What names a key already refused (an AZ of another region) is not
    asked again; an unknown profile or region asks the account nothing."""
    config = variant_config("p5", network={"vpcCidr": "10.0.0/16"}, cluster={"kubernetesVersion": "1.20"},
                            gpuNodes={"availabilityZone": "us-west-2b"})
    message, created = refused(config, "p5-both")
    assert "fsdp-eks:network.vpcCidr = '10.0.0/16'" in message
    assert "fsdp-eks:cluster.kubernetesVersion = '1.20'" in message
    assert "fsdp-eks:gpuNodes.availabilityZone = 'us-west-2b': p5.48xlarge is not offered" in message
    assert created == []
    config = variant_config("p5", network={"vpcCidr": "10.0.0/16"}, gpuNodes={"availabilityZone": "eu-west-1a"})
    message, _ = refused(config, "p5-other-region")
    assert "is not offered" not in message and "eu-west-1a': give an AZ name of the stack's region" in message
    message, _ = refused(variant_config("p5", profile="zz9-test", gpuNodes={"availabilityZone": "us-west-2b"}), "p5-zz9-test")
    assert "is not offered" not in message and "fsdp-eks:profile = 'zz9-test'" in message


class NoCredentials(AwsLikeMocks):
    """An account that cannot be asked: every invoke fails as the AWS provider fails one without
    credentials (an error in the invoke's response, which the SDK raises at the call)."""

    def call(self, args):
        return {}, [("", "no valid credential sources found")]


def test_a_stack_files_problems_do_not_wait_for_the_account(monkeypatch):
    """Without credentials the account's checks fail; the file's own problems are still listed,
    alone, with a warning that the account was not asked."""
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    config = variant_config("p5", network={"vpcCidr": "10.0.0/16"})
    with pytest.raises(SettingsError) as info:
        run_program(config, "p5-no-credentials", mocks=NoCredentials("us-west-2"))
    assert [p.key for p in info.value.problems] == ["network.vpcCidr"]
    assert any("the AWS account was not asked" in w and "no valid credential sources" in w for w in warned), warned


# --------------------------------------------------------------------------- GPU quota, creator, add-on pins


def test_preview_refuses_on_demand_gpus_beyond_the_p_instance_quota():
    """Checked against the P5 instance page (192 vCPUs per p5.48xlarge) and the quota's unit
    (vCPUs of running P instances, L-417A185B): two nodes need 384; an account with 192 gets
    told before the NAT gateways and the cluster bill."""
    config = variant_config("p5")
    message, created = refused(config, "p5-quota", p_instance_quotas={"us-west-2": 192.0})
    assert "fsdp-eks:gpuNodes.desiredSize = 2: 2 x p5.48xlarge needs 384 vCPUs" in message
    assert "quota in us-west-2 is 192 vCPUs" in message and "--quota-code L-417A185B" in message
    assert created == []


def test_a_reserved_group_beyond_the_quota_is_a_warning_only(monkeypatch):
    """p4de launches into its reservation: 2 x 96 vCPUs (P4 instance page) over a quota of 0 warns."""
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    config = variant_config("p4de")
    run_program(config, "p4de-quota", mocks=AwsLikeMocks("us-east-1", p_instance_quotas={"us-east-1": 0.0}))
    assert any("gpuNodes.desiredSize = 2: 2 x p4de.24xlarge is 192 vCPUs" in w for w in warned), warned


def test_quota_problems_warn_when_only_max_size_does_not_fit():
    settings = parse(raw_settings("p5") | {"gpuNodes": {**raw_settings("p5")["gpuNodes"], "maxSize": 4}})
    problems, warnings = quota_problems(settings, 384.0)
    assert problems == [] and [w.key for w in warnings] == ["gpuNodes.maxSize"]
    assert quota_problems(settings, 768.0) == ([], [])


def test_preview_refuses_the_deploying_role_in_the_access_lists():
    """pulumi/pulumi-eks#2373: EKS gave the creator an access entry; ours for it fails with 409.
    The role is matched by account and name, whatever path the list gives it."""
    me = "arn:aws:iam::123456789012:role/ml/team-admin"
    config = variant_config("p5", cluster={"adminRoleArns": [me, "arn:aws:iam::123456789012:role/other"]})
    message, created = refused(config, "p5-creator", caller_role="arn:aws:iam::123456789012:role/team-admin")
    assert f"fsdp-eks:cluster.adminRoleArns = '{me}': the role this deployment runs as" in message
    assert "role/other" not in message and created == []
    # Once the cluster exists its creator entry is settled: no refusal for whoever runs later.
    run_program(config, "p5-creator-later", mocks=AwsLikeMocks(
        "us-west-2", caller_role="arn:aws:iam::123456789012:role/team-admin", clusters=("fsdp-eks-p5-creator-later",)))


def test_preview_refuses_an_addon_pin_eks_does_not_offer_for_the_version():
    """An add-on table where EKS's newest coredns for 1.36 is older than the pin: refused with the
    command that lists the builds."""
    newest = example_addon_versions() | {("coredns", "1.36"): "v1.13.0-eksbuild.1"}
    message, created = refused(variant_config("p5"), "p5-pins", addon_versions=newest)
    pin = versions.EKS_ADDONS["1.36"]["coredns"]
    assert f"pins coredns {pin}, which EKS does not offer for Kubernetes 1.36 (its newest: v1.13.0-eksbuild.1)" in message
    assert "aws eks describe-addon-versions --kubernetes-version 1.36 --addon-name coredns" in message
    assert created == []


@pytest.mark.parametrize("insights", [False, True])
def test_preview_asks_only_about_the_addons_the_stack_creates(insights):
    """With Container Insights off the stack creates no CloudWatch add-on: a region whose EKS has
    no build of it as new as the pin must not fail preview; with it on, the same table is refused."""
    newest = example_addon_versions() | {("amazon-cloudwatch-observability", "1.36"): "v0.0.1-eksbuild.1"}
    config = variant_config("p5", observability={"cloudwatchContainerInsights": insights})
    if insights:
        message, _ = refused(config, "p5-cw-pin", addon_versions=newest)
        assert "pins amazon-cloudwatch-observability" in message
    else:
        run_program(config, "p5-no-cw-pin", mocks=AwsLikeMocks(config["aws:region"], addon_versions=newest))


def test_addon_pin_versions_compare_by_number_not_text():
    """v1.10 is newer than v1.9 (a text comparison says otherwise)."""
    assert addon_pin_problems("1.36", {a: "v99.0.0-eksbuild.1" for a in versions.EKS_ADDONS["1.36"]}) == []
    newest = {a: "v0.0.1-eksbuild.1" for a in versions.EKS_ADDONS["1.36"]}
    assert len(addon_pin_problems("1.36", newest)) == len(versions.EKS_ADDONS["1.36"])


def test_p4de_stack_file_carries_no_reservation_and_preview_asks_for_it():
    """A made-up id passes preview and fails half an hour into `up`: the file has none, preview
    says how to set yours, and only the offline plan fills in a labelled example."""
    committed = stacks.stack_file_config("p4de")["fsdp-eks:gpuNodes"]
    assert "capacityReservationId" not in committed
    raw = {k.split(":", 1)[1]: v for k, v in stacks.stack_file_config("p4de").items() if k.startswith("fsdp-eks:")}
    message = str(settings_error(raw, stack="p4de"))
    assert "gpuNodes.capacityReservationId = None" in message
    assert "pulumi config set --path gpuNodes.capacityReservationId" in message
    assert stack_config("p4de")["fsdp-eks:gpuNodes"]["capacityReservationId"] == stacks.EXAMPLE_RESERVATION_ID


def test_the_offline_plan_labels_the_example_reservation(capsys):
    examples = stacks.offline_examples(stacks.stack_file_config("p4de"))
    assert examples == {"gpuNodes.capacityReservationId": stacks.EXAMPLE_RESERVATION_ID}
    plan.print_plan(Recording([]), "p4de", examples)
    assert f"EXAMPLE value, offline plan only: gpuNodes.capacityReservationId = {stacks.EXAMPLE_RESERVATION_ID}" in (
        capsys.readouterr().out)
    assert stacks.offline_examples(stacks.stack_file_config("p5")) == {}


# --------------------------------------------------------------------------- 4. locked memory for EFA


def node_config(recording: Recording) -> dict:
    data = base64.b64decode(recording.one("aws:ec2/launchTemplate:LaunchTemplate", "gpu-lt").inputs["userData"])
    [part] = [p for p in email.message_from_bytes(data).walk() if p.get_content_type() == "application/node.eks.aws"]
    return yaml.safe_load(part.get_payload())


def test_gpu_containers_get_unbounded_locked_memory_and_keep_the_amis_open_files(recording: Recording):
    """Checked against nodeadm: base-runtime-spec.json sets only RLIMIT_NOFILE 65536/1048576, and
    lists replace in its merge, so the whole list is written; MEMLOCK must beat any instance's RAM."""
    rlimits = node_config(recording)["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]
    by_type = {r["type"]: (r["soft"], r["hard"]) for r in rlimits}
    assert by_type["RLIMIT_NOFILE"] == (65536, 1048576)
    soft, hard = by_type["RLIMIT_MEMLOCK"]
    assert soft == hard >= 2**50, "at least 1 PiB: more than any instance can lock"
    assert node_config(recording)["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"


def test_every_rlimit_survives_nodeadms_float64_merge():
    """nodeadm merges baseRuntimeSpec through json into map[string]interface{} (float64): a value
    that does not round-trip (RLIM_INFINITY, 2**64-1, becomes 2**64) breaks containerd's uint64."""
    for r in container_rlimits():
        for key in ("soft", "hard"):
            value = r[key]
            assert json.loads(json.dumps(float(value))) == value and value < 2**64, (r["type"], key)


def test_worker_stops_on_efa_with_a_small_memlock_limit_and_names_the_fix():
    """Checked against awsome-distributed-training#647 (65536 KiB fails)."""
    gib = 2**30
    problem = dist.locked_memory_problem(65536 * 1024, efa=True, mem_total_bytes=2048 * gib)
    assert problem and "ulimit -l) is 65536 KiB" in problem and "baseRuntimeSpec" in problem
    assert dist.locked_memory_problem(dist.RLIM_INFINITY, efa=True, mem_total_bytes=2048 * gib) is None
    assert dist.locked_memory_problem(10**18, efa=True, mem_total_bytes=2048 * gib) is None
    assert dist.locked_memory_problem(65536 * 1024, efa=False, mem_total_bytes=2048 * gib) is None


def test_worker_logs_ulimit_and_sees_efa_devices(tmp_path, capsys):
    (tmp_path / "uverbs0").touch()
    dist.check_locked_memory(tmp_path)
    assert "ulimit -l: " in capsys.readouterr().err
    assert dist.check_locked_memory(tmp_path / "none") is None, "no EFA device: no problem"


def test_finetune_checks_locked_memory_before_anything_else(monkeypatch, capsys):
    from training import finetune

    monkeypatch.setattr(finetune, "check_locked_memory", lambda: "too little locked memory")
    monkeypatch.setattr(finetune, "init_distributed", lambda: pytest.fail("joined the job before the check"))
    assert finetune.main(["--max-steps", "1"]) == 1
    assert "error: too little locked memory" in capsys.readouterr().err


# --------------------------------------------------------------------------- 5. Helm and ordering


def test_every_helm_release_waits_long_enough_for_a_node(recording: Recording):
    for r in recording.of_type(HELM):
        assert r.inputs["atomic"] is True and int(r.inputs["timeout"]) >= 600, r.name


def test_every_in_cluster_layer_waits_for_system_nodes_and_dns(recording: Recording):
    """The graph: every Kubernetes object and release waits for the system nodes and CoreDNS."""
    in_cluster = [r for r in recording.resources if r.type.startswith("kubernetes:")
                  and not r.type.startswith("pulumi:providers")]
    assert len(in_cluster) > 10
    for r in in_cluster:
        assert {"cluster-system", "cluster-coredns"} <= waits_for(recording, r.name), f"{r.type} {r.name}"


def test_device_plugins_wait_for_the_gpu_nodes(recording: Recording):
    for r in recording.of_type(HELM):
        if r.name.startswith("device-plugins-"):
            assert "gpu-gpu" in waits_for(recording, r.name), r.name


# --------------------------------------------------------------------------- 6. versions and cost


def test_stacks_use_the_newest_version_with_a_support_end_and_every_pin():
    newest = max(versions.SUPPORTED_KUBERNETES_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))
    assert versions.DEFAULT_KUBERNETES_VERSION == newest == "1.36"
    for stack in ("p5", "p4de"):
        assert stack_config(stack)["fsdp-eks:cluster"]["kubernetesVersion"] == newest, stack
    names = set(versions.EKS_ADDONS["1.33"])
    for version, pins in versions.EKS_ADDONS.items():
        assert set(pins) == names, version
        assert version in versions.STANDARD_SUPPORT_END, version


def test_support_type_is_standard_unless_asked(recording: Recording):
    """pulumi-eks defaults upgradePolicy to EXTENDED (about 6x the control plane)."""
    assert recording.one("eks:index:Cluster").inputs["upgradePolicy"] == {"supportType": "STANDARD"}
    extended = run_program(variant_config("p5", cluster={"supportType": "EXTENDED"}), "p5-extended")
    assert extended.one("eks:index:Cluster").inputs["upgradePolicy"] == {"supportType": "EXTENDED"}
    config = raw_settings("p5")
    config["cluster"]["supportType"] = "LONG"
    assert "cluster.supportType = 'LONG': use one of STANDARD, EXTENDED" in str(settings_error(config))


def test_standard_support_warnings_on_2026_12_01():
    """Checked against the EKS release calendar: 1.33 ended 2026-07-29, 1.34 ends 2026-12-02."""
    today = date(2026, 12, 1)
    assert "left EKS standard support on 2026-07-29" in versions.standard_support_warning("1.33", today)
    assert "leaves EKS standard support on 2026-12-02 (1 days)" in versions.standard_support_warning("1.34", today)
    assert versions.standard_support_warning("1.36", today) is None


def test_preview_warns_on_a_version_past_standard_support(monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    run_program(variant_config("p5", cluster={"kubernetesVersion": "1.33"}), "p5-old")
    assert any("Kubernetes 1.33 left EKS standard support" in w for w in warned), warned


# --------------------------------------------------------------------------- 7. destroy leaves nothing paid


def test_control_plane_log_group_exists_before_the_cluster_with_a_retention(recording: Recording, stack: str):
    [group] = recording.of_type("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == f"/aws/eks/fsdp-eks-{stack}/cluster"
    assert int(group.inputs["retentionInDays"]) == 30
    assert group.name in recording.one("eks:index:Cluster").dependencies
    config = raw_settings("p5")
    config["cluster"]["logRetentionDays"] = 31
    assert "cluster.logRetentionDays = 31: use one of 1, 3, 5" in str(settings_error(config))


def test_container_insights_log_groups_are_ours_with_the_retention(with_cloudwatch: Recording):
    """The CloudWatch add-on's agent and Fluent Bit create missing groups without expiry: ours
    exist first (the add-on waits for them), so destroy deletes them and they expire."""
    groups = {g.inputs["name"]: g for g in with_cloudwatch.of_type("aws:cloudwatch/logGroup:LogGroup")}
    cloudwatch = addon(with_cloudwatch, "amazon-cloudwatch-observability")
    for kind in ("application", "dataplane", "host", "performance"):
        group = groups[f"/aws/containerinsights/fsdp-eks-p5-cw/{kind}"]
        assert int(group.inputs["retentionInDays"]) == 30, kind
        assert group.name in waits_for(with_cloudwatch, cloudwatch.name), kind


def test_the_audit_log_is_opt_in(recording: Recording):
    """audit is the control plane's largest stream (every API request), billed per GB."""
    assert sorted(recording.one("eks:index:Cluster").inputs["enabledClusterLogTypes"]) == ["api", "authenticator"]
    audited = run_program(variant_config("p5", cluster={"auditLog": True}), "p5-audit")
    assert "audit" in audited.one("eks:index:Cluster").inputs["enabledClusterLogTypes"]


def test_prometheus_volume_claim_is_deleted_before_the_ebs_csi_driver(recording: Recording):
    """Destroy runs the graph in reverse: the release, then its claim (and volume), and only then
    the StorageClass and the EBS CSI add-on that deletes the volume."""
    [claim] = [r for r in recording.of_type("kubernetes:core/v1:PersistentVolumeClaim")
               if r.name.startswith("observability-")]
    kps = release(recording, versions.KUBE_PROMETHEUS_STACK)
    ebs = addon(recording, "aws-ebs-csi-driver")
    assert claim.name in waits_for(recording, kps.name)
    assert ebs.name in waits_for(recording, claim.name)
    template = kps.inputs["values"]["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]
    # The StatefulSet adopts the claim by name: <template>-prometheus-<fullname>-prometheus-0.
    assert claim.inputs["metadata"]["name"] == (
        f"{template['metadata']['name']}-prometheus-{kps.inputs['values']['fullnameOverride']}-prometheus-0")
    assert claim.inputs["spec"]["storageClassName"] == template["spec"]["storageClassName"]


def test_readme_lists_what_destroy_can_leave_and_how_to_find_it():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for command in ("aws ec2 describe-network-interfaces", "aws ec2 describe-vpc-endpoints",
                    "aws ec2 describe-volumes", "aws logs describe-log-groups"):
        assert command in section, command
    checklist = readme.split("## First deployment checklist", 1)[1].split("\n## ", 1)[0]
    for what in ("ulimit -l", "describe-instance-type-offerings", "describe-capacity-reservations", "helm"):
        assert what in checklist, what


# --------------------------------------------------------------------------- 11. names


@pytest.mark.parametrize("section, key, value, fix", [
    ("job", "namespace", "Training_Jobs", "a Kubernetes namespace name"),
    ("job", "namespace", "x" * 64, "a Kubernetes namespace name: at most 63"),
    ("storage", "existingClaimName", "Checkpoints", "give the name of a PersistentVolumeClaim"),
    ("cluster", "existingClusterName", "-research", "an EKS cluster name"),
    ("gpuNodes", "availabilityZone", "usw2-az3", "give an AZ name of the stack's region"),
])
def test_every_name_is_checked_against_its_api(section, key, value, fix):
    config = raw_settings("p5")
    config[section][key] = value
    if key == "existingClaimName":
        config["storage"] = {"existingClaimName": value}
        config["cluster"]["existingClusterName"] = "research"
    if key == "existingClusterName":
        config["storage"] = {"existingClaimName": "checkpoints"}
    assert f"fsdp-eks:{section}.{key} = {value!r}: {fix}" in str(settings_error(config))


def test_an_az_of_another_region_is_refused():
    config = raw_settings("p5")
    config["network"]["availabilityZones"] = ["us-west-2a", "us-east-1b"]
    message = str(settings_error(config))
    assert "network.availabilityZones = 'us-east-1b': give an AZ name of the stack's region us-west-2" in message


def test_the_stack_name_must_make_valid_aws_and_kubernetes_names():
    """It prefixes the EKS cluster, the ECR repository (lower case) and a StorageClass (RFC 1123)."""
    message = str(settings_error(raw_settings("p5"), stack="P5"))
    assert "(stack name) = 'P5': 'fsdp-eks-P5'" in message and "pulumi stack rename" in message
    assert parse(raw_settings("p5"), Secrets(hf_token="x", grafana_admin_password="y"), stack="p5-team").name == (
        "fsdp-eks-p5-team")


PREVIEW_PERMISSIONS = {
    "aws:index/getAvailabilityZones:getAvailabilityZones": ("ec2:DescribeAvailabilityZones",),
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": ("ec2:DescribeInstanceTypeOfferings",),
    # By quota code the data source calls GetAWSDefaultServiceQuota, then GetServiceQuota
    # (terraform-provider-aws internal/service/servicequotas/service_quota_data_source.go,
    # dataSourceServiceQuotaRead: findServiceQuotaDefaultByID before findServiceQuotaByID).
    "aws:servicequotas/getServiceQuota:getServiceQuota": ("servicequotas:GetAWSDefaultServiceQuota",
                                                          "servicequotas:GetServiceQuota"),
    "aws:eks/getClusters:getClusters": ("eks:ListClusters",),
    "aws:eks/getAddonVersion:getAddonVersion": ("eks:DescribeAddonVersions",),
    "aws:iam/getSessionContext:getSessionContext": ("iam:GetRole",),
    "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation": ("ec2:DescribeCapacityReservations",),
}
"""The account reads of preview's checks (components/preflight.py) and the IAM actions each needs."""


class InvokeRecordingMocks(AwsLikeMocks):
    def __init__(self, region: str, capacity_blocks: dict):
        super().__init__(region, capacity_blocks=capacity_blocks)
        self.invoked: set[str] = set()

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.invoked.add(args.token)
        return super().call(args)


def test_readme_lists_every_permission_preview_needs():
    """A least-privilege deployer must not meet AccessDenied at preview: every read preview makes
    happens (under mocks) and README's prerequisites name each IAM action it needs."""
    config = variant_config("p5", gpuNodes={"capacityReservationId": "cr-0abc1234def567890", "capacityBlock": True})
    mocks = InvokeRecordingMocks(config["aws:region"], offline_mocks.example_capacity_blocks(config))
    run_program(config, "p5-permissions", mocks=mocks)
    assert set(PREVIEW_PERMISSIONS) <= mocks.invoked
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    prerequisites = readme.split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    for token, actions in PREVIEW_PERMISSIONS.items():
        for action in actions:
            assert f"`{action}`" in prerequisites, f"{token} needs {action}"


BLOCK_ID = "cr-0abc1234def567890"


@pytest.mark.parametrize("change, expected", [
    ({"state": "scheduled"}, "the capacity block is scheduled (it runs from 2026-01-01T00:00:00Z"),
    ({"state": "expired"}, "the capacity block is expired"),
    ({"availabilityZone": "us-west-2d"}, f"the capacity block {BLOCK_ID} is in us-west-2d"),
    ({"instanceType": "p4de.24xlarge"}, "the capacity block holds p4de.24xlarge, the profile needs p5.48xlarge"),
    ({"instanceCount": 1}, f"the capacity block {BLOCK_ID} holds 1 instances"),
])
def test_preview_refuses_a_capacity_block_the_nodes_cannot_launch_into(change, expected):
    """Checked at preview with ``aws.ec2.get_capacity_block_reservation`` (state, dates, AZ, type,
    count), not 20 minutes into `up` when the node group fails after EKS, NAT and FSx bill."""
    config = variant_config("p5", gpuNodes={"capacityReservationId": BLOCK_ID, "capacityBlock": True,
                                            "desiredSize": 2, "maxSize": 2})
    block = offline_mocks.example_capacity_blocks(config)[BLOCK_ID] | change
    message, created = refused(config, "p5-block", capacity_blocks={BLOCK_ID: block})
    assert expected in message and created == []


def test_preview_names_a_capacity_block_the_account_does_not_have():
    """A mistyped id, or one of another region: the read fails (InvalidCapacityReservationId.NotFound)
    and preview names the key, instead of ending in the invoke's traceback."""
    config = variant_config("p5", gpuNodes={"capacityReservationId": BLOCK_ID, "capacityBlock": True})
    message, created = refused(config, "p5-no-block", capacity_blocks={})
    assert f"fsdp-eks:gpuNodes.capacityReservationId = '{BLOCK_ID}': cannot read the capacity block" in message
    assert "InvalidCapacityReservationId.NotFound" in message and created == []
