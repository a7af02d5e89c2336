"""Hardened by default, on every stack run whole under mocks: etcd and its
NetworkPolicy, the training workers' security contexts, cluster access and the settings that
govern them.

Checked against: the checks checkov's kubernetes framework applies (the CKV_K8S ids named below),
Kubernetes' NetworkPolicy semantics (a policy selecting a pod admits only what a rule matches),
Kubernetes 1.33's OpenAPI schemas (kubernetes-validate, strict), training/Dockerfile's user, and
EKS' access-policy ARNs (EKS user guide, "Associate access policies with access entries").
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import kubernetes_validate
import pulumi
import pytest

from components import node_quarantine, rendezvous
from components import stack as program
from components.settings import SettingsError
from components.settings_parser import settings_warnings
from offline.mocks import AwsLikeMocks
from tests.harness import (
    Recording,
    job_of,
    parse,
    plain,
    raw_settings,
    run_program,
    secure,
    settings_error,
    stack_config,
    variant,
    worker,
)

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DOCKERFILE = Path(__file__).resolve().parents[2] / "training" / "Dockerfile"
ADMIN = "arn:aws:iam::111122223333:role/ml-platform-admins"
VIEWER = "arn:aws:iam::111122223333:role/team/researchers"


def etcd(recording: Recording) -> dict:
    return plain(recording.one(DEPLOYMENT, "training-job-etcd-deployment").inputs)


def etcd_policy(recording: Recording) -> dict:
    return plain(recording.one(NETWORK_POLICY, "training-job-etcd-network-policy").inputs)


def selects(selector: dict, labels: dict) -> bool:
    """A ``matchLabels`` selector against a pod's labels (no matchExpressions used here)."""
    assert set(selector) <= {"matchLabels"}, f"selector form not handled by this test: {selector}"
    return selector.get("matchLabels", {}).items() <= labels.items()


def admitted(policy: dict, pod_labels: dict, port: int) -> bool:
    """Whether ``policy`` admits a same-namespace pod with ``pod_labels`` to TCP ``port``."""
    for rule in policy["spec"].get("ingress", []):
        peers_ok = not rule.get("from") or any(
            set(peer) == {"podSelector"} and selects(peer["podSelector"], pod_labels) for peer in rule["from"]
        )
        ports_ok = not rule.get("ports") or any(
            p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in rule["ports"]
        )
        if peers_ok and ports_ok:
            return True
    return False


# --------------------------------------------------------------------------- etcd


def test_etcd_runs_non_root_read_only_without_capabilities_or_token(recording: Recording):
    """CKV_K8S_23/40 (non-root, high uid), 22 (read-only root), 37/28 (capabilities), 20
    (escalation), 31 (seccomp), 38 (token), 11/12/13 (limits): each one checkov reports when the field is left out."""
    spec = etcd(recording)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    pod, ctx = spec["securityContext"], c["securityContext"]
    uid = ctx.get("runAsUser", pod.get("runAsUser"))
    assert (ctx.get("runAsNonRoot") or pod.get("runAsNonRoot")) is True and uid >= 10000, "root or low uid"
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False and not ctx.get("privileged")
    assert ctx["capabilities"] == {"drop": ["ALL"]}, "capabilities kept"
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False, "service-account token mounted"
    assert c["resources"]["requests"] == c["resources"]["limits"], "requests != limits"
    assert {"cpu", "memory"} <= c["resources"]["limits"].keys()


def test_etcd_data_lives_on_a_writable_volume_the_uid_owns(recording: Recording):
    """A read-only root needs the data directory elsewhere: an emptyDir, group-owned by etcd's uid."""
    spec = etcd(recording)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    data_dir = next(a.split("=", 1)[1] for a in c["command"] if a.startswith("--data-dir="))
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert data_dir in mounts and "emptyDir" in volumes[mounts[data_dir]], f"{data_dir} is on the root filesystem"
    assert spec["securityContext"]["fsGroup"] == c["securityContext"]["runAsUser"]


def test_etcd_skips_only_tls_and_digest_and_says_why(recording: Recording):
    """The skips on the object are exactly the TLS checks (acceptable only together with the
    NetworkPolicy below, which lets only the training pods reach etcd) and the digest pin, each with a reason."""
    annotations = etcd(recording)["metadata"]["annotations"]
    skips = dict(v.split("=", 1) for k, v in annotations.items() if k.startswith("checkov.io/skip"))
    assert set(skips) == {"CKV_K8S_116", "CKV_K8S_117", "CKV_K8S_119", "CKV_K8S_43"}
    assert all(len(reason) > 30 for reason in skips.values()), skips


def test_only_the_jobs_workers_reach_etcd_and_only_on_its_client_port(recording: Recording):
    """The NetworkPolicy selects the etcd pods, admits the PyTorchJob's worker pods (their labels as
    rendered) to 2379, and nothing else: not another pod of the namespace, not another port."""
    policy = etcd_policy(recording)
    pod_labels = etcd(recording)["spec"]["template"]["metadata"]["labels"]
    workers = worker(job_of(recording))["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"], pod_labels), "the policy does not select the etcd pods"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert admitted(policy, workers, rendezvous.CLIENT_PORT), "the workers cannot reach etcd"
    assert not admitted(policy, workers, rendezvous.PEER_PORT)
    assert not admitted(policy, {"app": "anything-else"}, rendezvous.CLIENT_PORT)
    assert not admitted(policy, pod_labels, rendezvous.CLIENT_PORT), "etcd's own labels are not a worker's"
    assert policy["metadata"]["namespace"] == etcd(recording)["metadata"]["namespace"]
    kubernetes_validate.validate(policy | {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"},
                                 "1.33", strict=True)


def test_the_vpc_cni_enforces_network_policies(recording: Recording):
    """Without the network policy agent a NetworkPolicy is stored and ignored."""
    cni = recording.one("eks:index:Cluster").inputs["vpcCniOptions"]
    assert cni["configurationValues"] == {"enableNetworkPolicy": "true"}


# --------------------------------------------------------------------------- the training workers


def test_workers_run_as_the_images_user_without_privilege(recording: Recording):
    """Non-root as training/Dockerfile's user, no escalation, no capability (EFA needs the device
    plugin's devices and the node's memlock limit, not IPC_LOCK), seccomp; the only token is the
    quarantine account's, which may add one taint to its own node (tests/infra/test_node_quarantine.py)."""
    template = worker(job_of(recording))["template"]["spec"]
    image_uid = int(re.search(r"^ARG APP_UID=(\d+)$", DOCKERFILE.read_text(), re.MULTILINE)[1])
    pod = template["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == image_uid == pod["runAsGroup"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert template["serviceAccountName"] == node_quarantine.SERVICE_ACCOUNT
    for c in template["containers"]:
        ctx = c["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and not ctx.get("privileged"), c["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, f"{c['name']}: {ctx['capabilities']}"
        assert "runAsUser" not in ctx or ctx["runAsUser"] == image_uid


def test_the_init_container_is_root_with_chown_and_dac_override_only(recording: Recording):
    template = worker(job_of(recording))["template"]["spec"]
    (init,) = template["initContainers"]
    ctx = init["securityContext"]
    assert ctx["runAsUser"] == 0, "it hands root-owned directories over"
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert set(ctx["capabilities"]["add"]) <= {"CHOWN", "DAC_OVERRIDE"}
    assert ctx["allowPrivilegeEscalation"] is False and not ctx.get("privileged")
    assert ctx["readOnlyRootFilesystem"] is True, "it writes only to its volumes"
    assert re.search(r"\bchown 1000:1000\b", init["command"][-1])


# --------------------------------------------------------------------------- cluster access


@pytest.fixture(scope="module")
def access_recording() -> Recording:
    return variant("p5", cluster={"adminRoleArns": [ADMIN], "viewerRoleArns": [VIEWER], "endpointPublicAccess": False})


def test_admin_and_viewer_roles_get_access_entries_with_their_policies(access_recording: Recording):
    entries = {r.name: r.inputs for r in access_recording.of_type("aws:eks/accessEntry:AccessEntry")}
    associations = access_recording.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert {e["principalArn"] for e in entries.values()} == {ADMIN, VIEWER}
    granted = {a.inputs["principalArn"]: a.inputs for a in associations}
    assert granted[ADMIN]["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    assert granted[VIEWER]["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
    for a in associations:
        assert a.inputs["accessScope"] == {"type": "cluster"}
        assert a.inputs["clusterName"] == access_recording.one("eks:index:Cluster").inputs["name"]
        assert any(d in entries for d in a.dependencies), f"{a.name} is created before its access entry"


def test_no_access_entries_unless_asked(recording: Recording):
    assert recording.of_type("aws:eks/accessEntry:AccessEntry") == []


def test_private_endpoint_only(access_recording: Recording, recording: Recording):
    private = access_recording.one("eks:index:Cluster").inputs
    assert private["endpointPublicAccess"] is False and private["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in private
    public = recording.one("eks:index:Cluster").inputs
    assert public["endpointPublicAccess"] is True and public["publicAccessCidrs"]


def test_preview_warns_about_an_api_endpoint_open_to_the_internet(stack: str, caplog):
    """The committed stacks leave 0.0.0.0/0: `pulumi preview` (load_settings) says so."""
    caplog.set_level(logging.WARNING)
    run_program(stack_config(stack), f"{stack}-warn")
    assert any("cluster.publicAccessCidrs" in r.getMessage() and "whole internet" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("cluster, warned", [
    ({}, True),
    ({"publicAccessCidrs": ["203.0.113.0/24"]}, False),
    ({"endpointPublicAccess": False}, False),
])
def test_open_endpoint_warning_only_when_open(cluster: dict, warned: bool):
    config = raw_settings("p5")
    config["cluster"] = {**config["cluster"], **cluster}
    keys = [w.key for w in settings_warnings(parse(config))]
    assert ("cluster.publicAccessCidrs" in keys) == warned


@pytest.mark.parametrize("cluster, key, fix", [
    ({"adminRoleArns": ["arn:aws:iam::111122223333:user/alice"]}, "cluster.adminRoleArns", "give IAM role ARNs"),
    ({"viewerRoleArns": ["researchers"]}, "cluster.viewerRoleArns", "give IAM role ARNs"),
    ({"adminRoleArns": [ADMIN], "viewerRoleArns": [ADMIN]}, "cluster.viewerRoleArns", "list a role once"),
    ({"endpointPublicAccess": "no"}, "cluster.endpointPublicAccess", "must be true or false"),
])
def test_bad_access_settings_are_named(cluster: dict, key: str, fix: str):
    config = raw_settings("p5")
    config["cluster"] = {**config["cluster"], **cluster}
    assert any(p.key == key and fix in p.fix for p in settings_error(config).problems)


def test_access_settings_on_an_existing_cluster_are_refused():
    config = raw_settings("p5")
    config["cluster"] = {"existingClusterName": "shared", "adminRoleArns": [ADMIN], "endpointPublicAccess": False,
                         "auditLog": True}
    config["storage"] = {"existingClaimName": "checkpoints"}
    keys = {p.key for p in settings_error(config).problems}
    # Each is read only where the stack creates the cluster: on another it would silently do nothing.
    assert {"cluster.adminRoleArns", "cluster.endpointPublicAccess", "cluster.auditLog"} <= keys


# --------------------------------------------------------------------------- secrets in the stack file
@pytest.mark.parametrize("key, value", [
    ("hfToken", "hf_PlainTextTokenNotEncrypted42"),
    ("grafanaAdminPassword", "plain-text-grafana-password"),
    ("alertSlackWebhook", "https://hooks.slack.com/services/T0000/B0000/plaintextwebhook"),
])
def test_a_secret_set_without_secret_is_refused_before_anything_is_created(key, value):
    """Checked against Pulumi's configuration: ``pulumi config set`` without ``--secret`` writes
    the value in plain text into Pulumi.<stack>.yaml, and the engine lists only the encrypted
    keys as secret (PULUMI_CONFIG_SECRET_KEYS, read by the SDK's ``is_config_secret``);
    ``get_secret`` would still hide it in the state, so nothing else would tell. Preview refuses
    it, naming the command, without repeating the value, before any resource."""
    mocks = AwsLikeMocks("us-west-2")
    with pytest.raises(SettingsError) as refused:
        run_program({**stack_config("p5"), f"fsdp-eks:{key}": value}, "p5-plain", mocks=mocks)
    message = str(refused.value)
    assert f"fsdp-eks:{key} = '(not shown)': stored in plain text in Pulumi.p5-plain.yaml" in message
    assert f"`pulumi config rm {key}` and `pulumi config set --secret {key} <value>`" in message
    assert value not in message
    assert mocks.registrations == []
    run_program({**stack_config("p5"), f"fsdp-eks:{key}": secure(value)}, "p5-secure")  # the case that passes


def test_an_empty_secret_is_a_missing_one():
    """``pulumi config set --secret hfToken ""`` stores an empty token: the gated model's download
    would fail in the pod. Preview asks for the token as if it were not set."""
    with pytest.raises(SettingsError, match="fsdp-eks:hfToken = None: meta-llama/Llama-2-7b-hf is gated"):
        run_program({**stack_config("p5"), "fsdp-eks:hfToken": secure(" ")}, "p5-empty-token")


def test_a_wrong_stack_file_ends_pulumi_preview_without_a_traceback():
    """Checked against pulumi-language-python-exec (pulumi/pulumi, sdk/python/cmd): it logs a
    ``pulumi.RunError`` by its message alone and any other exception as "Program failed with an
    unhandled exception" with the traceback. The program's entry point (``__main__.py``) turns
    the settings' problems into the first."""
    config = {**stack_config("p5"), "fsdp-eks:network": {"vpcCidr": "bad"}}
    with pytest.raises(SettingsError) as problems:
        run_program(config, "p5-bad")  # leaves the runtime configured with config, under mocks
    with pytest.raises(pulumi.RunError) as ended:
        program.main()
    assert str(ended.value) == str(problems.value) and "network.vpcCidr = 'bad'" in str(ended.value)
