"""The user's days with the autoscaler, step by step: the job ends -> the GPU nodes scale to zero
after the delay -> the next job -> nodes come back; a node fails -> it is quarantined -> the job
restarts without it and the node is replaced; the node check's failing pod sets that taint on
its own node.

No API server, no AWS here: each step is checked on the objects and permissions that drive it,
as the program creates them under mocks and as the real chart renders them (helm from
``.tools/``): the autoscaler's command line, the Auto Scaling group tags it builds a node from
when the group is at zero (read by the tag format of its AWS provider, ``aws_manager.go``), its
IAM policy, the node group's options, the worker pod it must find a node for, and the alert
rules. The job's own side, resuming from the last checkpoint on a replacement node with real
torchrun processes and a real etcd, is tests/training/test_faults.py
(``test_lost_node_resumes_from_last_checkpoint_through_etcd``); a GPU fault mid-run that the
restart's node check finds and quarantines, with real torchrun processes, is
tests/training/test_quarantine.py (``test_a_gpu_fault_mid_run_quarantines_the_node_at_the_restart``).
"""

from __future__ import annotations

import fnmatch
import json
import re

import pytest
from components import node_quarantine, versions
from components.cluster_autoscaler import DISCOVERY_TAG, QUARANTINE_TAINT_KEY, SERVICE_ACCOUNT, TEMPLATE_PREFIX
from components.observability.alert_delivery import load_rule_groups
from components.stack import Export
from components.training_job import NODE_CHECK_LOG_HOLD_S
from components.settings_rules.gpu_nodes import MAX_SCALE_DOWN_DELAY_MINUTES
from offline import rendering
from tests.harness import (
    GPU_TAINT,
    Recording,
    Registration,
    job_of,
    plain,
    release,
    tolerates,
    tool_missing,
    variant,
    waits_for,
    worker,
)
from training import quarantine

ASG_TAG = "aws:autoscaling/tag:Tag"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def autoscaler_args(recording: Recording) -> dict[str, str]:
    """The autoscaler container's flags, from the real chart rendered with the run's values."""
    try:
        rendering.find_tool("helm")
    except rendering.ToolMissing as missing:
        tool_missing(str(missing))
    r = release(recording, versions.CLUSTER_AUTOSCALER)
    text = rendering.helm_template(rendering.chart_dir(r.inputs["chart"], r.inputs["version"]), r.name,
                                   r.inputs["namespace"], rendering.release_values(r.inputs),
                                   rendering.kube_version_of(recording))
    [deployment] = [o for o in rendering.load_manifests(text) if o["kind"] == "Deployment"]
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").split("=", 1) for arg in c["command"] if arg.startswith("--") and "=" in arg)


def gpu_group(recording: Recording) -> Registration:
    """The GPU node group (the stack's one node group named ``*-gpu``)."""
    [group] = [r for r in recording.of_type(NODE_GROUP) if r.name.endswith("-gpu")]
    return group


def gpu_group_tags(recording: Recording) -> dict[str, str]:
    """The tags the program puts on the GPU node group's Auto Scaling group."""
    group = gpu_group(recording)
    asg = f"eks-{group.name}-0000"  # what the mock names it, as EKS does: eks-<node group>-<uuid>
    tags = [r.inputs for r in recording.of_type(ASG_TAG)]
    assert all(t["autoscalingGroupName"] == asg for t in tags), "a tag on another group than the GPU one"
    assert not any(t["tag"]["propagateAtLaunch"] for t in tags), "template tags must stay off the instances"
    return {t["tag"]["key"]: t["tag"]["value"] for t in tags}


def template_node(tags: dict[str, str], instance_type: str) -> dict:
    """The node the autoscaler imagines for a group at zero: the instance type's generic labels,
    then labels, taints and resources from the group's tags, in its AWS provider's formats
    (``extractLabelsFromAsg``, ``extractTaintsFromAsg`` with ``value:Effect``,
    ``extractAllocatableResourcesFromAsg``)."""
    labels, taints, resources = {INSTANCE_TYPE_LABEL: instance_type}, [], {}
    for key, value in tags.items():
        kind, _, name = key.removeprefix(f"{TEMPLATE_PREFIX}/").partition("/")
        if not key.startswith(TEMPLATE_PREFIX):
            continue
        if kind == "label":
            labels[name] = value
        elif kind == "taint":
            taint_value, effect = re.fullmatch(r"(.*):(NoSchedule|NoExecute|PreferNoSchedule)", value).groups()
            taints.append({"key": name, "value": taint_value, "effect": effect})
        elif kind == "resources":
            resources[name] = int(value)
    return {"labels": labels, "taints": taints, "resources": resources}


def why_not_on(pod: dict, node: dict) -> str:
    """Why the scheduler would not place ``pod`` on ``node`` (empty: it would): node selector,
    required node affinity (``In``), taints, and extended resources the node has too few of."""
    spec = pod["spec"]
    for key, value in spec.get("nodeSelector", {}).items():
        if node["labels"].get(key) != value:
            return f"nodeSelector {key}={value}"
    terms = spec.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    if terms and not any(all(node["labels"].get(e["key"]) in e["values"] for e in t["matchExpressions"])
                         for t in terms):
        return "required node affinity"
    for taint in node["taints"]:
        if taint["effect"] != "PreferNoSchedule" and not tolerates(spec.get("tolerations", []), taint):
            return f"taint {taint['key']}"
    for c in spec["containers"]:
        for name, amount in c.get("resources", {}).get("requests", {}).items():
            if "/" in name and int(amount) > node["resources"].get(name, 0):
                return f"{name}: asks {amount}, the node has {node['resources'].get(name, 0)}"
    return ""


def allows(policy: dict, action: str, tags: dict[str, str]) -> bool:
    """IAM's evaluation of an Allow-only identity policy for ``action`` on a resource with
    ``tags``: a statement allows when an action pattern matches and every ``StringEquals`` on
    ``<service>:ResourceTag/<key>`` holds."""
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement["Effect"] != "Allow" or not any(fnmatch.fnmatchcase(action, a) for a in actions):
            continue
        conditions = statement.get("Condition", {}).get("StringEquals", {})
        if all(tags.get(key.split("ResourceTag/", 1)[1]) == value for key, value in conditions.items()):
            return True
    return False


def autoscaler_policy_of(recording: Recording) -> dict:
    [inline] = [r for r in recording.of_type("aws:iam/rolePolicy:RolePolicy") if "cluster-autoscaler" in r.name]
    return json.loads(inline.inputs["policy"])


STACKS_UNDER_TEST = {
    "p5 with FSx": ("p5", {}),
    "p5 on NVMe": ("p5", {"storage": {"fsx": False}, "job": {"nodes": 1}}),
    "p4de": ("p4de", {}),
}


@pytest.fixture(scope="module", params=sorted(STACKS_UNDER_TEST))
def run(request) -> Recording:
    stack, changes = STACKS_UNDER_TEST[request.param]
    return variant(stack, **changes)


# --------------------------------------------------------------------------- job ends -> zero


def test_step_job_ends_nodes_leave_after_the_delay(run: Recording):
    """The autoscaler removes a GPU node the stack's delay after its last GPU pod, may go to zero,
    and discovers only the GPU group (the system nodes stay as Pulumi sizes them)."""
    delay = 10
    args = autoscaler_args(run)
    assert args["scale-down-unneeded-time"] == f"{delay}m"
    discovery = args["node-group-auto-discovery"].removeprefix("asg:tag=").split(",")
    tags = gpu_group_tags(run)
    assert f"{DISCOVERY_TAG}={tags[DISCOVERY_TAG]}" in discovery, "the autoscaler would find the system group too"
    assert plain(gpu_group(run).inputs["scalingConfig"])["minSize"] == 0


def test_step_scaling_down_is_allowed_on_this_clusters_gpu_group_only(run: Recording):
    """The autoscaler's role may set the size and terminate instances of the group it discovers,
    and of no other group (another cluster's, the system nodes'); reads are unscoped, as the
    service requires."""
    policy = autoscaler_policy_of(run)
    gpu = gpu_group_tags(run)
    other_cluster = {**gpu, DISCOVERY_TAG: "someone-elses-cluster"}
    system_group = {"k8s.io/cluster-autoscaler/enabled": "true"}
    for write in ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"):
        assert allows(policy, write, gpu), write
        assert not allows(policy, write, other_cluster), f"{write} on another cluster's group"
        assert not allows(policy, write, system_group), f"{write} on the system group"
    for read in ("autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstanceTypes",
                 "ec2:DescribeLaunchTemplateVersions", "eks:DescribeNodegroup"):
        assert allows(policy, read, {}), read
    assert not allows(policy, "autoscaling:UpdateAutoScalingGroup", gpu), "more than the two writes"
    [assoc] = [r for r in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
               if r.inputs["serviceAccount"] == SERVICE_ACCOUNT]
    assert assoc.inputs["namespace"] == release(run, versions.CLUSTER_AUTOSCALER).inputs["namespace"]


def test_step_the_idle_alert_waits_past_the_longest_delay():
    """GpuNodesIdle means "the autoscaler is off or stuck": it waits at least 10 minutes past
    the longest delay the settings accept."""
    [idle] = [r for g in load_rule_groups()["groups"] for r in g["rules"] if r.get("alert") == "GpuNodesIdle"]
    assert int(idle["for"].removesuffix("m")) >= MAX_SCALE_DOWN_DELAY_MINUTES + 10


def test_step_pulumi_up_leaves_the_autoscalers_size():
    """A later `pulumi up` does not set the group back to the stack file's desiredSize (the
    autoscaler owns it); without the autoscaler the stack file does."""
    on = gpu_group(variant("p5"))
    off = gpu_group(variant("p5", gpuNodes={"scaleDownDelayMinutes": 0}))
    assert on.ignore_changes == ["scalingConfig.desiredSize"]
    assert off.ignore_changes == []
    assert not variant("p5", gpuNodes={"scaleDownDelayMinutes": 0}).of_type(ASG_TAG)


# --------------------------------------------------------------------------- next job -> nodes back


def test_step_next_job_fits_the_node_the_autoscaler_builds_from_zero(run: Recording):
    """With the group at zero, the autoscaler adds a node only if the pending worker fits the
    node it builds from the group's tags: the GPU taint, the labels the worker selects on (the
    Lustre label with FSx), its GPUs and EFA interfaces."""
    instance_type = gpu_group(run).inputs["instanceTypes"][0]
    node = template_node(gpu_group_tags(run), instance_type)
    assert GPU_TAINT in node["taints"]
    pod = worker(job_of(run))["template"]
    assert not (why := why_not_on(pod, node)), f"the autoscaler would not scale up for the worker: {why}"


def test_the_template_check_sees_a_missing_tag(run: Recording):
    """The step above can fail: without the EFA resource tag (or the taint tag) the worker does
    not fit the imagined node, and the autoscaler would never scale up from zero."""
    instance_type = gpu_group(run).inputs["instanceTypes"][0]
    pod = worker(job_of(run))["template"]
    tags = gpu_group_tags(run)
    no_efa = {k: v for k, v in tags.items() if not k.endswith("resources/vpc.amazonaws.com/efa")}
    assert "vpc.amazonaws.com/efa" in why_not_on(pod, template_node(no_efa, instance_type))
    tainted_unknown = {**tags, f"{TEMPLATE_PREFIX}/taint/other": "x:NoSchedule"}
    assert "taint other" in why_not_on(pod, template_node(tainted_unknown, instance_type))


def test_step_a_gpu_node_waits_for_its_device_plugin_instead_of_a_second_scale_up(run: Recording):
    """A joined node advertises GPUs only once the device plugin runs: the node group's label
    ``k8s.amazonaws.com/accelerator`` tells the autoscaler to wait for it (its AWS provider's
    GPULabel) instead of adding more nodes for the same pods."""
    assert gpu_group(run).inputs["labels"].get("k8s.amazonaws.com/accelerator")


def test_capacity_block_group_starts_at_zero():
    """EKS refuses a desired size above 0 before a capacity block starts: the group is created
    at 0 and the autoscaler adds nodes for the job once the block is active."""
    rec = variant("p5", gpuNodes={"capacityBlock": True, "capacityReservationId": "cr-0123456789abcdef0"})
    assert plain(gpu_group(rec).inputs["scalingConfig"])["desiredSize"] == 0


# --------------------------------------------------------------------------- a node fails -> quarantined


def test_step_the_check_fails_on_a_node_and_its_pod_taints_that_node(run: Recording):
    """The node check's failing pod taints its own node (training/quarantine.py, driven by the
    real check against a fake API server in tests/training/test_quarantine.py) with the taint
    the next step acts on: it runs as the account whose role may patch nodes, with its token and
    its node's name, and the admission policy that narrows that role to its own node is in force
    before the role is bound (tests/infra/test_node_quarantine.py)."""
    assert (quarantine.TAINT_KEY, quarantine.TAINT_EFFECT) == (QUARANTINE_TAINT_KEY, "NoExecute")
    spec = worker(job_of(run))["template"]["spec"]
    assert spec["serviceAccountName"] == node_quarantine.SERVICE_ACCOUNT and spec["automountServiceAccountToken"]
    [container] = spec["containers"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    [binding] = [r for r in run.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
                 if plain(r.inputs)["roleRef"]["name"] == node_quarantine.NAME]
    assert plain(binding.inputs)["subjects"][0]["name"] == node_quarantine.SERVICE_ACCOUNT
    [policy_binding] = run.of_type(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
    assert policy_binding.name in waits_for(run, binding.name)
    # The check command's pods outlive that taint long enough for the command to print the table
    # (tests/infra/test_node_check_job.py runs the command against the taint manager's rule).
    check_spec = worker(run.exports[Export.NODE_CHECK_MANIFEST])["template"]["spec"]
    [held] = [t for t in check_spec["tolerations"] if t.get("key") == QUARANTINE_TAINT_KEY]
    assert (held["effect"], held["tolerationSeconds"]) == ("NoExecute", NODE_CHECK_LOG_HOLD_S)


def test_step_a_quarantined_node_loses_the_job_and_is_replaced(run: Recording):
    """The quarantine taint (the failing pod's, or a person's) evicts the worker (it does not
    tolerate it); the alert names the
    node and the reason; the autoscaler removes the emptied node and, ignoring the taint in the
    node it copies as the group's template, adds a clean one for the job's pending pods."""
    quarantine = {"key": QUARANTINE_TAINT_KEY, "value": "node-check-failed", "effect": "NoExecute"}
    pod = worker(job_of(run))["template"]
    assert not tolerates(pod["spec"].get("tolerations", []), quarantine), "the worker would stay on it"
    assert autoscaler_args(run)["status-taint"] == QUARANTINE_TAINT_KEY
    [alert] = [r for g in load_rule_groups()["groups"] for r in g["rules"] if r.get("alert") == "GpuNodeQuarantined"]
    assert f'key="{QUARANTINE_TAINT_KEY}"' in alert["expr"]
    assert "{{ $labels.node }}" in alert["annotations"]["summary"]
    assert "{{ $labels.value }}" in alert["annotations"]["summary"]


def test_every_supported_kubernetes_version_has_an_autoscaler_of_its_minor():
    """The autoscaler simulates its own version's scheduler: each supported Kubernetes minor runs
    the autoscaler of that minor (kubernetes/autoscaler README, "Releases")."""
    tags = versions.CLUSTER_AUTOSCALER_IMAGE_TAGS
    assert set(tags) == set(versions.SUPPORTED_KUBERNETES_VERSIONS)
    for minor, tag in tags.items():
        assert re.fullmatch(rf"v{re.escape(minor)}\.\d+", tag), f"{minor}: {tag}"
