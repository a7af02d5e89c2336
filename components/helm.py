"""Pinned Helm v3 releases, the one way fsdp-eks installs a chart.

Helm v3 ``Release`` (not the v4 ``Chart``) so that the release, its chart pin and its values are
one visible resource: tests assert on them under mocks.

Every chart is installed from its vendored folder in ``vendor/charts/`` (``HelmChart.folder``), the copy the tests
render: ``pulumi up`` needs no chart repository and installs byte for byte what
was tested. The path is relative to the project root, where ``pulumi up`` runs, so it is the same on
every machine. The provider reads the version from the folder's ``Chart.yaml`` (pulumi-kubernetes
#2672): a changed chart is rolled out when its version changes, and a test keeps folder, Chart.yaml
and pin equal.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from components.versions import HelmChart

RELEASE_TIMEOUT_S = 900
"""How long an ``atomic`` release may wait for its pods before Helm rolls it back. Helm's default
(300 s) is shorter than a node's start (an EC2 launch, the AMI's boot, nodeadm, image pulls:
several minutes on GPU instances): pods that wait for a joining node would fail the release."""


def helm_release(
    name: str, chart: HelmChart, namespace: str, values: dict, opts: pulumi.ResourceOptions
) -> k8s.helm.v3.Release:
    """A Helm v3 release of a pinned chart; ``opts`` must carry the parent, the provider and
    ``depends_on`` the nodes its pods run on."""
    return k8s.helm.v3.Release(
        name,
        chart=f"./{chart.folder}",
        version=chart.version,
        namespace=namespace,
        create_namespace=True,
        values=values,
        atomic=True,
        cleanup_on_fail=True,
        timeout=RELEASE_TIMEOUT_S,
        opts=opts,
    )
