"""etcd for torchrun's rendezvous: one Deployment and one Service on the system nodes.

torch's ``etcd`` and ``etcd-v2`` rendezvous backends speak the etcd v2 API, which etcd 3.5
serves only with ``--enable-v2`` (3.6 removed it). Rendezvous state is short-lived and keyed by
each run's id, so one member with an in-memory data directory is enough: if it restarts, the
running job re-rendezvouses (torchrun restarts its workers) and a new run starts clean.
Not created when the job uses the ``c10d`` backend (the store then lives in worker 0).

Hardened (measured with checkov's kubernetes framework over the rendered objects):

- the pod runs as a non-root, high uid with a read-only root filesystem (data on a memory-backed
  emptyDir), every capability dropped, no privilege escalation, seccomp ``RuntimeDefault``, no
  service-account token (etcd never calls the Kubernetes API), requests = limits;
- **no TLS**, on purpose: the store holds rendezvous state only (run ids, worker addresses, no
  secret), torch's etcd backends take no client certificate, and a NetworkPolicy admits only the
  pods of the runs and node checks (by label) to the client port, enforced by the VPC CNI's network
  policy agent (``enableNetworkPolicy``, components/cluster.py). The three checkov TLS checks are
  skipped on the Deployment with that reason (``CHECKOV_SKIPS``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components import checkov, versions

NAME = "etcd"
CLIENT_PORT = 2379
PEER_PORT = 2380
LABELS = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/part-of": "fsdp-eks",
          "app.kubernetes.io/component": "rendezvous"}
UID = 65532
"""Non-root and above 10000 (clear of host users); the etcd image needs no user of its own."""
DATA_DIR = "/var/lib/etcd"
RESOURCES = {"cpu": "500m", "memory": "1Gi"}
"""Requests = limits (Guaranteed QoS). The memory includes the in-memory data directory (512Mi)."""
CHECKOV_SKIPS = {
    "CKV_K8S_116": "no TLS: rendezvous state holds no secret and torch's etcd backends take no client "
                   "certificate; a NetworkPolicy admits only the job's workers to the client port",
    "CKV_K8S_117": "no client-certificate auth, for the same reason: the NetworkPolicy is the access control",
    "CKV_K8S_119": "no peer TLS: a single member whose peer URL is loopback",
    "CKV_K8S_43": "pinned by exact release tag in components/versions.py; the digest is not resolvable "
                  "offline where the stack is rendered and tested (pull policy Always re-reads the tag)",
}
"""Checkov checks that do not apply to this Deployment, with why (components/checkov.py)."""


def service_host(namespace: str) -> str:
    """The Service's DNS name, as the workers reach it (``rdzvHost``)."""
    return f"{NAME}.{namespace}.svc"


def etcd_command(namespace: str) -> list[str]:
    """A single-member etcd serving the v2 API on every interface."""
    return [
        "etcd",
        f"--name={NAME}",
        f"--data-dir={DATA_DIR}",
        "--enable-v2=true",
        f"--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}",
        f"--advertise-client-urls=http://{service_host(namespace)}:{CLIENT_PORT}",
        f"--listen-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-cluster={NAME}=http://127.0.0.1:{PEER_PORT}",
        "--initial-cluster-state=new",
    ]


def _etcd_container(namespace: str) -> dict:
    """The etcd container: pinned image, probes on the client port, requests = limits, locked down."""
    probe = {"httpGet": {"path": "/health", "port": CLIENT_PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    return {
        "name": NAME,
        "image": versions.ETCD_IMAGE,
        # With a tag pin (no digest), every start re-reads the tag rather than trusting a node's cache.
        "imagePullPolicy": "Always",
        "command": etcd_command(namespace),
        "ports": [{"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "initialDelaySeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 15, "failureThreshold": 6},
        "resources": {"requests": dict(RESOURCES), "limits": dict(RESOURCES)},
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _etcd_pod_spec(namespace: str, node_selector: Mapping[str, str]) -> dict:
    """The pod: etcd alone, its data directory in memory, on ``node_selector``'s nodes (any when empty)."""
    pod_spec = {
        # etcd never calls the Kubernetes API: no token in the pod.
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,  # the emptyDir data directory is writable by etcd's uid
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_etcd_container(namespace)],
        "volumes": [{"name": "data", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}}],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    return pod_spec


def etcd_deployment(namespace: str, node_selector: Mapping[str, str]) -> dict:
    """The Deployment as a plain Kubernetes object (what tests validate)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(LABELS),
                     "annotations": checkov.skip_annotations(CHECKOV_SKIPS)},
        "spec": {
            "replicas": 1,
            # Never two members with separate state: the old pod goes before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(LABELS)},
            "template": {"metadata": {"labels": dict(LABELS)}, "spec": _etcd_pod_spec(namespace, node_selector)},
        },
    }


def etcd_service(namespace: str) -> dict:
    """The Service as a plain Kubernetes object."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(LABELS)},
        "spec": {
            "selector": dict(LABELS),
            "ports": [{"name": "client", "port": CLIENT_PORT, "targetPort": "client", "protocol": "TCP"}],
        },
    }


def etcd_network_policy(namespace: str, client_labels: Mapping[str, str]) -> dict:
    """The NetworkPolicy: only pods carrying ``client_labels`` (the workers of every run and node
    check, in the job's namespace) reach etcd, and only its client port. Egress is left open: etcd starts no connection
    (its only peer is itself, on loopback, which no policy filters)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(LABELS)},
        "spec": {
            "podSelector": {"matchLabels": dict(LABELS)},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": dict(client_labels)}}],
                "ports": [{"protocol": "TCP", "port": CLIENT_PORT}],
            }],
        },
    }


@dataclass(frozen=True, kw_only=True)
class RendezvousArgs:
    """Inputs of ``Rendezvous``."""

    namespace: str
    provider: k8s.Provider
    client_labels: Mapping[str, str]
    """Labels of the pods that may reach etcd: those every run's and node check's workers carry."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Where etcd runs: the system nodes (empty on a cluster whose nodes we did not label)."""
    depends_on: Sequence[pulumi.Resource] = ()
    """The namespace, typically."""


class Rendezvous(pulumi.ComponentResource):
    """etcd 3.5 with the v2 API, reachable at ``host:port`` from the job's namespace."""

    def __init__(self, name: str, args: RendezvousArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:rendezvous:Rendezvous", name, None, opts)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.depends_on))
        deployment = etcd_deployment(args.namespace, args.node_selector)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=deployment["metadata"], spec=deployment["spec"], opts=in_cluster
        )
        service = etcd_service(args.namespace)
        self.service = k8s.core.v1.Service(
            f"{name}-service", metadata=service["metadata"], spec=service["spec"], opts=in_cluster
        )
        policy = etcd_network_policy(args.namespace, args.client_labels)
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy", metadata=policy["metadata"], spec=policy["spec"], opts=in_cluster
        )
        self.host = service_host(args.namespace)
        self.port = CLIENT_PORT
        self.register_outputs({"host": self.host, "port": self.port, "deployment": self.deployment.metadata["name"]})
