"""What lets a training pod whose node fails the node check quarantine that node, and nothing
more: the pods' service account, a ClusterRole with ``get`` and ``patch`` on ``nodes``, and a
ValidatingAdmissionPolicy that admits that account's node writes only for the pod's own node
and only as the one added quarantine taint (training/quarantine.py makes the request).

Why an admission policy and not RBAC alone (docs/design.md, "A failing node quarantines
itself"): RBAC names resources by fixed names, and a pod's node is known only when it is
scheduled, so the role alone would let any training pod patch any node, labels and taints
included. The policy closes that: the pod's bound token carries its node's name
(``authentication.kubernetes.io/node-name`` in the user's extra, ServiceAccountTokenPodNodeInfo,
beta and on by default from Kubernetes 1.30), a PATCH of a node reaches admission as an UPDATE
with ``object`` (the patched node) and ``oldObject`` (the stored one), and a write of the main
resource cannot change the node's status (``nodeStrategy.PrepareForUpdate`` keeps the old
status). The policy API is GA since 1.30; every Kubernetes version ``versions.EKS_ADDONS``
supports is newer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.cluster_autoscaler import QUARANTINE_TAINT_KEY

SERVICE_ACCOUNT = "training"
"""The training and node-check pods' service account (``pod_api_access``)."""
NAME = "fsdp-eks-node-quarantine"
"""The cluster-wide objects' name (role, binding, policy, policy binding)."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The user-info extra key the API server fills from a pod-bound token's node claim."""
QUARANTINE_EFFECT = "NoExecute"
NODE_FIELDS_KEPT = ("metadata.labels", "metadata.annotations", "metadata.ownerReferences",
                    "metadata.finalizers", "spec.unschedulable", "spec.podCIDR", "spec.podCIDRs",
                    "spec.providerID", "spec.configSource", "spec.externalID")
"""Every writable field of a Node besides ``spec.taints`` (core/v1 NodeSpec and the metadata a
client may set); the status is kept by the API server itself."""


def pod_api_access() -> dict:
    """The pod spec's keys that give its containers the service account's token (projected,
    bound to the pod and its node, rotated by the kubelet) and the cluster's CA."""
    return {"serviceAccountName": SERVICE_ACCOUNT, "automountServiceAccountToken": True}


def quarantine_toleration(seconds: int) -> dict:
    """The toleration that keeps a pod on its node for ``seconds`` after the quarantine taint
    lands, terminated or running. Without it the taint manager deletes the pod at once (also a
    pod that already ended: it acts on every pod bound to the node), and its log with it; with
    it, ``seconds`` after the taint manager saw the taint (``processPodOnNode``: the smallest
    ``tolerationSeconds`` of the tolerations in use, from the time it processes the node or
    the pod; kubernetes ``pkg/controller/tainteviction/taint_eviction.go``). Only the node
    check's one-off pods carry it: the training workers must leave at once."""
    return {"key": QUARANTINE_TAINT_KEY, "operator": "Exists", "effect": QUARANTINE_EFFECT,
            "tolerationSeconds": seconds}


def service_account_manifest(namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace}}


def cluster_role_manifest() -> dict:
    """Read a node and patch it: no list, no watch, no update (PUT), no delete, no subresource
    (``nodes/status`` is a resource of its own to RBAC)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": NAME},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}


def cluster_role_binding_manifest(namespace: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]}


def _unchanged(path: str) -> str:
    new, old = f"object.{path}", f"oldObject.{path}"
    return f"(has({new}) == has({old}) && (!has({new}) || {new} == {old}))"


def admission_policy_manifest(namespace: str) -> dict:
    """Applies to the training service account's writes of nodes (CREATE, UPDATE, which a PATCH
    is, and DELETE, which RBAC already refuses); denies each that is not its own existing node,
    or that changes anything but adding the quarantine taint."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME},
        "spec": {
            # An error in an expression denies: the policy is the only thing narrowing the role.
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"],
                "operations": ["CREATE", "UPDATE", "DELETE"]}]},
            "matchConditions": [{
                "name": "training-service-account",
                "expression": f"request.userInfo.username == 'system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}'",
            }],
            "variables": [
                # A token not bound to a pod on a node has no such extra: no node is its own.
                {"name": "ownNode",
                 "expression": f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra"
                               f" ? request.userInfo.extra['{NODE_NAME_EXTRA}'][0] : ''"},
                {"name": "oldTaints",
                 "expression": "oldObject != null && has(oldObject.spec.taints) ? oldObject.spec.taints : []"},
                {"name": "newTaints",
                 "expression": "object != null && has(object.spec.taints) ? object.spec.taints : []"},
            ],
            "validations": _validations(),
        },
    }


def _validations() -> list[dict]:
    """The policy's rules, each denying with its own message: only the node the pod runs on, only
    its taints, only the quarantine taint, and that taint only added (with its effect), never
    changed or removed."""
    key = QUARANTINE_TAINT_KEY
    return [
        {"expression": "oldObject != null && object != null && variables.ownNode != ''"
                       " && object.metadata.name == variables.ownNode",
         "reason": "Forbidden",
         "messageExpression": "'the training pods may change only the node they run on (' + "
                              "variables.ownNode + '), never create or delete one'"},
        {"expression": "oldObject == null || object == null || (" + " && ".join(
            _unchanged(path) for path in NODE_FIELDS_KEPT) + ")",
         "reason": "Forbidden",
         "message": f"the training pods may change only a node's taints, by adding {key}"},
        {"expression": f"variables.newTaints.filter(t, t.key != '{key}')"
                       f" == variables.oldTaints.filter(t, t.key != '{key}')",
         "reason": "Forbidden",
         "message": f"the training pods may not add, change or remove a taint other than {key}"},
        {"expression": f"variables.oldTaints.exists(t, t.key == '{key}')"
                       f" ? variables.newTaints.filter(t, t.key == '{key}')"
                       f" == variables.oldTaints.filter(t, t.key == '{key}')"
                       f" : variables.newTaints.filter(t, t.key == '{key}')"
                       f".all(t, t.effect == '{QUARANTINE_EFFECT}')",
         "reason": "Forbidden",
         "message": f"the training pods may only add {key} with effect {QUARANTINE_EFFECT}, "
                    "never change or remove it"},
    ]


def admission_policy_binding_manifest() -> dict:
    """The policy in force (Deny) for every namespace: nodes have none."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": NAME},
            "spec": {"policyName": NAME, "validationActions": ["Deny"]}}


@dataclass(frozen=True, kw_only=True)
class NodeQuarantineArgs:
    """Inputs of ``NodeQuarantine``."""

    namespace: str
    """The training namespace (its service account)."""
    provider: k8s.Provider
    depends_on: Sequence[pulumi.Resource] = ()
    """The namespace (which waits for the system nodes and CoreDNS): every object waits for it."""


class NodeQuarantine(pulumi.ComponentResource):
    """The service account, its role on nodes, and the admission policy that narrows the role
    to its own node's quarantine taint. The policy and its binding come before the role is
    bound, so the role is never in force unnarrowed."""

    def __init__(self, name: str, args: NodeQuarantineArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:job:NodeQuarantine", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.depends_on))
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account", metadata=service_account_manifest(args.namespace)["metadata"], opts=child)
        policy = admission_policy_manifest(args.namespace)
        self.policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-policy", metadata=policy["metadata"], spec=policy["spec"], opts=child)
        binding = admission_policy_binding_manifest()
        self.policy_binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-policy-binding", metadata=binding["metadata"], spec=binding["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.policy])))
        role = cluster_role_manifest()
        self.role = k8s.rbac.v1.ClusterRole(f"{name}-role", metadata=role["metadata"], rules=role["rules"],
                                            opts=child)
        role_binding = cluster_role_binding_manifest(args.namespace)
        self.role_binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-role-binding", metadata=role_binding["metadata"], role_ref=role_binding["roleRef"],
            subjects=role_binding["subjects"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                depends_on=[self.role, self.service_account, self.policy_binding])))
        self.register_outputs({"service_account": SERVICE_ACCOUNT, "role": NAME, "policy": NAME})
