"""A node whose own hardware failed the node check takes itself out of the job: the failing pod
taints ITS node ``fsdp-eks/quarantine=node-check-failed:NoExecute`` through the Kubernetes API.

The taint evicts the job's workers from the node (they do not tolerate it), the Cluster
Autoscaler removes the emptied node and adds a replacement, and the alert
``GpuNodeQuarantined`` names it (docs/design.md, "A failing node quarantines itself").

Only rows that name this node's own hardware quarantine it (the GPUs present, each GPU's
health, Xid events, the EFA devices): a failure that a new node would not fix (``ulimit -l``,
``/dev/shm``, the checkpoint directory, libfabric in the image) or that cannot name a node (the
fabric's bandwidth, the transport) leaves the node as it is.

The request is plain HTTPS with the pod's own service-account token (no client library in the
image): GET the node, then a JSON patch that adds the taint only if the node is still the
version read (``test`` of ``metadata.resourceVersion``), retried on a conflict. The API server
admits it only for the pod's own node and only as that one added taint (the
ValidatingAdmissionPolicy in ``components/node_quarantine.py``). Outside a Kubernetes pod (no
token, no ``NODE_NAME``) it does nothing and says so; a failed request is logged with the
command that does it by hand, and never replaces the check's own failure.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

TAINT_KEY = "fsdp-eks/quarantine"
"""The key the autoscaler's ``--status-taint`` and the alert act on
(``components.cluster_autoscaler.QUARANTINE_TAINT_KEY``; a test holds the two equal, since
training/ imports nothing from components/)."""
TAINT_EFFECT = "NoExecute"
REASON = "node-check-failed"
"""The taint's value, which the alert shows (a label value: letters, digits, ``-``)."""
HARDWARE_CHECKS = re.compile(r"gpus|gpu \d+ health|xid|efa devices")
"""The node check's rows (``Result.check``) that are this node's own hardware."""
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts the pod's token and the cluster's CA (``automountServiceAccountToken``)."""
REQUEST_TIMEOUT_S = 10.0
ATTEMPTS = 3
"""A JSON patch whose ``test`` fails (the node changed between GET and PATCH: the kubelet's
labels, another taint) is retried from a fresh GET."""


class QuarantineError(Exception):
    """The API server refused the request (``status``: its HTTP status)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def faulty_hardware(results: Iterable) -> list:
    """The failed rows of this node's own hardware (``node_check.Result``)."""
    return [r for r in results if r.ok is False and HARDWARE_CHECKS.fullmatch(r.check)]


def quarantine_own_node(results: Iterable, account: Path | None = None) -> bool:
    """Taint this node when one of its hardware rows failed; True when the node carries the
    taint afterwards. ``account``: the service-account directory (None: the kubelet's,
    `SERVICE_ACCOUNT_DIR`). Never raises: the caller's failure is the one that counts."""
    faults = faulty_hardware(results)
    if not faults:
        return False
    why = "; ".join(f"{r.check}: {r.figure}" for r in faults)
    node = os.environ.get("NODE_NAME")
    account = account or SERVICE_ACCOUNT_DIR
    token = account / "token"
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not (node and host and port and token.is_file()):
        log.warning("node hardware failed (%s) but this is not a Kubernetes pod with a service-account "
                    "token and NODE_NAME: the node is not quarantined", why)
        return False
    by_hand = f"kubectl taint node {node} {TAINT_KEY}={REASON}:{TAINT_EFFECT}"
    try:
        api = f"https://{_host(host)}:{port}"
        context = ssl.create_default_context(cafile=str(account / "ca.crt"))
        taint_node(api, token.read_text().strip(), context, node)
    except Exception as e:  # noqa: BLE001  whatever fails here, the check's own failure is the one raised
        log.error("could not quarantine node %s (%s): %s; by hand: %s", node, why, e, by_hand)
        return False
    log.warning("quarantined node %s (%s=%s:%s): %s", node, TAINT_KEY, REASON, TAINT_EFFECT, why)
    return True


def taint_node(api: str, token: str, context: ssl.SSLContext, node: str) -> None:
    """Add the quarantine taint to ``node`` unless it has one."""
    url = f"{api}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    for attempt in range(1, ATTEMPTS + 1):
        current = _call("GET", url, token, context)
        taints = current.get("spec", {}).get("taints") or []
        if any(t.get("key") == TAINT_KEY for t in taints):
            return
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]},
            # "add" of an existing member replaces it (RFC 6902 4.1): a node without taints has no
            # /spec/taints to append to, so the whole list is written.
            {"op": "add", "path": "/spec/taints",
             "value": [*taints, {"key": TAINT_KEY, "value": REASON, "effect": TAINT_EFFECT}]},
        ]
        try:
            _call("PATCH", url, token, context, patch)
            return
        except QuarantineError as e:
            # A failed "test" is 422 (the API server answers a JSON patch that does not apply with
            # Unprocessable Entity: apiserver endpoints/handlers/patch.go, applyJSPatch).
            if e.status not in (409, 422) or attempt == ATTEMPTS:
                raise


def _call(method: str, url: str, token: str, context: ssl.SSLContext, patch: list | None = None) -> dict:
    data = None if patch is None else json.dumps(patch).encode()
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if patch is not None:
        headers["Content-Type"] = "application/json-patch+json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S, context=context) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        message = e.read().decode(errors="replace")
        try:
            message = json.loads(message).get("message", message)
        except ValueError:
            pass
        raise QuarantineError(f"{method} {url}: {e.code} {message}", e.code) from None


def _host(host: str) -> str:
    """An IPv6 service address goes in brackets in a URL."""
    return f"[{host}]" if ":" in host else host
