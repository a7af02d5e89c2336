"""Every setting that becomes a Kubernetes or AWS name, checked against that API's rules."""

from __future__ import annotations

import re

from components import versions
from components.settings import MONITORING_NAMESPACE, Problem, Settings


DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A Kubernetes namespace name (RFC 1123 label: at most 63 lower-case letters, digits and '-')."""
DNS_1123_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes object name such as a PersistentVolumeClaim's or a StorageClass's (RFC 1123
subdomain: at most 253 characters, lower-case labels joined by '.')."""
EKS_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9_-]{0,99}")
"""An EKS cluster name (CreateCluster ``name``: 1-100 characters, ``^[0-9A-Za-z][A-Za-z0-9_-]*$``)."""
STACK_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]{0,98}[a-z0-9])?")
"""``<project>-<stack>``, the prefix of every physical name: it must be a valid EKS cluster name, the
first path part of an ECR repository name (lower case: ``[a-z0-9]+(?:[._-][a-z0-9]+)*``) and the
start of a Kubernetes StorageClass name (RFC 1123): lower-case letters, digits and '-' only."""
AVAILABILITY_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
"""An AZ name such as ``us-west-2c`` (a zone id such as ``usw2-az3`` is not a name)."""
KUBERNETES_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
"""The namespaces Kubernetes creates itself (Kubernetes docs, "Namespaces": initial namespaces)."""


def region_rules(s: Settings) -> list[Problem]:
    """The stack's region (``aws:region``): set, and one whose EKS add-on image registry is known."""
    if s.region in versions.EKS_IMAGE_REGISTRY_ACCOUNTS:
        return []
    if not s.region:
        return [Problem("(aws:region)", s.region, "set the stack's AWS region: pulumi config set aws:region us-west-2 "
                                                  "(the region of your GPU capacity)")]
    return [Problem("(aws:region)", s.region,
                    "not a region whose EKS add-on image registry is known (the EFA device plugin's image comes from "
                    f"it): use one of {', '.join(sorted(versions.EKS_IMAGE_REGISTRY_ACCOUNTS))}, or add the "
                    "region's account to EKS_IMAGE_REGISTRY_ACCOUNTS in components/versions.py")]


def name_rules(s: Settings) -> list[Problem]:
    """Every setting that becomes a Kubernetes or AWS name, checked against that API's rules."""
    problems = []
    if not STACK_PREFIX.fullmatch(s.name):
        problems.append(Problem("(stack name)", s.stack,
                                f"'{s.name}' (project-stack) names the EKS cluster, the ECR repository and a "
                                "Kubernetes StorageClass: use lower-case letters, digits and '-' only, at most "
                                f"{100 - len(s.project) - 1} characters (pulumi stack rename <new name>)"))
    if not DNS_1123_LABEL.fullmatch(s.job.namespace):
        problems.append(Problem("job.namespace", s.job.namespace,
                                "a Kubernetes namespace name: at most 63 lower-case letters, digits and '-', "
                                "starting and ending with a letter or digit"))
    taken = {*KUBERNETES_NAMESPACES, *([MONITORING_NAMESPACE] if s.observability.enabled else [])}
    if s.job.namespace in taken:
        problems.append(Problem("job.namespace", s.job.namespace,
                                "a namespace the stack creates for the job and deletes with it: not one that Kubernetes "
                                f"or the monitoring stack owns ({', '.join(sorted(taken))}); e.g. training"))
    claim = s.storage.existing_claim_name
    if claim is not None and not DNS_1123_SUBDOMAIN.fullmatch(claim):
        problems.append(Problem("storage.existingClaimName", claim,
                                "give the name of a PersistentVolumeClaim (lower-case letters, digits, '-' and '.', "
                                "at most 253 characters)"))
    existing = s.cluster.existing_cluster_name
    if existing is not None and not EKS_CLUSTER_NAME.fullmatch(existing):
        problems.append(Problem("cluster.existingClusterName", existing,
                                "an EKS cluster name: 1-100 letters, digits, '-' and '_', starting with a letter "
                                "or digit"))
    if s.creates_cluster:
        new_vpc = s.network.existing_vpc_id is None
        zones = [("network.availabilityZones", az) for az in s.network.availability_zones if new_vpc]
        if new_vpc or s.gpu_nodes.availability_zone:
            zones.append(("gpuNodes.availabilityZone", s.gpu_nodes.availability_zone))
        known_region = s.region in versions.EKS_IMAGE_REGISTRY_ACCOUNTS  # else region_rules names it
        for key, az in zones:
            if not AVAILABILITY_ZONE.fullmatch(az) or (known_region and not az.startswith(s.region)):
                problems.append(Problem(key, az, f"give an AZ name of the stack's region {s.region or '(aws:region)'}, "
                                        f"such as {s.region or 'us-west-2'}a"))
    return problems
