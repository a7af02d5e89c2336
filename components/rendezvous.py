"""etcd for torchrun's rendezvous: one Deployment and one Service on the system nodes.

torch's ``etcd`` and ``etcd-v2`` rendezvous backends speak the etcd v2 API, which etcd 3.5
serves only with ``--enable-v2`` (3.6 removed it). Rendezvous state is short-lived and keyed by
each run's id, so one member with an in-memory data directory is enough: if it restarts, the
running job re-rendezvouses (torchrun restarts its workers) and a new run starts clean.
Not created when the job uses the ``c10d`` backend (the store then lives in worker 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components import versions

NAME = "etcd"
CLIENT_PORT = 2379
PEER_PORT = 2380
LABELS = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/part-of": "fsdp-eks",
          "app.kubernetes.io/component": "rendezvous"}


def service_host(namespace: str) -> str:
    """The Service's DNS name, as the workers reach it (``rdzvHost``)."""
    return f"{NAME}.{namespace}.svc"


def etcd_command(namespace: str) -> list[str]:
    """A single-member etcd serving the v2 API on every interface."""
    return [
        "etcd",
        f"--name={NAME}",
        "--data-dir=/var/lib/etcd",
        "--enable-v2=true",
        f"--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}",
        f"--advertise-client-urls=http://{service_host(namespace)}:{CLIENT_PORT}",
        f"--listen-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-cluster={NAME}=http://127.0.0.1:{PEER_PORT}",
        "--initial-cluster-state=new",
    ]


def etcd_deployment(namespace: str, node_selector: Mapping[str, str]) -> dict:
    """The Deployment as a plain Kubernetes object (what tests validate)."""
    probe = {"httpGet": {"path": "/health", "port": CLIENT_PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": NAME,
        "image": versions.ETCD_IMAGE,
        "command": etcd_command(namespace),
        "ports": [{"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "initialDelaySeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 15, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }
    pod_spec = {
        "containers": [container],
        "volumes": [{"name": "data", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}}],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(LABELS)},
        "spec": {
            "replicas": 1,
            # Never two members with separate state: the old pod goes before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(LABELS)},
            "template": {"metadata": {"labels": dict(LABELS)}, "spec": pod_spec},
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


@dataclass(frozen=True, kw_only=True)
class RendezvousArgs:
    """Inputs of ``Rendezvous``."""

    namespace: str
    provider: k8s.Provider
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
        self.host = service_host(args.namespace)
        self.port = CLIENT_PORT
        self.register_outputs({"host": self.host, "port": self.port, "deployment": self.deployment.metadata["name"]})
