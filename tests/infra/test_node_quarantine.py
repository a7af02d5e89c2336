"""The permission a training pod needs to quarantine its own node, and no more
(components/node_quarantine.py): the objects as the program creates them under mocks, each
strictly valid for every supported Kubernetes version, the role, the pods that use it, and the
admission policy that narrows it.

There is no API server here, and no CEL evaluator in the environment: the policy's expressions
are checked for what they compare (every writable Node field but the taints, by the Node schema
of each supported version), not run.

Checked against: the Kubernetes API reference (NodeSpec, ValidatingAdmissionPolicy v1), the
service-account docs (the ``authentication.kubernetes.io/node-name`` extra of a pod-bound token),
the API server's patch handler (a PATCH is admitted as an UPDATE: staging/src/k8s.io/apiserver/
pkg/endpoints/handlers/patch.go) and the node strategy (a write of ``nodes`` keeps the old
status: pkg/registry/core/node/strategy.go).
"""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest

from components import node_quarantine as nq
from components import versions
from components.cluster_autoscaler import QUARANTINE_TAINT_KEY
from components.stack import Export
from tests.conftest import recording_of
from tests.harness import Recording, job_of, plain, waits_for, worker
from training import quarantine

VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"


@pytest.fixture(scope="module")
def rec() -> Recording:
    return recording_of("p5")


def namespace_of(rec: Recording) -> str:
    return job_of(rec)["metadata"]["namespace"]


def objects(rec: Recording) -> list[dict]:
    made = []
    for type_ in (SERVICE_ACCOUNT, ROLE, ROLE_BINDING, VAP, VAP_BINDING):
        group_version, kind = type_[len("kubernetes:"):].split(":")
        api_version = group_version.removeprefix("core/")
        made += [{"apiVersion": api_version, "kind": kind, **plain(r.inputs)} for r in rec.of_type(type_)
                 if r.name.endswith(("-node-quarantine-service-account", "-node-quarantine-role",
                                     "-node-quarantine-role-binding", "-node-quarantine-policy",
                                     "-node-quarantine-policy-binding"))]
    return made


@pytest.mark.parametrize("kube_version", versions.SUPPORTED_KUBERNETES_VERSIONS)
def test_the_objects_are_strictly_valid(rec: Recording, kube_version: str):
    made = objects(rec)
    assert sorted(o["kind"] for o in made) == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                                      "ValidatingAdmissionPolicy",
                                                      "ValidatingAdmissionPolicyBinding"])
    for obj in made:
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_the_strict_check_rejects_a_misspelt_policy_field():
    policy = nq.admission_policy_manifest("training")
    policy["spec"]["validations"][0]["messsage"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, versions.SUPPORTED_KUBERNETES_VERSIONS[0], strict=True)


def test_the_role_reads_and_patches_nodes_and_nothing_else(rec: Recording):
    [role] = [o for o in objects(rec) if o["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    [binding] = [o for o in objects(rec) if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": nq.SERVICE_ACCOUNT,
                                    "namespace": namespace_of(rec)}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_role_is_bound_only_after_the_policy_that_narrows_it(rec: Recording):
    [binding] = [r for r in rec.of_type(ROLE_BINDING) if r.name.endswith("-node-quarantine-role-binding")]
    [policy_binding] = [r for r in rec.of_type(VAP_BINDING)]
    [policy] = [r for r in rec.of_type(VAP)]
    assert {policy_binding.name, policy.name} <= waits_for(rec, binding.name)


def test_the_workers_and_the_node_check_run_as_that_account_with_a_token_and_their_node(rec: Recording):
    """The token (and CA) only where the pod must call the API; the node's name from the
    downward API, the one the token is bound to."""
    for manifest in (job_of(rec), plain(rec.exports[Export.NODE_CHECK_MANIFEST])):
        spec = worker(manifest)["template"]["spec"]
        assert spec["serviceAccountName"] == nq.SERVICE_ACCOUNT
        assert spec["automountServiceAccountToken"] is True
        [c] = spec["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_policy_applies_to_that_account_writing_nodes_and_denies(rec: Recording):
    [policy] = [o for o in objects(rec) if o["kind"] == "ValidatingAdmissionPolicy"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"] and {"UPDATE", "CREATE", "DELETE"} <= set(rule["operations"])
    [condition] = spec["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{namespace_of(rec)}:{nq.SERVICE_ACCOUNT}'")
    [binding] = [o for o in objects(rec) if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert all(v.get("reason") == "Forbidden" for v in spec["validations"])


def test_the_policy_names_the_pods_own_node_from_its_token():
    variables = {v["name"]: v["expression"] for v in nq.admission_policy_manifest("training")["spec"]["variables"]}
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in variables["ownNode"]
    [own] = [v for v in nq.admission_policy_manifest("training")["spec"]["validations"]
             if "variables.ownNode" in v["expression"]]
    assert "object.metadata.name == variables.ownNode" in own["expression"]
    assert "oldObject != null" in own["expression"], "an apply patch could create a node"


@pytest.mark.parametrize("kube_version", versions.SUPPORTED_KUBERNETES_VERSIONS)
def test_every_writable_node_field_but_the_taints_must_stay(kube_version: str):
    """The policy compares every NodeSpec field but ``taints`` and the metadata a client writes,
    by the Node schema of each supported version: a new field would be missed otherwise."""
    strict = SCHEMAS / f"v{kube_version}.0-local-strict"
    spec_fields = set(json.loads((strict / "nodespec-v1.json").read_text())["properties"])
    kept = {p.split(".", 1)[1] for p in nq.NODE_FIELDS_KEPT if p.startswith("spec.")}
    assert kept == spec_fields - {"taints"}
    meta_fields = set(json.loads((strict / "objectmeta-meta-v1.json").read_text())["properties"])
    assert {p.split(".", 1)[1] for p in nq.NODE_FIELDS_KEPT if p.startswith("metadata.")} <= meta_fields
    [fields] = [v["expression"] for v in nq.admission_policy_manifest("training")["spec"]["validations"]
                if "has(object.spec.unschedulable)" in v["expression"]]
    for path in nq.NODE_FIELDS_KEPT:
        assert f"object.{path} == oldObject.{path}" in fields


def test_the_policy_and_the_pod_write_the_same_taint():
    """training/ imports nothing from components/: the key, and the effect the policy allows,
    are held equal here."""
    assert quarantine.TAINT_KEY == QUARANTINE_TAINT_KEY
    assert quarantine.TAINT_EFFECT == nq.QUARANTINE_EFFECT
    taint_rules = " ".join(v["expression"] for v in nq.admission_policy_manifest("training")["spec"]["validations"])
    assert f"t.key != '{QUARANTINE_TAINT_KEY}'" in taint_rules
    assert f".all(t, t.effect == '{quarantine.TAINT_EFFECT}')" in taint_rules
